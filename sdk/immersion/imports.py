"""User code named by an import path (``package.module:attribute``), for the CLI and job files.

A job or checkpoint file stores the path and the weights, never a pickle: loading it imports the
user's module by name (from ``sys.path`` and the current folder), exactly as the CLI did.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

from .errors import InvalidArgumentError

_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_import_path(text: str) -> bool:
    """Whether ``text`` looks like ``package.module:attribute``.

    Parameters
    ----------
    text:
        The text to check.

    Examples
    --------
    >>> is_import_path("mypkg.models:build"), is_import_path("mlp")
    (True, False)
    """
    return isinstance(text, str) and bool(_PATH.match(text))


def load_object(path: str, *, argument: str) -> Any:
    """The object at ``package.module:attribute`` (the current folder is importable, as for
    ``python -m``).

    Parameters
    ----------
    path:
        ``package.module:attribute`` (the attribute may be dotted: ``module:Class.method``).
    argument:
        The option name for errors (e.g. ``model``).

    Examples
    --------
    >>> load_object("math:pi", argument="model") > 3
    True
    """
    if not is_import_path(path):
        raise InvalidArgumentError(argument, f"expected package.module:attribute, got {path!r}")
    module_name, _, attribute = path.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(argument, f"cannot import {module_name!r} ({exc})") from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgumentError(
                argument, f"{module_name!r} has no attribute {attribute!r}"
            ) from None
    return obj


def call_loader(path: str, *, argument: str, **kwargs: Any) -> Any:
    """Import ``path`` and call it with ``kwargs`` (refusing things that are not callable).

    Parameters
    ----------
    path:
        ``package.module:function``.
    argument:
        The option name for errors.
    **kwargs:
        Passed to the function.
    """
    func = load_object(path, argument=argument)
    if not callable(func):
        raise InvalidArgumentError(argument, f"{path!r} is not callable")
    return func(**kwargs)
