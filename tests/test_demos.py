"""The control demos run as a user would run them, and decode exactly."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_demo(script: str, *args: str) -> str:
    """stdout of ``control_demos/<script>`` run as a user runs it (fails on a non-zero exit)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "control_demos" / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout


def test_wrap_your_controller_script_decodes_exactly(tmp_path):
    stdout = _run_demo("wrap_your_controller.py", "--steps", "200", "--plot", str(tmp_path))
    error = float(re.search(r"max \|u_plain - u_decoded\| = ([0-9.e+-]+)", stdout).group(1))
    assert error < 1e-9
    assert (tmp_path / "wrap_your_controller.png").stat().st_size > 1000


@pytest.mark.slow  # a subprocess importing python-control and matplotlib: 3-6 s on two cores
def test_python_control_lqg_script_decodes_exactly(tmp_path):
    pytest.importorskip("control")
    stdout = _run_demo("python_control_lqg.py", "--steps", "150", "--json", "--plot", str(tmp_path))
    result = json.loads(stdout)  # exactly one JSON object on stdout
    assert result["steps"] == 150 and result["controller"] == {
        "n_state": 4,
        "n_input": 2,
        "n_output": 1,
    }
    assert result["closed_loop_spectral_radius"] < 1.0  # dlqr + dlqe give a stable loop
    assert result["max_abs_u"] > 0.1  # the loop does something
    assert result["max_abs_u_error"] < 1e-9 * max(1.0, result["max_abs_u"])
    assert result["max_abs_controller_state_error"] < 1e-9
    assert result["max_abs_plant_position_difference"] < 1e-9
    assert result["step_time_ratio"] > 0 and result["step_time_ratio_vs_python_control"] > 0
    assert (tmp_path / "python_control_lqg.png").stat().st_size > 1000


def test_controller_demo_closed_loops_coincide():
    from immersion_examples.demo import run_controller_demo

    result = run_controller_demo(steps=300, seed=3)
    assert result["max_abs_u_error"] < 1e-9 * max(1.0, result["max_abs_u"])
    assert result["max_abs_state_error"] < 1e-9
    assert result["max_abs_plant_state_difference"] < 1e-9
    assert abs(result["final_plant_position_plain"]) < 0.05  # the LQR loop regulates the mass to 0
