"""The command-line interface: ``immersion ...`` (console script) and ``python -m immersion ...``.

Most tests drive ``immersion.cli.main.main`` through click's ``CliRunner``; a few run real processes
to show that both entry points work and that errors reach the user as one line, without a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from immersion import Keys, immerse, save_keys
from immersion.cli.main import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def one_json_object(stdout: str) -> dict[str, Any]:
    """``stdout`` is exactly one JSON object on one line (strict JSON: no NaN/Infinity)."""
    text = stdout.strip()
    assert text, "nothing on stdout"
    assert "\n" not in text, f"more than one line on stdout: {stdout!r}"
    obj = json.loads(text, parse_constant=_reject_constant)
    assert isinstance(obj, dict)
    return obj


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="immersion")


def assert_clean_failure(result: Result, *needles: str) -> str:
    """Non-zero exit through click (not an escaped exception), one ``Error:`` line, no traceback."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), f"unhandled {result.exception!r}"
    assert "Traceback" not in result.output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in error_lines[0], error_lines[0]
    assert result.stdout == ""
    return error_lines[0]


@pytest.fixture(scope="module")
def designed_keys() -> Keys:
    return immerse(
        lambda x, y: 0.5 * x + y[0], lambda x, y: x[:1], n_state=2, n_input=1, n_output=1, rng=0
    ).keys


@pytest.fixture
def key_file(tmp_path: Path, designed_keys: Keys) -> Path:
    return save_keys(designed_keys, tmp_path / "user.keys")


# ============================================================== plugins


def test_plugins_json_lists_backends_algorithm_and_command() -> None:
    result = invoke("plugins", "--json")
    assert result.exit_code == 0, result.output
    info = one_json_object(result.stdout)
    assert {"numpy", "torch"} <= set(info["backends"])
    assert "lqr-kalman" in info["algorithms"]
    assert "demo controller" in info["commands"]
    assert {"builtin", "examples"} <= set(info["plugins"])


def test_plugins_table_names_every_section() -> None:
    result = invoke("plugins")
    assert result.exit_code == 0, result.output
    for word in (
        "plugins:",
        "backends:",
        "algorithms:",
        "commands:",
        "numpy",
        "lqr-kalman",
        "demo controller",
    ):
        assert word in result.stdout


# ============================================================== demo controller


@pytest.fixture(scope="module")
def demo_50() -> dict[str, Any]:
    result = invoke("demo", "controller", "--steps", "50", "--json")
    assert result.exit_code == 0, result.output
    return one_json_object(result.stdout)


def test_demo_controller_json_is_exact_and_private(demo_50: dict[str, Any]) -> None:
    assert demo_50["steps"] == 50
    assert demo_50["max_abs_u_error"] < 1e-9
    assert demo_50["max_abs_state_error"] < 1e-9
    assert demo_50["epsilon_input"] <= 1e-3 * (1 + 1e-9)
    assert demo_50["epsilon_output"] <= 1e-3 * (1 + 1e-9)
    assert demo_50["step_time_ratio"] > 0
    assert demo_50["max_abs_u"] > 0  # the controller actually acted
    assert "fingerprint=" in demo_50["keys"]
    assert "plots" not in demo_50


def test_demo_controller_honours_its_options() -> None:
    result = invoke(
        "demo",
        "controller",
        "--steps",
        "7",
        "--epsilon-input",
        "0.01",
        "--epsilon-output",
        "0.02",
        "--seed",
        "3",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = one_json_object(result.stdout)
    assert out["steps"] == 7
    assert out["epsilon_input"] == pytest.approx(0.01, rel=1e-9)
    assert out["epsilon_output"] == pytest.approx(0.02, rel=1e-9)
    assert out["max_abs_u_error"] < 1e-9


def test_demo_controller_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    folder = tmp_path / "plots" / "nested"  # created on demand
    result = invoke("demo", "controller", "--steps", "20", "--json", "--plot", str(folder))
    assert result.exit_code == 0, result.output
    out = one_json_object(result.stdout)
    pngs = sorted(folder.glob("*.png"))
    assert pngs, f"no PNG in {folder}"
    assert [Path(p) for p in out["plots"]] == pngs
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000


def test_demo_controller_table_output() -> None:
    result = invoke("demo", "controller", "--steps", "5")
    assert result.exit_code == 0, result.output
    assert "max_abs_u_error" in result.stdout and "keys: Keys(" in result.stdout


def test_demo_controller_tiny_epsilon_is_a_clean_precision_error() -> None:
    result = invoke(
        "demo",
        "controller",
        "--steps",
        "5",
        "--epsilon-input",
        "1e-14",
        "--epsilon-output",
        "1e-14",
    )
    line = assert_clean_failure(result, "tolerance", "smallest feasible")
    assert result.exit_code == 2
    assert "epsilon_input=" in line


# ============================================================== report


def test_report_json_has_epsilons_error_bound_and_composition() -> None:
    result = invoke(
        "report", "--n-state", "3", "--n-input", "1", "--n-output", "1", "--json", "--steps", "10"
    )
    assert result.exit_code == 0, result.output
    out = one_json_object(result.stdout)
    assert out["epsilon_input"] <= 1e-3 * (1 + 1e-9)
    assert out["decode_error_estimate"] > 0
    composed = out["composed"]
    assert composed["steps"] == 10
    assert (
        out["epsilon_input"] < composed["epsilon_input"] <= 10 * out["epsilon_input"] * (1 + 1e-9)
    )
    assert composed["delta"] == pytest.approx(1e-6)
    assert "x: 3->4" in out["keys"]  # n_state 3 + extra_state 1


def test_report_single_step_has_no_composition() -> None:
    result = invoke(
        "report",
        "--n-state",
        "2",
        "--n-input",
        "2",
        "--n-output",
        "3",
        "--json",
        "--noise",
        "gaussian",
        "--keys",
        "block",
    )
    assert result.exit_code == 0, result.output
    out = one_json_object(result.stdout)
    assert "composed" not in out
    assert out["noise"] == "gaussian" and out["delta_input"] > 0
    assert "kind='block'" in out["keys"]


@pytest.mark.parametrize("delta", ["2", "-1"])
def test_report_refuses_a_delta_outside_zero_one(delta: str) -> None:
    result = invoke(
        "report",
        "--n-state",
        "3",
        "--n-input",
        "1",
        "--n-output",
        "1",
        "--json",
        "--steps",
        "5",
        "--delta",
        delta,
    )
    assert_clean_failure(result, "delta")


# ============================================================== keys inspect


@pytest.mark.files
def test_keys_inspect_json_matches_the_fingerprint(key_file: Path, designed_keys: Keys) -> None:
    result = invoke("keys", "inspect", str(key_file), "--json")
    assert result.exit_code == 0, result.output
    info = one_json_object(result.stdout)
    assert info["fingerprint"] == designed_keys.fingerprint
    assert info["kind"] == designed_keys.kind
    assert {k: info[k] for k in designed_keys.dims} == designed_keys.dims
    assert info["noise"] == designed_keys.noise_kind
    assert info["noise_scale"] == pytest.approx(designed_keys.noise_scale)


def test_keys_inspect_table_never_prints_the_keys(key_file: Path, designed_keys: Keys) -> None:
    result = invoke("keys", "inspect", str(key_file))
    assert result.exit_code == 0, result.output
    assert designed_keys.fingerprint in result.stdout
    assert "[" not in result.stdout  # shapes and scalars only, no matrices


def _damage(path: Path, how: str) -> Path:
    blob = path.read_bytes()
    if how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "one-byte":
        changed = bytearray(blob)
        changed[len(blob) // 2] ^= 0x01
        path.write_bytes(bytes(changed))
    elif how == "not-a-key-file":
        path.write_text("this is not a key file\n")
    elif how == "group-readable":
        os.chmod(path, 0o644)
        return path
    elif how == "missing":
        path.unlink()
        return path
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize(
    ("how", "text"),
    [
        ("truncated", "integrity check"),
        ("one-byte", "integrity check"),
        ("not-a-key-file", "not an immersion key file"),
        ("group-readable", "chmod 600"),
        ("missing", "cannot read"),
    ],
)
def test_keys_inspect_bad_file_is_a_one_line_error(key_file: Path, how: str, text: str) -> None:
    _damage(key_file, how)
    result = invoke("keys", "inspect", str(key_file), "--json")
    line = assert_clean_failure(result, text, key_file.name)
    assert result.exit_code == 2
    assert line.startswith("Error: path: ")


def test_keys_inspect_on_a_folder_is_refused(tmp_path: Path) -> None:
    assert_clean_failure(invoke("keys", "inspect", str(tmp_path)), "directory")


# ============================================================== bad option values


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["demo", "controller", "--steps", "0"], "--steps"),
        (["demo", "controller", "--steps", "-3"], "--steps"),
        (["demo", "controller", "--steps", "many"], "--steps"),
        (["demo", "controller", "--epsilon-input", "0"], "--epsilon-input"),
        (["demo", "controller", "--epsilon-output", "-1"], "--epsilon-output"),
        (["report", "--n-state", "0", "--n-input", "1", "--n-output", "1"], "--n-state"),
        (["report", "--n-input", "1", "--n-output", "1"], "--n-state"),
        (
            ["report", "--n-state", "2", "--n-input", "1", "--n-output", "1", "--steps", "0"],
            "--steps",
        ),
        (
            ["report", "--n-state", "2", "--n-input", "1", "--n-output", "1", "--noise", "foo"],
            "--noise",
        ),
        (
            ["report", "--n-state", "2", "--n-input", "1", "--n-output", "1", "--keys", "foo"],
            "--keys",
        ),
        (
            ["report", "--n-state", "2", "--n-input", "1", "--n-output", "1", "--dtype", "float16"],
            "--dtype",
        ),
        (
            ["report", "--n-state", "2", "--n-input", "1", "--n-output", "1", "--extra-input", "0"],
            "--extra-input",
        ),
        # passes click's type check, refused by immerse(): the SDK error is turned into a usage
        # error
        (
            [
                "report",
                "--n-state",
                "2",
                "--n-input",
                "1",
                "--n-output",
                "1",
                "--epsilon-input",
                "-1",
            ],
            "epsilon-input",
        ),
        (
            [
                "report",
                "--n-state",
                "2",
                "--n-input",
                "1",
                "--n-output",
                "1",
                "--epsilon-output",
                "nan",
            ],
            "epsilon_output",
        ),
        (["bench", "core", "--steps", "1"], "--steps"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_bad_option_value_exits_non_zero_without_traceback(args: list[str], needle: str) -> None:
    result = invoke(*args)
    assert_clean_failure(result, needle)
    assert result.exit_code == 2


def test_version_and_help() -> None:
    from immersion import __version__

    result = invoke("--version")
    assert result.exit_code == 0 and __version__ in result.stdout
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("demo", "report", "keys", "plugins", "bench"):
        assert command in result.stdout


# ============================================================== real processes: both entry points


def _console_script() -> str:
    script = Path(sys.executable).parent / ("immersion.exe" if os.name == "nt" else "immersion")
    found = str(script) if script.exists() else shutil.which("immersion")
    assert found, "the 'immersion' console script is not installed next to this Python"
    return found


ENTRY_POINTS = {
    "console-script": lambda: [_console_script()],
    "python-m": lambda: [sys.executable, "-m", "immersion"],
}


def run(entry: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    return subprocess.run(
        ENTRY_POINTS[entry]() + list(args),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_point_help_and_plugins_json(entry: str, tmp_path: Path) -> None:
    proc = run(entry, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: immersion ")
    proc = run(entry, "plugins", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    info = one_json_object(proc.stdout)
    assert {"numpy", "torch"} <= set(info["backends"]) and "demo controller" in info["commands"]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_point_demo_controller_json(entry: str, tmp_path: Path) -> None:
    proc = run(entry, "demo", "controller", "--steps", "50", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = one_json_object(proc.stdout)
    assert out["max_abs_u_error"] < 1e-9
    assert out["epsilon_input"] <= 1e-3 * (1 + 1e-9)
    assert out["step_time_ratio"] > 0


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_point_errors_are_one_line_without_traceback(entry: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.keys"
    bad.write_text("hello\n")
    os.chmod(bad, 0o600)
    for args, text in (
        (["keys", "inspect", str(bad)], "not an immersion key file"),
        (["demo", "controller", "--steps", "0"], "--steps"),
    ):
        proc = run(entry, *args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
        assert proc.stdout == ""
        error_lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
        assert len(error_lines) == 1 and text in error_lines[0], proc.stderr


def test_report_with_an_absurd_epsilon_fails_without_traceback(tmp_path: Path) -> None:
    proc = run(
        "python-m",
        "report",
        "--n-state",
        "3",
        "--n-input",
        "1",
        "--n-output",
        "1",
        "--json",
        "--epsilon-input",
        "1e300",
        "--steps",
        "3",
        cwd=tmp_path,
    )
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2 or (proc.returncode == 0 and one_json_object(proc.stdout))


@pytest.mark.files
def test_keys_new_writes_a_usable_key_file(tmp_path: Path) -> None:
    from immersion import immerse, load_keys

    path = tmp_path / "ctrl.keys"
    result = CliRunner().invoke(
        main,
        [
            "keys",
            "new",
            "--n-state",
            "3",
            "--n-input",
            "1",
            "--n-output",
            "1",
            "--epsilon-input",
            "0.01",
            "--seed",
            "4",
            "--out",
            str(path),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    keys = load_keys(path)
    assert info["fingerprint"] == keys.fingerprint and (path.stat().st_mode & 0o777) == 0o600
    imm = immerse(lambda x, y: 0.5 * x + y[0], lambda x, y: x[:1], 3, 1, 1, keys=keys)
    assert imm.report().epsilon_input == pytest.approx(0.01, rel=1e-9)
    again = CliRunner().invoke(
        main,
        ["keys", "new", "--n-state", "3", "--n-input", "1", "--n-output", "1", "--out", str(path)],
    )
    assert again.exit_code == 2 and "exists" in again.output  # no silent overwrite
