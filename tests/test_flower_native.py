"""SIFL in a Flower app of the user's own: the strategy wrapper and the client mod.

* Message level (no runtime): the wrapper around Flower's FedAvg and the mod around a plain train
  function (a lambda as ``call_next``, as DESIGN.md says mods are tested) equal the same FedAvg
  without them, round by round, for M1, M2 and RM.
* fl_demos/flower_quickstart (Flower's quickstart-pytorch on digits): the app with
  ``enable_sifl.patch`` applied equals the app without it within 1e-9 on the simulation runtime
  and on the deployment runtime (loopback SuperLink + two SuperNodes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tomllib

torch = pytest.importorskip("torch")
pytest.importorskip("flwr")

from doc_blocks import distinct_blocks, fenced_blocks  # noqa: E402
from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from immersion import InvalidArgumentError  # noqa: E402
from immersion_fl import SiflStrategy, sifl_mod  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task_identity")


QUICKSTART = Path(__file__).resolve().parents[1] / "fl_demos" / "flower_quickstart"
RNG = np.random.default_rng(0)
DATA = {
    node: (RNG.normal(size=(n, 3)), RNG.normal(size=n))
    for node, n in ((11, 30), (12, 45), (13, 25))
}


class FakeGrid:
    """What FedAvg's configure_* need from a Grid: the node ids."""

    def get_node_ids(self):
        return sorted(DATA)


def _context(node: int) -> Context:
    return Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})


def local_train(msg: Message, node: int) -> Message:
    """A user's train function: 3 steps of least squares on the node's data, from the received
    arrays."""
    arrays = msg.content["arrays"]
    w, b = arrays["w"].numpy().copy(), arrays["b"].numpy().copy()
    x, y = DATA[node]
    for _ in range(3):
        r = x @ w + b[0] - y
        w, b = w - 0.1 * x.T @ r / len(y), b - 0.1 * np.array([r.mean()])
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(w), "b": Array(b)}),
            "metrics": MetricRecord({"num-examples": len(y)}),
        }
    )
    return Message(content=content, reply_to=msg)


def _replies(messages, contexts, mod):
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        call = lambda m, c, node=node: local_train(m, node)  # noqa: E731
        replies.append(mod(msg, contexts[node], call) if mod else call(msg, contexts[node]))
    return replies


def _run(strategy, rounds: int, mod) -> list[np.ndarray]:
    arrays = ArrayRecord({"w": Array(np.zeros(3)), "b": Array(np.zeros(1))})
    contexts = {node: _context(node) for node in DATA}
    out = []
    for rnd in range(1, rounds + 1):
        messages = strategy.configure_train(rnd, arrays, ConfigRecord({"lr": 0.1}), FakeGrid())
        arrays, _ = strategy.aggregate_train(rnd, _replies(messages, contexts, mod))
        out.append(np.concatenate([arrays["w"].numpy(), arrays["b"].numpy()]))
        for msg in strategy.configure_evaluate(rnd, arrays, ConfigRecord(), FakeGrid()):
            seen = {}

            def evaluate(m, c, seen=seen):
                seen["w"] = m.content["arrays"]["w"].numpy()
                return Message(
                    content=RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=m
                )

            if mod:
                assert "sifl.encoded" in msg.content["arrays"]  # evaluation traffic is encoded too
                mod(msg, contexts[msg.metadata.dst_node_id], evaluate)
                assert np.abs(seen["w"] - arrays["w"].numpy()).max() < 1e-12  # ... and decodes
    return out


@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2", "sifl-rm"])
def test_wrapper_and_mod_equal_plain_fedavg_every_round(scheme):
    plain = _run(FedAvg(min_available_nodes=3, min_train_nodes=3), 4, None)
    strategy = SiflStrategy(
        FedAvg(min_available_nodes=3, min_train_nodes=3), scheme, min_samples=25, rng=1
    )
    private = _run(strategy, 4, sifl_mod)
    assert [
        float(np.abs(a - b).max()) for a, b in zip(plain, private, strict=True)
    ] == pytest.approx([0.0] * 4, abs=1e-12)
    if scheme != "sifl-rm":
        assert strategy.privacy()["epsilon_local"] == pytest.approx(1.0)


def test_every_registered_flower_wrapper_runs_its_own_scheme():
    """Each scheme spec's ``flower.strategy`` wraps with that spec's scheme (not a shared default),
    and its ``flower.mod`` completes the rounds to plain FedAvg."""
    from immersion.backends import make_backend
    from immersion_fl.registry import fl_registry
    from immersion_fl.scheme import SchemeContext

    backend = make_backend("torch", dtype="float64")
    specs = {n: s for n, s in fl_registry().fl_schemes.items() if s.flower.strategy is not None}
    assert {"sifl-m1", "sifl-m2", "sifl-rm"} <= set(specs)
    plain = _run(FedAvg(min_available_nodes=3, min_train_nodes=3), 2, None)
    for name, spec in specs.items():
        strategy = spec.flower.strategy(
            FedAvg(min_available_nodes=3, min_train_nodes=3), min_samples=25, rng=1
        )
        assert strategy.scheme_name == name
        assert spec.flower.mod is not None, name
        private = _run(strategy, 2, spec.flower.mod)
        reference = spec.factory(spec.options(), SchemeContext(backend, np.random.default_rng(0)))
        assert type(strategy.scheme) is type(reference), name
        for a, b in zip(plain, private, strict=True):
            assert np.abs(a - b).max() < 1e-12, name


def test_the_mod_refuses_an_unwrapped_server_and_nodes_without_a_kit():
    msg = Message(
        content=RecordDict(
            {"arrays": ArrayRecord({"w": Array(np.zeros(3))}), "config": ConfigRecord()}
        ),
        dst_node_id=11,
        message_type="train",
    )
    reply = sifl_mod(msg, _context(11), lambda m, c: local_train(m, 11))
    assert reply.has_error() and "SiflStrategy" in reply.error.reason


def test_the_wrapper_refuses_bad_arguments_and_float32_models():
    with pytest.raises(InvalidArgumentError, match="scheme"):
        SiflStrategy(FedAvg(), "mpdp")
    with pytest.raises(InvalidArgumentError, match="strategy"):
        SiflStrategy(object(), "sifl-m1")
    with pytest.raises(InvalidArgumentError) as info:
        SiflStrategy(FedAvg(), "sifl-m1", client_noise=True)
    assert info.value.argument == "client_noise"
    strategy = SiflStrategy(FedAvg(min_available_nodes=3), "sifl-m1", rng=0)
    with pytest.raises(InvalidArgumentError, match="float64"):
        strategy.configure_train(
            1, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), ConfigRecord(), FakeGrid()
        )


# ------------------------------------------------------------------------------- the quickstart app
def _quickstart():
    """benchmarks/flower_quickstart.py: copying, patching and simulating the quickstart app."""
    spec = importlib.util.spec_from_file_location(
        "flower_quickstart", QUICKSTART.parents[1] / "benchmarks" / "flower_quickstart.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


quickstart = _quickstart()
_app_copy, _simulate, _max_diff = quickstart.app_copy, quickstart.simulate, quickstart.max_diff


def test_the_patch_is_at_most_ten_lines():
    lines = (QUICKSTART / "enable_sifl.patch").read_text().splitlines()
    changed = [line for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 10


@pytest.mark.slow
def test_quickstart_with_sifl_equals_without_on_the_simulation_runtime(tmp_path):
    plain = _simulate(_app_copy(tmp_path, "plain", False), tmp_path / "plain.pt")
    patched = _app_copy(tmp_path, "sifl", True)
    for scheme in ("sifl-m1", "sifl-m2", "sifl-rm"):
        private = _simulate(
            patched, tmp_path / f"{scheme}.pt", extra=f'{{"sifl-scheme": "{scheme}"}}'
        )
        assert _max_diff(plain, private) < 1e-9, scheme


@pytest.mark.slow
def test_quickstart_with_sifl_on_the_deployment_runtime_on_loopback(tmp_path):
    """SuperLink + two SuperNodes + ``flwr run`` of the patched app: the final model equals the
    unpatched app's on the simulation runtime within 1e-9 (the ``--insecure`` set-up; the TLS
    one is tests/test_fl.py's)."""
    from flower_deployment import LoopbackDeployment

    plain = _simulate(_app_copy(tmp_path, "plain", False), tmp_path / "plain.pt")
    app = _app_copy(tmp_path, "sifl", True)
    out = tmp_path / "deployed.pt"
    app_path = {"PYTHONPATH": f"{app}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with LoopbackDeployment(tmp_path / "deployment", secure=False, extra_env=app_path) as link:
        for pid in (0, 1):
            link.supernode(f"node-{pid}", pid, 2)
        done = link.run(app, f"num-server-rounds=2 final-model='{out}'", timeout_s=300)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert _max_diff(plain, torch.load(out)) < 1e-9


# ------------------------------------------------------------------- the README's quickstart block
def _readme_quickstart_block() -> str:
    """The bash block that applies ``enable_sifl.patch`` and runs the simulation (shown in the
    README and in the Flower tutorial of the documentation site: the same block)."""
    blocks = [b for b in distinct_blocks("bash") if "enable_sifl" in b]
    assert len(blocks) == 1, "one documented block applies enable_sifl.patch"
    return blocks[0]


def _apply_like_the_readme(app: Path) -> None:
    """The README's apply command (its first line, after ``cd``), run in ``app``."""
    apply = _readme_quickstart_block().splitlines()[0].split("&&", 1)[1].strip()
    assert apply.startswith("patch -p1"), apply
    subprocess.run(apply, shell=True, cwd=app, check=True, capture_output=True)  # noqa: S602


def _app_config(app: Path) -> dict:
    return tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_the_readme_apply_command_changes_every_file_of_the_patch(tmp_path):
    app = tmp_path / "app"
    shutil.copytree(QUICKSTART, app)
    patched = ("digitsexample/client_app.py", "digitsexample/server_app.py", "pyproject.toml")
    before = {name: (app / name).read_text() for name in patched}
    _apply_like_the_readme(app)
    for name in patched:
        assert (app / name).read_text() != before[name], f"{name} unchanged by the patch"
    assert "mods=[sifl_mod]" in (app / patched[0]).read_text()
    assert "SiflStrategy(strategy" in (app / patched[1]).read_text()
    # every +/- line the README and the documentation pages show is a line of the patch
    shown = [block for _, block in fenced_blocks("diff")]
    patch_lines = set((QUICKSTART / "enable_sifl.patch").read_text().splitlines())
    assert any("sifl_mod" in block for block in shown)
    for block in shown:
        if "sifl_mod" in block:
            assert set(block.splitlines()) <= patch_lines


def test_every_run_config_key_the_apps_read_is_declared_in_pyproject(tmp_path):
    """``flwr run --run-config`` refuses keys missing from ``[tool.flwr.app.config]``: every
    default the server and client apps read (patched or not) is declared there, same value."""
    import ast

    plain, patched = tmp_path / "plain", tmp_path / "sifl"
    shutil.copytree(QUICKSTART, plain)
    shutil.copytree(QUICKSTART, patched)
    _apply_like_the_readme(patched)
    for app in (plain, patched):
        declared = _app_config(app)
        server = (app / "digitsexample" / "server_app.py").read_text()
        defaults = ast.literal_eval(re.search(r"DEFAULTS = (\{.*?\})\n", server, re.S).group(1))
        for update in re.findall(r"DEFAULTS\.update\((\{.*?\})\)", server):
            defaults.update(ast.literal_eval(update))
        client = (app / "digitsexample" / "client_app.py").read_text()
        defaults.update(
            ast.literal_eval(re.search(r"return (\{.*?), \*\*dict", client).group(1) + "}")
        )
        read = set(re.findall(r'(?<!node_)config\["([a-z-]+)"\]', server + client)) - {
            "server-round"
        }
        assert read <= set(defaults), read - set(defaults)
        assert {k: declared.get(k) for k in defaults} == defaults, app.name
    assert {"sifl-scheme", "min-samples"} <= set(_app_config(patched))
    assert not {"sifl-scheme", "min-samples"} & set(_app_config(plain))


def _stop_local_superlink(home: Path) -> None:
    """Stop the SuperLink ``flwr run`` started (detached) for the connection, by the log path
    under ``home`` in its command line, with its descendants."""
    from flower_deployment import _descendants

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "flower-superlink" in command and str(home) in command:
            pid = int(entry.name)
            for victim in [*_descendants(pid), pid]:
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.slow
def test_the_readme_quickstart_block_runs_as_written(tmp_path):
    """The README's block, run from a copy of the repository's layout with a HOME of its own:
    the patch applies, ``flwr run`` simulates two SuperNodes with the run-config the README
    shows, the log names the scheme and its epsilons every round, and the defaults reach over
    90 % accuracy on the held-out digits."""
    import immersion
    import immersion_fl
    from flower_deployment import BIN, free_port

    shutil.copytree(QUICKSTART, tmp_path / "fl_demos" / "flower_quickstart")
    home = tmp_path / "home"
    home.mkdir()
    code = [str(Path(m.__file__).resolve().parents[1]) for m in (immersion, immersion_fl)]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLWR_")},
        "HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        # the tested checkout's code in Flower's processes too (not another install's)
        "PYTHONPATH": os.pathsep.join([*code, os.environ.get("PYTHONPATH", "")]),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", _readme_quickstart_block()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        _stop_local_superlink(home)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert (
        "SiflStrategy"
        in (tmp_path / "fl_demos/flower_quickstart/digitsexample/server_app.py").read_text()
    )
    rounds = re.findall(r"SIFL sifl-m2 round (\d+): per-element epsilon_local ([0-9.e+-]+)", log)
    assert [int(r) for r, _ in rounds] == [1, 2, 3], log[-4000:]
    assert all(float(eps) == pytest.approx(1.0) for _, eps in rounds)
    accuracy = [float(a) for a in re.findall(r"'accuracy': ([0-9.]+)", log)]
    assert accuracy and accuracy[-1] > 0.9, accuracy
