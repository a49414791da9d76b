"""The federated plugins' contracts: the Scheme ABC, per-scheme options, versioned configurations,
Optax-style optimizers (a DP-SGD client as a chain), and files written before the reshaping."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from immersion import InvalidArgumentError, PluginError  # noqa: E402
from immersion_fl.config import LegacyConfigWarning, NoOptions, RunConfig  # noqa: E402
from immersion_fl.hookspecs import SchemeSpec  # noqa: E402
from immersion_fl.registry import fl_registry  # noqa: E402
from immersion_fl.runtime.engine import run_federated  # noqa: E402
from immersion_fl.runtime.optimizers import (  # noqa: E402
    AdamState,
    EmptyState,
    TraceState,
    adam,
    chain,
    clip_by_norm,
    dp_aggregate,
    momentum,
    sgd,
)
from immersion_fl.scheme import Scheme  # noqa: E402
from immersion_fl.schemes import SiflOptions  # noqa: E402
from immersion_mpdp.options import MpdpOptions  # noqa: E402
from immersion_secagg.options import DpSgdOptions  # noqa: E402

ROOT = Path(__file__).parents[1]
LEGACY = Path(__file__).parent / "data" / "legacy"
#: The modules of the schemes package (one per scheme, the SIFL kit and options, the integer
#: codings).
SCHEME_MODULES = ("__init__", "fedavg", "sifl_m1", "sifl_m2", "sifl_rm", "kit", "options")
SCHEME_MODULES += ("modular",)
#: The modules that state the scheme contract and its callers' side of it.
CONTRACT = (
    "scheme",
    "config",
    "runtime/engine",
    "runtime/federation",
    "runtime/optimizers",
    *(f"schemes/{name}" for name in SCHEME_MODULES),
)


# ---------------------------------------------------------------------------------- scheme contract
def test_every_weight_averaging_scheme_implements_the_scheme_abc():
    for name, spec in fl_registry().fl_schemes.items():
        assert (spec.factory is None) != (spec.runner is None), name
        if spec.factory is not None:
            from immersion.backends import make_backend
            from immersion_fl.scheme import SchemeContext

            context = SchemeContext(
                make_backend("torch", dtype="float64"), np.random.default_rng(0)
            )
            assert isinstance(spec.factory(spec.options(), context), Scheme), name


@pytest.mark.parametrize("module", ["runtime/engine", "runtime/federation", "flower/engine"])
def test_engine_does_not_probe_capabilities(module):
    """The engines call the Scheme contract and read typed options; they never ask
    hasattr/getattr what a scheme or its options can do."""
    path = ROOT / "plugins" / "immersion_fl" / f"{module}.py"
    probes = [
        f"{path.name}:{node.lineno} {node.func.id}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr")
    ]
    assert probes == []


def test_the_summary_reports_secure_aggregation_from_the_scheme():
    cfg = RunConfig(scheme="sifl-m1", rounds=1, clients=2, hidden=(4,), compare_plain=False)
    assert run_federated(cfg).summary()["secure_aggregation"] is False
    secure = dataclasses.replace(cfg, options=SiflOptions(secure_aggregation=True))
    assert run_federated(secure).summary()["secure_aggregation"] is True


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_the_scheme_contract_type_checks():
    """mypy finds no error in the contract modules: the schemes' broadcast, upload and aggregate
    types are the ones their ``Scheme[BroadcastT, UploadT, AggregateT]`` base declares (imported
    modules are read for their types but not reported on)."""
    files = [str(Path("plugins") / "immersion_fl" / f"{name}.py") for name in CONTRACT]
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "plugins")])}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Success: no issues found in {len(CONTRACT)} source files" in done.stdout


def test_a_scheme_spec_takes_exactly_one_of_factory_and_runner():
    with pytest.raises(PluginError, match="exactly one"):
        SchemeSpec(name="x", options=NoOptions)
    with pytest.raises(PluginError, match="exactly one"):
        SchemeSpec(name="x", options=NoOptions, factory=lambda o, c: None, runner=lambda cfg: None)


# ------------------------------------------------------------------------------------------ options
def test_each_scheme_owns_its_options_and_they_validate_themselves():
    assert RunConfig(scheme="sifl-m2").options == SiflOptions()
    assert RunConfig(scheme="mpdp").options == MpdpOptions()
    assert RunConfig(scheme="gd-dp").options == DpSgdOptions()
    assert RunConfig(scheme="fedavg").options == NoOptions()
    with pytest.raises(InvalidArgumentError, match="options"):
        RunConfig(scheme="mpdp", options=SiflOptions())
    for bad, name in (
        (dict(p=1), "p"),
        (dict(noise="on"), "noise"),
        (dict(delta=0.7), "delta"),
        (dict(epsilon_local=math.inf), "epsilon_local"),
        (dict(keys="x"), "keys"),
    ):
        with pytest.raises(InvalidArgumentError, match=name):
            SiflOptions(**bad)
    with pytest.raises(InvalidArgumentError, match="graph"):
        MpdpOptions(graph="ring")
    with pytest.raises(InvalidArgumentError, match="sigma2"):
        DpSgdOptions(sigma2=-1.0)
    with pytest.raises(InvalidArgumentError, match="rounds"):
        RunConfig(rounds=0)


@pytest.mark.parametrize(
    "field, bad",
    [
        ("lr", -1.0),
        ("lr", math.nan),
        ("split", "zzz"),
        ("optimizer", ""),
        ("model", 3),
        ("dataset", ""),
        ("hidden", "8,4"),
        ("hidden", (8, 0)),
        ("alpha", 0.0),
        ("seed", -1),
        ("compare_plain", "yes"),
        ("client_timeout", -1.0),
        ("client_timeout", math.inf),
    ],
)
def test_every_common_field_is_checked_at_construction(field, bad):
    with pytest.raises(InvalidArgumentError) as info:
        RunConfig(**{field: bad})
    assert info.value.argument == field


def test_an_unregistered_optimizer_is_refused_where_the_run_starts():
    """The optimizer registry is looked up at the edge (engine, CLI), not in the configuration."""
    cfg = RunConfig(scheme="fedavg", optimizer="nope", rounds=1, clients=2, hidden=(4,))
    with pytest.raises(InvalidArgumentError, match="unknown optimizer 'nope'") as info:
        run_federated(cfg)
    assert info.value.argument == "optimizer"


def test_configurations_round_trip_and_flat_ones_migrate():
    cfg = RunConfig(scheme="mpdp", hidden=(8, 4), options=MpdpOptions(graph="nout:2", noise="off"))
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["format"] == 2
    flat = RunConfig.from_flat(
        {
            "scheme": "sgd-dp",
            "hidden": "8,4",
            "grad_clip": 2.0,
            "noise": "auto",
            "graph": "complete",
            "p": 2,
        }
    )  # the CLI passes every flag, at defaults
    assert flat.hidden == (8, 4) and flat.options == DpSgdOptions(grad_clip=2.0)
    with pytest.raises(InvalidArgumentError, match="applies to sifl-m1, sifl-m2, sifl-rm") as info:
        RunConfig.from_flat({"scheme": "sgd-dp", "p": 3})  # set for another scheme: refused
    assert info.value.argument == "p"
    with pytest.raises(InvalidArgumentError, match="unknown keys"):
        RunConfig.from_flat({"scheme": "sifl-m1", "epsilon_locale": 1.0})
    with pytest.raises(InvalidArgumentError, match="scheme"):
        RunConfig.from_flat({"scheme": "sifl-m9"})


def _assert_same_history(result, expected):
    """The uninterrupted run's history as the writing machine recorded it: the same accuracies, and
    a distance to plain FedAvg at rounding level (its last bits depend on the CPU's kernels, so it
    is not compared bit for bit)."""
    assert result.accuracy == expected["accuracy"]
    assert len(result.diff_vs_plain) == len(expected["diff_vs_plain"])
    assert max(result.diff_vs_plain) < 1e-13


@pytest.mark.files
def test_a_checkpoint_written_before_the_options_split_resumes_to_the_same_run(tmp_path):
    """The fixture holds rounds 1-2 of a 3-round run and the uninterrupted run's history, both
    written by the code before this change (flat format-1 configuration)."""
    expected = json.loads((LEGACY / "checkpoint-sifl-m2.expected.json").read_text())
    folder = tmp_path / "ckpt"
    shutil.copytree(LEGACY / "checkpoint-sifl-m2", folder)
    cfg = RunConfig.from_flat(expected["config"])
    result = run_federated(cfg, checkpoint=folder, resume=True)
    _assert_same_history(result, expected)
    saved = json.loads(np.load(folder / "state.npz")["meta"].tobytes().decode())
    assert json.loads(saved["cfg"])["format"] == 2  # rewritten in the new format


@pytest.mark.files
@pytest.mark.parametrize("field, value", [("epsilon", 2.0), ("grad_clip", 5.0)])
def test_a_format1_checkpoint_with_another_schemes_field_set_resumes_and_warns(
    tmp_path, field, value
):
    """The pre-split code ignored other schemes' fields (``--scheme sifl-m2 --epsilon 2``): the
    migration drops them with a warning naming them; new input keeps refusing them."""
    expected = json.loads((LEGACY / "checkpoint-sifl-m2.expected.json").read_text())
    folder = tmp_path / "ckpt"
    shutil.copytree(LEGACY / "checkpoint-sifl-m2", folder)
    with np.load(folder / "state.npz") as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes().decode())
    legacy_cfg = json.loads(meta["cfg"])
    assert "format" not in legacy_cfg and legacy_cfg[field] != value
    legacy_cfg[field] = value
    meta["cfg"] = json.dumps(legacy_cfg)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(folder / "state.npz", **arrays)

    cfg = RunConfig.from_flat(expected["config"])
    with pytest.warns(LegacyConfigWarning, match=f"{field}={value!r}"):
        result = run_federated(cfg, checkpoint=folder, resume=True)
    _assert_same_history(result, expected)
    with pytest.raises(InvalidArgumentError, match="not to scheme 'sifl-m2'") as info:
        RunConfig.from_flat(legacy_cfg)  # the same dictionary as new input is refused
    assert info.value.argument == field


# --------------------------------------------------------------------------------------- optimizers
@pytest.mark.parametrize("make", [lambda: sgd(0.1), lambda: momentum(0.1), lambda: adam(0.1)])
def test_optimizers_give_the_same_steps_on_numpy_and_torch(make):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=5) for _ in range(4)]
    opt = make()
    w_np, w_t = np.zeros(5), torch.zeros(5, dtype=torch.float64)
    s_np, s_t = opt.init(w_np), opt.init(w_t)
    for g in grads:
        step_np, s_np = opt.update(g, s_np, w_np)
        step_t, s_t = opt.update(torch.as_tensor(g), s_t, w_t)
        w_np, w_t = w_np + step_np, w_t + step_t
    np.testing.assert_array_equal(w_np, w_t.numpy())


def test_states_are_named():
    w = np.zeros(3)
    assert isinstance(sgd(0.1).init(w), EmptyState)
    assert isinstance(momentum(0.1).init(w), TraceState)
    state = adam(0.1).init(w)
    assert isinstance(state, AdamState) and state._fields == ("count", "mu", "nu")
    _, state = adam(0.1).update(np.ones(3), state, w)
    assert state.count == 1


def _today_dp_sgd_upload(rows, clip, sigma2, rng):
    """The SGD-DP user of seed 001 as it was computed before this change: clip every row with
    ``C x / max(||x||, C)``, average, add ``sqrt(sigma2) N(0, I)`` from the same generator."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    clipped = clip * rows / np.maximum(norms, clip)
    return clipped.T.mean(axis=1) + math.sqrt(sigma2) * rng.standard_normal(rows.shape[1])


def test_a_dp_sgd_client_is_a_chain_and_equals_todays_path():
    rows = np.random.default_rng(1).normal(scale=3.0, size=(16, 40))  # most rows exceed the clip
    lr, clip, sigma2 = 0.05, 2.0, 0.7
    client = chain(
        clip_by_norm(clip), dp_aggregate(math.sqrt(sigma2), rng=np.random.default_rng(5)), sgd(lr)
    )
    step, state = client.update(rows, client.init(None), None)
    expected = -lr * _today_dp_sgd_upload(rows, clip, sigma2, np.random.default_rng(5))
    np.testing.assert_allclose(step, expected, rtol=1e-14, atol=1e-16)
    assert [type(s).__name__ for s in state] == ["EmptyState", "DpAggregateState", "EmptyState"]


def test_without_privacy_the_chain_is_sgd_on_the_mean_gradient():
    """Optax's "no privacy recovers SGD": a clip that never binds and zero noise."""
    rows = np.random.default_rng(2).normal(size=(8, 6))
    client = chain(clip_by_norm(1e9), dp_aggregate(0.0, rng=0), sgd(0.3))
    step, _ = client.update(rows, client.init(None), None)
    np.testing.assert_array_equal(step, sgd(0.3).update(rows.mean(0), EmptyState(), None)[0])


def test_secagg_users_run_the_dp_sgd_chain():
    """``sgd-dp``'s user upload is the chain's output on its IID batch (same generator stream)."""
    from immersion_secagg.users import make_users

    cfg = RunConfig.from_flat(
        {
            "scheme": "sgd-dp",
            "hidden": (8,),
            "clients": 3,
            "batch_size": 16,
            "seed": 2,
            "grad_clip": 1.0,
        }
    )
    users, model, _ = make_users(cfg)
    w = model.initial_vector(0)
    upload = users[1].update(cfg, model, w, 0.3, t=4)
    rng = np.random.default_rng([cfg.seed, 4, 1])
    idx = rng.choice(len(users[1].y), cfg.batch_size, replace=False)
    batch = type(users[1])(1, users[1].x[idx], users[1].y[idx])
    expected = _today_dp_sgd_upload(batch.example_gradients(model, w), 1.0, 0.3, rng)
    np.testing.assert_allclose(upload, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: sgd(0.0),
        lambda: adam(0.1, beta1=1.0),
        lambda: momentum(-1.0),
        lambda: clip_by_norm(0.0),
        lambda: dp_aggregate(-1.0, rng=0),
        lambda: dp_aggregate(1.0, rng="x"),
        lambda: chain(sgd(0.1), "adam"),
    ],
)
def test_bad_optimizer_arguments_are_named(bad):
    with pytest.raises(InvalidArgumentError):
        bad()
