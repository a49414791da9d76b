"""Array backends: numpy (reference, float64) and torch (CPU/CUDA, float32/float64)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .base import ArrayBackend, NoiseStream
from .numpy_backend import NumpyBackend

__all__ = [
    "ArrayBackend",
    "NoiseStream",
    "NumpyBackend",
    "backend_of",
    "check_backend_names",
    "make_backend",
]


def make_backend(name: str, *, dtype: str | None = None, device: str | None = None) -> ArrayBackend:
    """Build a backend by name through the plugin registry (``numpy``, ``torch`` or a plugin's).

    Examples
    --------
    >>> make_backend("numpy").dtype_name
    'float64'
    """
    from ..plugins.manager import registry

    check_backend_names(name, dtype, device)
    return registry().make_backend(name, dtype=dtype, device=device)


def check_backend_names(name: Any, dtype: Any, device: Any) -> None:
    """Check the types of :func:`make_backend`'s arguments (the names are checked by the
    backend), naming the bad one.

    Parameters
    ----------
    name, dtype, device
        As for :func:`make_backend`.
    """
    from ..errors import InvalidArgumentError

    if not isinstance(name, str):
        raise InvalidArgumentError(
            "backend", f"expected a backend name such as 'numpy' or 'torch', got {name!r}"
        )
    if dtype is not None and not isinstance(dtype, str):
        raise InvalidArgumentError(
            "dtype", f"expected None or a name such as 'float64', got {dtype!r}"
        )
    if not (
        device is None
        or isinstance(device, str)
        or type(device).__name__ == "device"
        or (isinstance(device, int) and not isinstance(device, bool))
    ):
        raise InvalidArgumentError(
            "device",
            f"expected None, a name such as 'cpu' or 'cuda', or a torch.device, got {device!r}",
        )


def backend_of(array: Any) -> ArrayBackend:
    """The backend whose arrays ``array`` is: numpy, or torch with the tensor's dtype and device.

    Examples
    --------
    >>> import numpy as np
    >>> backend_of(np.zeros(2)).name
    'numpy'
    """
    if isinstance(array, np.ndarray):
        return _cached_backend("numpy", array.dtype.name, None)
    if type(array).__module__.startswith("torch") and hasattr(array, "device"):
        return _cached_backend("torch", str(array.dtype).removeprefix("torch."), str(array.device))
    from ..errors import InvalidArgumentError

    raise InvalidArgumentError(
        "array", f"expected a numpy array or a torch tensor, got {type(array).__name__}"
    )


@lru_cache(maxsize=16)
def _cached_backend(name: str, dtype: str, device: str | None) -> ArrayBackend:
    return make_backend(name, dtype=dtype, device=device)
