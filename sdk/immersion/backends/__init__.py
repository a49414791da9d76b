"""Array backends: numpy (reference, float64) and torch (CPU/CUDA, float32/float64)."""
from __future__ import annotations

from .base import ArrayBackend, NoiseStream
from .numpy_backend import NumpyBackend

__all__ = ["ArrayBackend", "NoiseStream", "NumpyBackend", "make_backend"]


def make_backend(name: str, *, dtype: str | None = None, device: str | None = None) -> ArrayBackend:
    """Build a backend by name through the plugin registry (``numpy``, ``torch`` or a plugin's).

    Examples
    --------
    >>> make_backend("numpy").dtype_name
    'float64'
    """
    from ..plugin_manager import registry

    return registry().make_backend(name, dtype=dtype, device=device)
