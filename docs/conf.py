"""Sphinx configuration of the documentation site (``immersion docs`` builds and opens it).

Built with warnings as errors by ``tests/test_docs.py``; a public name of ``immersion.__all__``
without an entry in the API reference is an error too (:func:`_check_public_names`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import immersion

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "immersion"
release = version = immersion.__version__
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "figure_commands",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "figures", "audit"]
html_theme = "furo"
html_title = f"immersion {release}"

# NumPy-style docstrings (the project's convention); "name:" without a type is a parameter.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

myst_heading_anchors = 3


def undocumented(documented: set[str]) -> list[str]:
    """The names of ``immersion.__all__`` (but ``__version__``) missing from ``documented``
    (full Python object names such as ``immersion.immerse``)."""
    public = [name for name in immersion.__all__ if name != "__version__"]
    return [name for name in public if f"immersion.{name}" not in documented]


def _check_public_names(app, env) -> None:  # Sphinx's env-check-consistency event
    """A warning (an error under ``-W``) for every public name without an API entry."""
    missing = undocumented(set(env.domaindata["py"]["objects"]))
    if missing:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "public names without an API entry: %s", ", ".join(missing)
        )


def setup(app):  # Sphinx's entry point
    app.connect("env-check-consistency", _check_public_names)
