"""``.. figure-commands::``: every file under ``docs/figures`` with the command that made it.

The command is the one the JSON file records (key ``command``), else the commands (inline code
starting with ``python``, ``.venv/bin/``, ``immersion``, ``benchmarks/`` or ``fl_demos/``) of the
README paragraphs that name the file or its folder; the README section that reports the figure
comes with it. A figure whose command is found nowhere is listed as such.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"
_COMMAND = re.compile(r"`((?:python3?|\.venv/bin/|immersion |benchmarks/|fl_demos/)[^`]+)`")


def _paragraphs(readme: str) -> list[tuple[str, str]]:
    """``(section heading, paragraph)`` for every blank-line separated block of the README."""
    out, section = [], ""
    for block in re.split(r"\n\s*\n", readme):
        for line in block.splitlines():
            if line.startswith("## "):
                section = line[3:].strip()
        out.append((section, block))
    return out


def _mentions(block: str, relative: str) -> bool:
    folder = relative.rsplit("/", 1)[0]
    text = block.replace("\n", " ")
    return (
        relative in text or f"{folder}/`" in text or f"{folder}`" in text or f"{folder}/)" in text
    )


def figure_commands(readme: str) -> list[tuple[str, list[str], list[str]]]:
    """``(figure, commands, README sections)`` for every file under ``docs/figures``."""
    paragraphs = _paragraphs(readme)
    rows = []
    for path in sorted(p for p in FIGURES.rglob("*") if p.is_file()):
        relative = path.relative_to(ROOT).as_posix()
        commands: list[str] = []
        if path.suffix == ".json":
            recorded = json.loads(path.read_text())
            if isinstance(recorded, dict) and isinstance(recorded.get("command"), str):
                commands.append(recorded["command"])
        sections: list[str] = []
        for section, block in paragraphs:
            if _mentions(block, relative):
                sections += [section] if section not in sections else []
                if not commands:
                    commands += [c for c in _COMMAND.findall(block.replace("\n", " "))]
        rows.append((relative, list(dict.fromkeys(commands)), sections))
    return rows


class FigureCommands(SphinxDirective):
    """The table of :func:`figure_commands` (rows grouped by folder)."""

    def run(self) -> list[nodes.Node]:
        readme = (ROOT / "README.md").read_text()
        self.env.note_dependency(str(ROOT / "README.md"))
        lines, folder = [], None
        for figure, commands, sections in figure_commands(readme):
            here = figure.rsplit("/", 1)[0]
            if here != folder:
                folder = here
                lines += ["", f"**{folder}/**", ""]
            where = "; ".join(f"README: *{s}*" for s in sections) or "not named in the README"
            lines += [f"- ``{figure.rsplit('/', 1)[1]}`` ({where})", ""]
            lines += [f"  - ``{c}``" for c in commands] or ["  - (no command recorded)"]
            lines.append("")
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


def setup(app):  # Sphinx's extension entry point
    app.add_directive("figure-commands", FigureCommands)
    return {"parallel_read_safe": True}
