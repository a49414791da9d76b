"""Build the documentation site (``docs/`` of a checkout) with Sphinx, warnings as errors.

``immersion docs`` calls :func:`build_docs` and opens the result; the test suite builds the same
way. The site needs the ``docs`` extra (Sphinx, furo, myst-parser); its sources are not part of
the installed package, so the command runs from a checkout of the repository.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import InvalidArgumentError, OptionalDependencyError

#: The ``docs/`` folder of the checkout this package was installed from (editable installs).
CHECKOUT_DOCS = Path(__file__).resolve().parents[2] / "docs"


def find_docs_source(source: Path | None = None) -> Path:
    """The folder holding the site's ``conf.py``: ``source``, else the checkout's or ./docs.

    Parameters
    ----------
    source:
        A folder given by the user (None: look in the checkout, then in ``./docs``).
    """
    candidates = [Path(source)] if source is not None else [CHECKOUT_DOCS, Path("docs")]
    for folder in candidates:
        if (folder / "conf.py").is_file():
            return folder.resolve()
    raise InvalidArgumentError(
        "source",
        f"no conf.py in {', '.join(map(str, candidates))}: run from a checkout of the repository",
    )


def build_docs(source: Path, out: Path) -> Path:
    """Build the HTML site of ``source`` into ``out`` (warnings are errors); its ``index.html``.

    Parameters
    ----------
    source:
        The folder holding ``conf.py`` (:func:`find_docs_source`).
    out:
        Where the HTML goes (created if missing).

    Raises
    ------
    OptionalDependencyError
        Sphinx, furo or myst-parser is missing (extra ``docs``).
    InvalidArgumentError
        The build failed or warned (Sphinx's messages are on stderr).
    """
    for module, package in (("sphinx", "sphinx"), ("furo", "furo"), ("myst_parser", "myst-parser")):
        if importlib.util.find_spec(module) is None:
            raise OptionalDependencyError(package, "docs", "the documentation site")
    from sphinx.cmd.build import build_main

    status = build_main(["-W", "--keep-going", "-q", "-b", "html", str(source), str(out)])
    if status != 0:
        raise InvalidArgumentError("source", f"the Sphinx build of {source} failed (exit {status})")
    return Path(out) / "index.html"
