"""numpy float64 backend: the reference implementation."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..validation import all_finite


class NumpyBackend:
    """Reference backend: numpy arrays in float64 (float32 allowed for experiments)."""

    name = "numpy"
    device = "cpu"

    def __init__(self, dtype: str = "float64") -> None:
        if dtype not in ("float64", "float32"):
            raise InvalidArgumentError(
                "dtype", f"numpy backend supports 'float64' or 'float32', got {dtype!r}"
            )
        self.dtype_name = dtype
        self._dtype = np.dtype(dtype)

    @property
    def unit_roundoff(self) -> float:
        return float(np.finfo(self._dtype).eps) / 2

    def asarray(self, value: Any) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype.kind in "iub":  # index arrays keep an integer type
            return arr.astype(np.int64, copy=False)
        return arr.astype(self._dtype, copy=False)

    def to_numpy(self, value: Any) -> np.ndarray:
        return np.asarray(value, dtype=np.float64)

    def is_array(self, value: Any) -> bool:
        return isinstance(value, np.ndarray)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=self._dtype)

    def segment_sum(self, values: np.ndarray, group_ids: np.ndarray, n_groups: int) -> np.ndarray:
        # group_ids is sorted (groups are contiguous), so reduceat over the group starts is exact
        starts = np.searchsorted(group_ids, np.arange(n_groups))
        return np.add.reduceat(values, starts, axis=-1)

    def all_finite(self, value: Any) -> bool:
        return all_finite(np.asarray(value))

    def take(self, values: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take(values, index, axis=-1)

    def block_matmul(self, blocks: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        return blocks @ vectors

    def sqrt(self, value: np.ndarray) -> np.ndarray:
        return np.sqrt(value)

    def clip_min(self, value: np.ndarray, floor: float) -> np.ndarray:
        return np.maximum(value, floor)

    def row_norms(self, value: np.ndarray) -> np.ndarray:
        return np.linalg.norm(value, axis=-1, keepdims=True)

    def noise_stream(self, rng: np.random.Generator) -> "NumpyNoise":
        return NumpyNoise(rng, self._dtype)


class NumpyNoise:
    """Noise from a numpy Generator (PCG64)."""

    def __init__(self, rng: np.random.Generator, dtype: np.dtype) -> None:
        self._rng = rng
        self._dtype = dtype

    def get_state(self) -> bytes:
        """The generator state (to checkpoint a run)."""
        import json

        return json.dumps(self._rng.bit_generator.state).encode()

    def set_state(self, state: bytes) -> None:
        """Restore a state from :meth:`get_state`."""
        import json

        self._rng.bit_generator.state = json.loads(state.decode())

    def laplace(self, shape: tuple[int, ...], loc: float, scale: float) -> np.ndarray:
        return self._rng.laplace(loc, scale, size=shape).astype(self._dtype, copy=False)

    def normal(self, shape: tuple[int, ...], loc: float, scale: float) -> np.ndarray:
        return self._rng.normal(loc, scale, size=shape).astype(self._dtype, copy=False)
