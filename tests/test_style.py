"""The code stays within the project's lint rules (pyproject's [tool.ruff]: 100 columns, imports
sorted, no unused names), so a line past 100 columns fails here rather than in review."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str | None:
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.exists() else shutil.which("ruff")


def test_ruff_check_is_clean():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (extra 'dev')")
    done = subprocess.run(
        [ruff, "check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
