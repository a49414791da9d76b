"""The array-backend protocol: the few operations the coding layer needs.

Everything else (``@``, indexing, ``x[..., idx]``, arithmetic) is written once with syntax
that numpy arrays and torch tensors share, so the key algebra is not duplicated per backend.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class ArrayBackend(Protocol):
    """What a backend provides. Implementations: :mod:`.numpy_backend`, :mod:`.torch_backend`."""

    name: str
    dtype_name: str
    device: str

    @property
    def unit_roundoff(self) -> float:
        """Half the machine epsilon of the working dtype."""

    def asarray(self, value: Any) -> Any:
        """Convert a numpy array (or array-like) to the backend's array type and dtype."""

    def to_numpy(self, value: Any) -> np.ndarray:
        """Convert a backend array to a float64 numpy array."""

    def is_array(self, value: Any) -> bool:
        """True if ``value`` is already this backend's array type."""

    def zeros(self, shape: tuple[int, ...]) -> Any:
        """A zero array of the working dtype."""

    def segment_sum(self, values: Any, group_ids: Any, n_groups: int) -> Any:
        """Sum ``values`` over the last axis within groups given by ``group_ids``."""

    def all_finite(self, value: Any) -> bool:
        """True if every entry is finite."""

    def take(self, values: Any, index: Any) -> Any:
        """``values[..., index]`` (the fastest gather the library offers)."""

    def block_matmul(self, blocks: Any, vectors: Any) -> Any:
        """``blocks @ vectors`` for a stack of small square blocks: (k, b, b) @ (..., k, b, 1)."""

    def sqrt(self, value: Any) -> Any:
        """Element-wise square root."""

    def clip_min(self, value: Any, floor: float) -> Any:
        """Element-wise ``max(value, floor)``."""

    def row_norms(self, value: Any) -> Any:
        """Euclidean norms along the last axis, keeping that axis (length 1)."""

    def noise_stream(self, rng: np.random.Generator) -> "NoiseStream":
        """A source of fresh i.i.d. noise, seeded from ``rng``."""


class NoiseStream(Protocol):
    """Draws i.i.d. noise arrays in the backend's array type."""

    def get_state(self) -> bytes:
        """The generator state, to checkpoint a run."""

    def set_state(self, state: bytes) -> None:
        """Restore a state from :meth:`get_state`."""

    def laplace(self, shape: tuple[int, ...], loc: float, scale: float) -> Any:
        """Laplace(loc, scale) entries (``scale`` is the Laplace scale b)."""

    def normal(self, shape: tuple[int, ...], loc: float, scale: float) -> Any:
        """Normal(loc, scale**2) entries (``scale`` is the standard deviation)."""
