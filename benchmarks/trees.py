"""An earlier revision's ``sdk/`` and ``plugins/``, for benchmarks that time it beside this tree.

Used by ``bench_control_loop.py`` and ``bench_huge_keys.py`` (``--baseline-ref REF``); the tree
runs with its own plugins, since the plugins register at import and must match their core.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def extract_tree(ref: str, into: Path) -> Path:
    """``sdk/`` and ``plugins/`` of git revision ``ref`` under ``into`` (returned)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "sdk", "plugins"],
        capture_output=True,
        check=True,
    ).stdout
    tar_path = into / "tree.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that imports ``tree``'s ``sdk/`` and ``plugins/`` first."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / d) for d in ("sdk", "plugins")))
