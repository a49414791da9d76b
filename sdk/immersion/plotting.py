"""matplotlib for the figures that demos and commands write (extra ``plot``), imported lazily."""

from __future__ import annotations

from typing import Any

from .errors import OptionalDependencyError


def pyplot(purpose: str) -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or an error naming the extra.

    Parameters
    ----------
    purpose:
        What needs the figures (the error message starts with it).

    Raises
    ------
    OptionalDependencyError
        Without matplotlib: ``pip install 'immersion-coding[plot]'``.
    """
    try:
        import matplotlib
    except ImportError:
        raise OptionalDependencyError("matplotlib", "plot", purpose) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
