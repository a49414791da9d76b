"""The code stays within the project's lint rules (pyproject's [tool.ruff]: 100 columns, imports
sorted, no unused names) and in the formatter's layout, so a line past 100 columns or an
unformatted file fails here rather than in review."""

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


def test_ruff_format_leaves_every_tracked_file_unchanged():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (extra 'dev')")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the tracked files are unknown)")
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    files = listed.stdout.split()
    assert listed.returncode == 0 and files, listed.stderr
    done = subprocess.run(
        [ruff, "format", "--check", *files], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_tracked_python_line_is_longer_than_100_characters():
    """Pragma comments (``# type: ignore``, ``# noqa``) count too: ruff's E501 skips them."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the tracked files are unknown)")
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    long = [
        f"{name}:{number}"
        for name in listed.stdout.split()
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if len(line) > 100
    ]
    assert long == []
