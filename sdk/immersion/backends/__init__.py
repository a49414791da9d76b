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
    from ..errors import InvalidArgumentError
    from ..plugin_manager import registry

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
    return registry().make_backend(name, dtype=dtype, device=device)
