"""The fenced code blocks of README.md and of the documentation site's pages (``docs/**/*.md``).

The tests that run the documented examples as written (``tests/test_readme.py``,
``tests/test_readme_shell.py``, ``tests/test_flower_native.py``) read them from here, so a block
is found wherever it lives: a block moved from the README into a page is still run.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def doc_files() -> list[Path]:
    """README.md, then every Markdown page of ``docs/`` (a built site's folder left out)."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [ROOT / "README.md", *pages]


def fenced_blocks(language: str) -> list[tuple[str, str]]:
    """``(file relative to the repository, block text)`` of every block fenced as ``language``
    (a regular expression such as ``python`` or ``bash|sh``), in file order."""
    fence = re.compile(rf"^```(?:{language})\n(.*?)^```", flags=re.S | re.M)
    return [
        (path.relative_to(ROOT).as_posix(), block)
        for path in doc_files()
        for block in fence.findall(path.read_text())
    ]


def distinct_blocks(language: str) -> list[str]:
    """The texts of :func:`fenced_blocks`, each once (a block shown both in the README and on a
    page, such as the quick start, is one block: it is run once)."""
    return list(dict.fromkeys(block for _, block in fenced_blocks(language)))
