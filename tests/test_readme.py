"""The Python examples of the README and of the documentation site's pages run as written.

Every ```python block of README.md and ``docs/**/*.md`` (:mod:`doc_blocks`) runs in a fresh
namespace; the first thing it prints is an error against the plain computation (decoded against
plain, resumed against uninterrupted ...), which must be below 1e-9.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from doc_blocks import ROOT, fenced_blocks

BLOCKS = fenced_blocks("python")
#: The README held 10 Python blocks before its sections moved into ``docs/``; they run from their
#: pages now, beside the README's 4 short examples and the checkpoints how-to's block.
MIN_BLOCKS = 15


def test_the_documentation_has_its_python_examples():
    assert len(BLOCKS) >= MIN_BLOCKS, [source for source, _ in BLOCKS]


@pytest.mark.parametrize(
    "source, block", BLOCKS, ids=[f"{source}:{i}" for i, (source, _) in enumerate(BLOCKS)]
)
def test_documented_python_block_runs(source, block, capsys):
    namespace: dict = {}
    exec(compile(block, source, "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out.split()
    assert float(printed[0]) < 1e-9  # the decoded result equals the plain one


def test_the_readme_is_short_and_keeps_the_test_command_for_ci():
    """At most 250 lines (the manual is the site); ``.ci/run`` runs the line two below the
    ``<!-- test-command -->`` marker (its awk program, run here on the README)."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    program = re.search(r"awk '([^']+)' README\.md", (ROOT / ".ci" / "run").read_text()).group(1)
    command = subprocess.run(
        ["awk", program, str(readme)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev")
    assert command.endswith(".venv/bin/python -m pytest -q")
