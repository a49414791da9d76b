"""``.. figure-commands::``: every file under ``docs/figures`` with the command that made it.

The command is the one the JSON file records (key ``command``), else the commands (inline code
starting with ``python``, ``.venv/bin/``, ``immersion``, ``benchmarks/`` or ``fl_demos/``) of the
paragraphs of the site's Markdown pages that name the file or its folder; a link to the page
(and section) that reports the figure comes with it. A figure whose command is found nowhere is
listed as such.
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


def _paragraphs(page: str) -> list[tuple[str, str]]:
    """``(section heading, paragraph)`` for every blank-line separated block of a page
    (headings of levels 1-3 outside code blocks)."""
    out, section, block, fence = [], "", [], False
    for line in page.splitlines() + [""]:
        if line.startswith("```"):
            fence = not fence
        heading = re.match(r"#{1,3} (.*)", line) if not fence else None
        if heading:
            section = heading.group(1).strip()
        if line.strip() or fence:
            block.append(line)
        elif block:
            out.append((section, "\n".join(block)))
            block = []
    return out


def doc_pages() -> dict[str, str]:
    """``{docname: text}`` of the site's Markdown pages (``tutorials/reactor`` ...)."""
    docs = ROOT / "docs"
    return {
        p.relative_to(docs).with_suffix("").as_posix(): p.read_text()
        for p in sorted(docs.rglob("*.md"))
        if "_build" not in p.parts
    }


def _mentions(block: str, relative: str) -> bool:
    folder = relative.rsplit("/", 1)[0]
    text = block.replace("\n", " ").replace("](../figures/", "](docs/figures/")
    return (
        relative in text or f"{folder}/`" in text or f"{folder}`" in text or f"{folder}/)" in text
    )


def figure_commands(pages: dict[str, str]) -> list[tuple[str, list[str], list[str]]]:
    """``(figure, commands, sections)`` for every file under ``docs/figures``; a section is
    ``docname#heading`` of a page of ``pages`` that names the file.

    Parameters
    ----------
    pages:
        ``{docname: Markdown text}`` of the site's pages (:func:`doc_pages`).
    """
    paragraphs = []
    for name, page in pages.items():
        title = next((s for s, _ in _paragraphs(page) if s), "")  # the page's heading
        for section, block in _paragraphs(page):
            paragraphs.append((f"{name}#{'' if section == title else section}", block))
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


def _where(section: str) -> str:
    """A link to the page of ``docname#heading``, with the heading in italics."""
    name, heading = section.split("#", 1)
    heading = heading.replace("`", "").replace("*", "")
    return f"{{doc}}`/{name}`, *{heading}*" if heading else f"{{doc}}`/{name}`"


class FigureCommands(SphinxDirective):
    """The table of :func:`figure_commands` (rows grouped by folder)."""

    def run(self) -> list[nodes.Node]:
        pages = doc_pages()
        for name in pages:
            self.env.note_dependency(str(ROOT / "docs" / f"{name}.md"))
        lines, folder = [], None
        for figure, commands, sections in figure_commands(pages):
            here = figure.rsplit("/", 1)[0]
            if here != folder:
                folder = here
                lines += ["", f"**{folder}/**", ""]
            where = "; ".join(_where(s) for s in sections) or "not named on any page"
            lines += [f"- ``{figure.rsplit('/', 1)[1]}`` ({where})", ""]
            lines += [f"  - ``{c}``" for c in commands] or ["  - (no command recorded)"]
            lines.append("")
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


def setup(app):  # Sphinx's extension entry point
    app.add_directive("figure-commands", FigureCommands)
    return {"parallel_read_safe": True}
