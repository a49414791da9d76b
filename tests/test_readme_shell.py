"""The shell commands of the README and of the documentation site run as written, from a fresh
working directory.

Each ```bash block of README.md and ``docs/**/*.md`` (:mod:`doc_blocks`; a block shown on two
pages, such as the quick start, counts once) is found by its first command (not by its file or
place) and run with
``bash -e`` in a temporary folder, with this Python's ``bin`` folder first on ``PATH`` and a
``HOME`` of its own; the tests assert on what the commands print and write. Placeholders a user
replaces are substituted from :data:`SUBSTITUTIONS` (loopback addresses) and the port 5555 with a
free one; any other upper-case word in a command fails the test, naming it.

Not executed here, with the reason (:data:`NOT_HERE`; a documented block in neither list fails
``test_every_documented_shell_block_is_run_or_accounted_for``):

- the installation block's ``python3 -m venv .venv && .venv/bin/pip install -q -e .``: it needs
  the package index; ``tests/test_wheel.py`` (marked ``registry``) installs the built wheel into a
  fresh environment and runs the block's ``immersion demo reactor``; here that last command,
  ``.venv/bin/immersion demo reactor``, runs as written (``.venv`` a link to this environment);
- ``pip install -e '.[dev,...]' && .venv/bin/python -m pytest -q``: the test suite itself;
- the Flower quickstart block (``patch -p1 < enable_sifl.patch`` ... ``flwr run``): run as
  written by ``tests/test_flower_native.py::test_the_readme_quickstart_block_runs_as_written``;
- the multi-machine Flower block (``immersion keys flower`` ... ``flower-superlink`` ...
  ``flower-supernode`` ... ``flwr run ... my-cluster``): its commands run on machines the user
  names (the SuperLink's fixed port 8000, a ``config.toml`` written by hand); the same deployment
  (TLS on every API, SuperNode authentication, ``flwr supernode register``, ``flwr run`` of both
  schemes) runs on loopback in ``tests/test_fl.py``
  (``test_flower_deployment_runtime_with_tls_and_node_auth_on_loopback``), with the test's own
  ports, key files from :mod:`immersion_fl.flower.tls` and two rounds, not the page's lines;
- the usage lines of ``docs/notes/mpdp_attacks.md`` and ``docs/notes/sifl_audit.md``: optional
  arguments in brackets, not commands; ``tests/test_mpdp_attacks.py`` runs the attack demo and
  the audit block of ``docs/explanation/audit.md`` (here, ``slow``) runs ``immersion audit
  --scheme sifl-m1``.

Times measured on the shared 2-core machine (lightly loaded / at load average 6-9): the curve-key
block 28-45 s, ``dp secagg`` 7 s, the install block's demo 6 s, the SIML three steps 31-40 s, the
own-model block 29 s-2 min. Marked ``slow``, each line of its block a test of its own: the SIML
``run`` block (mlp64 63-177 s; the 582,026-parameter CNN 215 s at load) and the audit block
(``immersion audit --scheme sifl-m1`` 52 s; ``immersion audit --json`` about 135 s idle, both
together 527 s at load; alone 339 s at load).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doc_blocks import distinct_blocks

BIN = Path(sys.executable).parent

#: Placeholders a user replaces, and the loopback values the tests put in their place.
SUBSTITUTIONS = {"CLOUD_HOST": "127.0.0.1", "SERVER": "127.0.0.1"}
#: The documented example port, replaced by a free one.
PORT = "5555"
#: Upper-case words that are shell syntax, not placeholders (heredoc delimiters).
SHELL_WORDS = {"EOF"}

#: Blocks (by first command) these tests run.
RUN_HERE = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . &&",
    "immersion keys curve --out keys --name server",
    "immersion dp secagg --theorem 2",
    "immersion siml run --model mlp64",
    "immersion siml encode --model mlp64",
    "mkdir -p mypkg",
    "immersion audit --json",
)
#: Blocks (by first command) run elsewhere or not at all; the module docstring says why.
NOT_HERE = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev",
    "cd fl_demos/flower_quickstart && patch -p1 < enable_sifl.patch",
    "immersion keys flower --out flower-keys",
    ".venv/bin/python fl_demos/mpdp_attacks.py [--json]",
    ".venv/bin/immersion audit --scheme sifl-m1 [--attack",
)
#: Distinct bash blocks of the README before its sections moved into ``docs/``: 10 (7 run here, 3
#: run elsewhere); the usage lines of two notes pages are counted since.
MIN_BLOCKS = 12


def _bash_blocks() -> list[str]:
    return distinct_blocks("bash|sh")


def _first_command(block: str) -> str:
    return next(line for line in block.splitlines() if line.strip() and line[0] != "#")


def _block(first: str) -> str:
    found = [b for b in _bash_blocks() if _first_command(b).startswith(first)]
    assert len(found) == 1, f"{len(found)} documented bash blocks start with {first!r}"
    return found[0]


def _commands_only(block: str) -> str:
    """The block without comments and heredoc bodies (where placeholders are looked for)."""
    text = re.sub(r"<<'?(\w+)'?\n.*?^\1$", "", block, flags=re.S | re.M)
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _substitute(block: str) -> str:
    """The block with its placeholders replaced; an unknown placeholder fails, naming it."""
    unknown = set(re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", _commands_only(block)))
    unknown -= set(SUBSTITUTIONS) | SHELL_WORDS
    assert not unknown, f"documented placeholders without a test value: {sorted(unknown)}"
    for name, value in SUBSTITUTIONS.items():
        block = re.sub(rf"\b{name}\b", value, block)
    return re.sub(rf":{PORT}\b", f":{_free_port()}", block)


@pytest.fixture
def shell(tmp_path):
    """A working folder, and ``run(script)``: ``bash -e`` there, returning what it printed."""
    work = tmp_path / "work"
    home = tmp_path / "home"
    work.mkdir()
    home.mkdir()
    assert (BIN / "immersion").exists(), f"no immersion command beside {sys.executable}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env |= {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}

    def run(script: str, timeout_s: float = 600) -> str:
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{script}\n---\n{out[-4000:]}"
        return done.stdout

    run.work, run.env = work, env  # type: ignore[attr-defined]
    return run


def _table(text: str) -> dict[str, str]:
    """``name  value`` lines of the CLI's plain output."""
    return dict(
        m.groups() for m in re.finditer(r"^\s*([a-z_0-9]+)\s{2,}(\S.*?)\s*$", text, flags=re.M)
    )


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_every_documented_shell_block_is_run_or_accounted_for():
    firsts = [_first_command(b) for b in _bash_blocks()]
    assert len(firsts) >= MIN_BLOCKS, firsts
    for first in firsts:
        known = [p for p in RUN_HERE + NOT_HERE if first.startswith(p)]
        assert len(known) == 1, f"documented bash block {first!r}: run it here or say why not"
    for prefix in RUN_HERE + NOT_HERE:
        assert any(f.startswith(prefix) for f in firsts), f"no documented block starts {prefix!r}"


def test_a_new_placeholder_fails_naming_it():
    with pytest.raises(AssertionError, match="MY_HOST"):
        _substitute("immersion remote stats tcp://MY_HOST:5555 # CLOUD_HOST in a comment\n")
    done = _substitute("x tcp://CLOUD_HOST:5555 SERVER:8000\n")
    assert re.fullmatch(r"x tcp://127\.0\.0\.1:(\d+) 127\.0\.0\.1:8000\n", done), done


def test_the_install_blocks_demo_runs(shell):
    """Its last command, from a folder whose ``.venv`` is this environment."""
    block = _block(RUN_HERE[0])
    last = block.strip().split(" && ")[-1]
    assert last == ".venv/bin/immersion demo reactor"
    (shell.work / ".venv").symlink_to(BIN.parent, target_is_directory=True)
    table = _table(shell(_substitute(last)))
    assert table["decode_bound_holds"] == "True"
    assert float(table["final_state_norm_immersed"]) == pytest.approx(
        float(table["final_state_norm_plain"]), rel=1e-6, abs=1e-9
    )


def test_the_curve_key_block_runs_a_server_and_two_clients(shell):
    """Keys, the folders the comments name, ``immersion serve`` in the background (stopped with
    SIGTERM), the reactor demo through ``--connect`` and ``remote stats`` from an admin key."""
    block = _substitute(_block(RUN_HERE[1]))
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("immersion serve"))
    end = start
    while lines[end].endswith("\\"):
        end += 1
    shell("\n".join(lines[:start]))
    assert sorted(p.name for p in (shell.work / "clients").iterdir()) == ["plant-1.key"]
    assert sorted(p.name for p in (shell.work / "admins").iterdir()) == ["admin.key"]
    assert (shell.work / "server.key").exists()

    log, summary = shell.work / "serve.log", shell.work / "serve.json"
    with open(log, "w") as err, open(summary, "w") as out:
        server = subprocess.Popen(
            ["bash", "-c", "exec " + "\n".join(lines[start : end + 1])],
            cwd=shell.work,
            env=shell.env,
            stdout=out,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while '"listening"' not in log.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.2)
        printed = shell("\n".join(lines[end + 1 :]))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert server.returncode == 0, log.read_text()[-2000:]

    demo, stats = re.split(r"^(?=protocol )", printed, maxsplit=1, flags=re.M)
    table = _table(demo)
    assert "(cloud at tcp://127.0.0.1:" in demo and table["decode_bound_holds"] == "True"
    assert float(table["final_state_norm_immersed"]) == pytest.approx(
        float(table["final_state_norm_plain"]), rel=1e-6, abs=1e-9
    )
    stats_table = _table(stats)
    assert stats_table["curve"] == "True" and stats_table["sessions_created"] == "1"
    assert stats_table["samples"] == "2000"

    events = _json_lines(log.read_text())
    by_event = {e["event"]: e for e in events}
    assert by_event["listening"]["curve"] and by_event["listening"]["clients"] == 1
    assert by_event["setup"]["algorithm"] == "reactor-controller"
    ended = by_event["session-end"]
    assert ended["session"] == by_event["setup"]["session"] and ended["reason"] == "closed"
    assert ended["samples"] == 2000 and ended["errors"] == 0
    assert by_event["stopping"]["reason"] == "SIGTERM" and by_event["stopped"]["abandoned"] == 0
    final = json.loads(summary.read_text())
    assert final["sessions_created"] == 1 and final["handshakes_denied"] == 0


def test_the_dp_secagg_block_prints_its_epsilons(shell):
    printed = shell(_substitute(_block(RUN_HERE[2])))
    theorem2 = _json_lines(printed)[0]
    assert theorem2["theorem"] == "2" and theorem2["users"] == 50
    assert theorem2["delta"] == 1e-4 and 0 < theorem2["epsilon"] < math.inf
    assert 1 < theorem2["alpha"] <= theorem2["alpha_max"]
    theorem4 = _table(printed.split("}", 1)[1])
    assert theorem4["theorem"] == "4" and theorem4["rounds"] == "100"
    assert 0 < float(theorem4["epsilon"]) < math.inf
    assert float(theorem4["sigma2"]) == 1e-3


def _siml_run_line(model: str) -> str:
    lines = _substitute(_block(RUN_HERE[3])).splitlines()
    found = [line for line in lines if line.startswith(f"immersion siml run --model {model} ")]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.slow
def test_the_siml_run_block_trains_mlp64(shell):
    mlp = _json_lines(shell(_siml_run_line("mlp64")))[0]
    assert mlp["model"] == "mlp64" and mlp["epochs"] == 10 and mlp["optimizer"] == "adam"
    assert mlp["max_abs_diff_vs_plain"] < 1e-6 and mlp["accuracy"] > 0.9


@pytest.mark.slow
def test_the_siml_run_block_trains_the_papers_cnn(shell):
    printed = shell(_siml_run_line("cnn"), timeout_s=850)
    assert printed.startswith("SIML cnn (582026 -> "), printed[:200]
    found = re.search(
        r"accuracy ([0-9.]+)\s+plain ([0-9.]+)\s+max \|w_SIML - w_plain\| (\S+)", printed
    )
    assert found, printed[:1000]
    accuracy, plain, diff = map(float, found.groups())
    assert accuracy == plain and accuracy > 0.9 and diff < 1e-6
    assert {p.name for p in (shell.work / "out").iterdir()} >= {
        "siml_accuracy.png",
        "siml_sample.png",
    }


def test_the_siml_encode_serve_decode_block(shell):
    printed = shell(_substitute(_block(RUN_HERE[4])))
    for name in ("me.keys", "job.siml", "model.enc", "w.npy"):
        assert (shell.work / name).stat().st_size > 0, name
    table = _table(printed)
    assert table["model"] == "mlp64" and table["decoded_model"] == "w.npy"
    assert float(table["accuracy"]) > 0.9


def test_the_own_model_block_writes_the_package_and_trains_it(shell):
    printed = shell(_substitute(_block(RUN_HERE[5])))
    assert (shell.work / "mypkg" / "models.py").exists()
    run = _json_lines(printed)[0]
    assert run["model"] == "mypkg.models:build_model" and run["n_train"] == 140
    assert run["max_abs_diff_vs_plain"] < 1e-9 and run["accuracy"] > 0.85
    for name in ("me.keys", "job.siml", "model.enc", "w.npy"):
        assert (shell.work / name).stat().st_size > 0, name
    table = _table(printed.split("}", 1)[1])
    assert table["model"] == "mypkg.models:build_model" and float(table["accuracy"]) > 0.85


def _audit_line(start: str) -> str:
    lines = _substitute(_block(RUN_HERE[6])).splitlines()
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.slow
def test_the_audit_block_runs_every_attack_on_every_scheme(shell):
    printed = shell(_audit_line("immersion audit --json "), timeout_s=850)
    attacks = json.loads(printed)["attacks"]
    assert {"sifl-m1", "sifl-m2"} <= {a["scheme"] for a in attacks}
    assert {a["verdict"] for a in attacks} <= {"leaks", "resists", "partial"}, attacks


@pytest.mark.slow
def test_the_audit_block_runs_one_scheme(shell):
    printed = shell(_audit_line("immersion audit --scheme sifl-m1 "), timeout_s=850)
    rows = [line.split(" | ") for line in printed.splitlines()[1:] if " | " in line]
    assert rows and {row[1] for row in rows} == {"sifl-m1"}
    assert {row[6] for row in rows} <= {"leaks", "resists", "partial"}, rows
