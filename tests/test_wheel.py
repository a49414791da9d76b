"""The package as users install it: the wheel that ``python -m build`` makes installs into a
clean virtual environment (no system site-packages) and runs the README's quick start from a
folder outside the repository.

Needs the package registry: the isolated build fetches its backend and ``pip`` installs the
wheel's dependencies (numpy, scipy, ...), both through pip's usual cache. It runs in CI like any
other test; with a warm cache, 57 s on the 2-core machine lightly loaded (build 10 s, environment,
install and demo 42 s) and 113 s at load average 7 (49 s of CPU).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import immersion
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: What the source distribution is made of (tests, demos and benchmarks stay in the repository).
SOURCES = ["pyproject.toml", "README.md", "LICENSE", "sdk", "plugins"]
PACKAGES = ["immersion", *sorted(p.name for p in (ROOT / "plugins").glob("immersion_*"))]

pytestmark = [pytest.mark.registry, pytest.mark.slow]


def _quick_start_command() -> str:
    """The ``immersion ...`` part of the README's first quick-start command."""
    section = README.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    match = re.search(r"\.venv/bin/(immersion [^&\n]+)", block)
    assert match, f"the quick start no longer runs `.venv/bin/immersion ...`:\n{block}"
    return match.group(1).strip()


def _run(args: list[str | Path], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``python -m build`` on a copy of the sources: an sdist, then the wheel built from it."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    _run([sys.executable, "-m", "build", "--outdir", tmp / "dist", source], cwd=tmp)
    (found,) = (tmp / "dist").glob("*.whl")
    return found


def test_the_wheel_carries_types_license_and_one_version(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"{p}/py.typed" for p in PACKAGES} <= set(names)
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    fields = Parser().parsestr(zipfile.ZipFile(wheel).read(metadata).decode())
    assert fields["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert fields["Version"] == immersion.__version__
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "sdk", "plugins")]


def test_the_wheel_runs_the_quick_start_in_a_clean_environment(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", wheel], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([python, "-c", "import immersion; print(immersion.__file__)"], cwd=elsewhere)
    assert Path(where.strip()).is_relative_to(venv)
    version = _run([venv / "bin" / "immersion", "--version"], cwd=elsewhere)
    assert immersion.__version__ in version
    command = _quick_start_command()
    out = _run([venv / "bin" / command.split()[0], *command.split()[1:]], cwd=elsewhere)
    assert re.search(r"decode_bound_holds\s+True", out), out
