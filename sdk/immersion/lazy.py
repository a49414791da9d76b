"""Lazy public attributes for plugin packages: ``__all__`` without importing heavy modules.

A plugin package is imported when the plugin manager registers it, so its ``__init__`` must not
import torch, scipy or flwr. :func:`lazy_attributes` gives it a module ``__getattr__`` (PEP 562)
that imports the submodule holding a public name on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``where[name]`` (relative to ``package``) on use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    where : mapping of str to str
        Public name to the submodule that defines it, relative (``".wfna"``).

    Returns
    -------
    callable
        ``__getattr__(name)``: the attribute, or ``AttributeError`` for an unknown name.

    Examples
    --------
    >>> getattr_ = lazy_attributes("immersion", {"bench_core": ".bench.core"})
    >>> getattr_("bench_core").__name__
    'bench_core'
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name], package), name)

    return __getattr__
