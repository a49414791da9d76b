"""The control demos run as a user would run them, and decode exactly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wrap_your_controller_script_decodes_exactly(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "control_demos" / "wrap_your_controller.py"),
            "--steps",
            "200",
            "--plot",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    error = float(re.search(r"max \|u_plain - u_decoded\| = ([0-9.e+-]+)", out.stdout).group(1))
    assert error < 1e-9
    assert (tmp_path / "wrap_your_controller.png").stat().st_size > 1000


def test_controller_demo_closed_loops_coincide():
    from immersion_examples.demo import run_controller_demo

    result = run_controller_demo(steps=300, seed=3)
    assert result["max_abs_u_error"] < 1e-9 * max(1.0, result["max_abs_u"])
    assert result["max_abs_state_error"] < 1e-9
    assert result["max_abs_plant_state_difference"] < 1e-9
    assert abs(result["final_plant_position_plain"]) < 0.05  # the LQR loop regulates the mass to 0
