"""Without matplotlib, every ``--plot`` says which extra brings it (``plot``), before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from immersion import OptionalDependencyError
from immersion.plotting import pyplot

ROOT = Path(__file__).resolve().parents[1]
#: runs a script as ``python SCRIPT ARGS`` would, with matplotlib made unimportable
WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_pyplot_names_the_plot_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        OptionalDependencyError, match=r"my figures needs.*immersion-coding\[plot\]"
    ):
        pyplot("my figures")


def test_wrap_your_controller_plot_without_matplotlib_names_the_extra(tmp_path):
    script = ROOT / "control_demos" / "wrap_your_controller.py"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, str(script), "--plot", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr  # argparse's usage error
    assert "wrap_your_controller.py --plot needs the optional package 'matplotlib'" in done.stderr
    assert "pip install 'immersion-coding[plot]'" in done.stderr
    assert "steps:" not in done.stdout  # refused before the loop ran
