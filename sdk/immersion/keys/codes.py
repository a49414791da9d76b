"""Codes: one affine encoding ``x -> Pi x + N s`` with its left inverse and kernel basis.

Two implementations share one interface:

* :class:`DenseCode` holds explicit matrices (small dimensions, or keys a user supplies);
* :class:`StructuredCode` holds the O(n b) factors of :mod:`.structured` (large dimensions).

The runtime pieces (``Encoder``, ``Decoder``) are what the target algorithm receives: they
carry exactly the matrices one direction needs, on one backend, and nothing else.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .stats import RowStats, dense_row_stats
from .structured import MixParams, OrthogonalTransform, structured_row_stats
from .views import ExplicitShape, PositionedShape

#: Above this many entries a dense view of a structured key is refused (it would not fit).
MAX_DENSE_ENTRIES = 50_000_000


class DenseEncoder:
    """``y -> Pi y`` with an explicit matrix.

    On numpy ``y.dot(Pi^T)`` (one ``gemv`` for a vector, with a third of ``y @ Pi^T``'s call
    overhead on a control loop's small vectors); ``y @ Pi^T`` on other backends.
    """

    def __init__(self, pi: np.ndarray, backend: Any) -> None:
        self._pi_t = backend.asarray(np.ascontiguousarray(pi.T))
        self._gemv = isinstance(self._pi_t, np.ndarray)

    def __call__(self, y: Any) -> Any:
        return y.dot(self._pi_t) if self._gemv else y @ self._pi_t

    @classmethod
    def of_transposed(cls, pi_t: np.ndarray) -> Any:
        """The operator of a numpy float64 matrix given as its C-contiguous transpose ``Pi^T``
        (held as it is, no copy: what the key pool of :mod:`immersion.coding.rotation` hands out).

        Parameters
        ----------
        pi_t : np.ndarray
            ``Pi^T``, C-contiguous float64.
        """
        self = cls.__new__(cls)
        self._pi_t, self._gemv = pi_t, True
        return self

    @property
    def matrix_t(self) -> Any:
        """``Pi^T`` as the backend holds it."""
        return self._pi_t


class DenseNoisyEncoder:
    """``(y, s) -> Pi y + N s`` with explicit matrices (seed 002 eq. 16).

    ``signal`` (``y -> Pi y``) and ``noise`` (``s -> N s``) are the two halves, for a caller that
    draws and encodes the noise ahead of time (:mod:`immersion.coding.noise_blocks`).
    """

    def __init__(self, pi: np.ndarray, noise_basis: np.ndarray, backend: Any) -> None:
        self.signal = DenseEncoder(pi, backend)
        self.noise = DenseEncoder(noise_basis, backend)

    def __call__(self, y: Any, s: Any) -> Any:
        return self.signal(y) + self.noise(s)


class DenseDecoder(DenseEncoder):
    """``x -> Pi^L x`` with an explicit left inverse (same algebra as the encoder)."""


class DenseTargetSample:
    """The five transposed matrices of seed 002 eq. 17, for small dense keys on numpy float64.

    ``state_left`` and ``input_left`` (``Pi2_left^T``, ``Pi1_left^T``) decode ``x~`` and ``y~``;
    ``state``, ``output`` and ``mask`` (``Pi2^T``, ``Pi3^T``, ``Pi4^T``) encode the results:
    ``v.dot(matrix)``, as the dense operators compute it. :meth:`of` returns ``None`` where it
    does not apply (other backends or dtypes, structured codes). ``state_shape``,
    ``input_shape``, ``f_shape`` and ``g_shape`` are the shapes of ``x~``, ``y~``, ``f(x, y)``
    and ``g(x, y)``.
    """

    __slots__ = (
        "state_left",
        "input_left",
        "state",
        "output",
        "mask",
        "state_shape",
        "input_shape",
        "f_shape",
        "g_shape",
    )

    def __init__(self, *matrices: np.ndarray) -> None:
        self.state_left, self.input_left, self.state, self.output, self.mask = matrices
        self.state_shape, self.input_shape = self.state_left.shape[:1], self.input_left.shape[:1]
        self.f_shape, self.g_shape = self.state.shape[:1], self.output.shape[:1]

    @classmethod
    def of(
        cls, state_in: Any, input_in: Any, state_out: Any, output_out: Any, mask: Any
    ) -> "DenseTargetSample | None":
        """The matrices of five dense numpy float64 operators (decoders, encoders, mask)."""
        parts = (state_in, input_in, state_out, output_out, mask)
        if not all(isinstance(p, DenseEncoder) and p._gemv for p in parts):
            return None
        matrices = [p.matrix_t for p in parts]
        return cls(*matrices) if all(m.dtype == np.float64 for m in matrices) else None

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


class DenseUserSample:
    """The user side's transposed matrices of seed 002 eqs. 16 and 18, for small dense keys on
    numpy float64 (what :class:`~immersion.coding.handle.Immersion` needs per sample).

    ``input`` (``Pi1^T``; None when the encoding noise is not encoded ahead of time) encodes
    ``y``; ``mask`` (``Pi4^T``) and ``output_left`` (``Pi3_left^T``) decode ``u~``;
    ``state_left`` (``Pi2_left^T``) decodes ``x~``. ``y_shape``, ``yt_shape``, ``ut_shape`` and
    ``xt_shape`` are the shapes of ``y``, ``y~``, ``u~`` and ``x~``.
    """

    __slots__ = (
        "input",
        "mask",
        "output_left",
        "state_left",
        "y_shape",
        "yt_shape",
        "ut_shape",
        "xt_shape",
    )

    def __init__(
        self,
        input_t: np.ndarray | None,
        mask_t: np.ndarray,
        output_left_t: np.ndarray,
        state_left_t: np.ndarray,
    ) -> None:
        self.input, self.mask = input_t, mask_t
        self.output_left, self.state_left = output_left_t, state_left_t
        self.y_shape = None if input_t is None else input_t.shape[:1]
        self.yt_shape, self.ut_shape = mask_t.shape[:1], output_left_t.shape[:1]
        self.xt_shape = state_left_t.shape[:1]

    @classmethod
    def of(
        cls, input_signal: Any, mask: Any, output_dec: Any, state_dec: Any
    ) -> "DenseUserSample | None":
        """The matrices of dense numpy float64 operators (``input_signal`` may be None: the
        encoder then takes the general path), or None where they do not apply."""
        parts = (mask, output_dec, state_dec)
        if not all(isinstance(p, DenseEncoder) and p._gemv for p in parts):
            return None
        matrices = [p.matrix_t for p in parts]
        if not all(m.dtype == np.float64 for m in matrices):
            return None
        signal = None
        if isinstance(input_signal, DenseEncoder) and input_signal._gemv:
            signal = input_signal.matrix_t if input_signal.matrix_t.dtype == np.float64 else None
        return cls(signal, *matrices)

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)


class StructuredEncoder:
    """``y -> Q[:, positions] y`` for a structured code."""

    def __init__(
        self,
        transform: OrthogonalTransform,
        positions: np.ndarray,
        backend: Any,
        scale: float = 1.0,
    ) -> None:
        self._transform = transform
        self._pos = backend.asarray(positions)
        self._backend = backend
        self._scale = scale

    def __call__(self, y: Any) -> Any:
        v = self._backend.zeros(tuple(y.shape[:-1]) + (self._transform.size,))
        v[..., self._pos] = y * self._scale if self._scale != 1.0 else y
        return self._transform.forward(v)


class StructuredNoisyEncoder:
    """``(y, s) -> Q [y at signal_pos; s at noise_pos]`` in one transform (seed 002 eq. 16)."""

    def __init__(
        self,
        transform: OrthogonalTransform,
        signal_pos: np.ndarray,
        noise_pos: np.ndarray,
        backend: Any,
        scale: float,
    ) -> None:
        self._transform = transform
        self._sig = backend.asarray(signal_pos)
        self._noise = backend.asarray(noise_pos)
        self._backend = backend
        self._scale = scale

    def __call__(self, y: Any, s: Any) -> Any:
        v = self._backend.zeros(tuple(y.shape[:-1]) + (self._transform.size,))
        v[..., self._sig] = y * self._scale
        v[..., self._noise] = s
        return self._transform.forward(v)


class StructuredDecoder:
    """``x -> (Q^T x)[positions]``: the left inverse of a structured code (exact: Q is
    orthogonal)."""

    def __init__(
        self,
        transform: OrthogonalTransform,
        positions: np.ndarray,
        backend: Any,
        scale: float = 1.0,
    ) -> None:
        self._transform = transform
        self._pos = backend.asarray(positions)
        self._backend = backend
        self._inv_scale = 1.0 / scale

    def __call__(self, x: Any) -> Any:
        out = self._backend.take(self._transform.adjoint(x), self._pos)
        return out * self._inv_scale if self._inv_scale != 1.0 else out


@dataclass(frozen=True, eq=False)
class DenseCode(ExplicitShape):
    """A code given by explicit ``Pi`` (n~ x n), ``Pi_left`` (n x n~) and ``N`` (n~ x m)."""

    pi: np.ndarray
    pi_left: np.ndarray
    noise_basis: np.ndarray

    kind = "dense"

    @property
    def nbytes(self) -> int:
        return self.pi.nbytes + self.pi_left.nbytes + self.noise_basis.nbytes

    @cached_property
    def _stats(self) -> RowStats:
        return dense_row_stats(self.pi, self.noise_basis)

    @cached_property
    def inverse_gain(self) -> float:
        """``max ||Pi_left^i||_2 * max ||Pi_j||_2`` (>= 1): how much decoding can amplify rounding.

        1 for drawn keys (orthonormal columns scaled by ``a`` and ``1/a``); large for a user's
        ill-conditioned ``Pi`` or a left inverse with huge entries.
        """
        return max(
            1.0,
            float(row_norms(self.pi_left).max(initial=0.0) * row_norms(self.pi.T).max(initial=0.0)),
        )

    def row_stats(self) -> RowStats:
        return self._stats

    def encoder(self, backend: Any) -> DenseEncoder:
        return DenseEncoder(self.pi, backend)

    def decoder(self, backend: Any) -> DenseDecoder:
        return DenseDecoder(self.pi_left, backend)

    def noisy_encoder(self, backend: Any) -> DenseNoisyEncoder:
        return DenseNoisyEncoder(self.pi, self.noise_basis, backend)


@dataclass(frozen=True, eq=False)
class StructuredCode(PositionedShape):
    """A code ``Pi = a Q[:, signal_pos]``, ``N = Q[:, noise_pos]``,
    ``Pi_left = Q[:, signal_pos]^T / a``.

    ``Q`` is block-structured orthogonal; ``a`` (``signal_scale``) is a random positive scalar, so
    that ``Pi_left`` is not simply ``Pi^T``.
    """

    mix: MixParams
    signal_pos: np.ndarray
    noise_pos: np.ndarray
    flat_pos: np.ndarray
    signal_scale: float = 1.0

    kind = "block"

    @property
    def nbytes(self) -> int:
        return (
            self.mix.nbytes + self.signal_pos.nbytes + self.noise_pos.nbytes + self.flat_pos.nbytes
        )

    def _columns(self, positions: np.ndarray, name: str) -> np.ndarray:
        entries = self.n_total * positions.shape[0]
        if entries > MAX_DENSE_ENTRIES:
            raise InvalidArgumentError(
                name,
                f"a dense view would have {entries:,} entries; block keys are meant to stay "
                "structured (use encode/decode, or keys.row_stats())",
            )
        from ..backends.numpy_backend import NumpyBackend

        eye = np.zeros((positions.shape[0], self.n_total))
        eye[np.arange(positions.shape[0]), positions] = 1.0
        return OrthogonalTransform(self.mix, NumpyBackend()).forward(eye).T

    def dense_pi(self) -> np.ndarray:
        return self._columns(self.signal_pos, "Pi") * self.signal_scale

    def dense_pi_left(self) -> np.ndarray:
        return self._columns(self.signal_pos, "Pi_left").T / self.signal_scale

    def dense_noise_basis(self) -> np.ndarray:
        return self._columns(self.noise_pos, "N")

    @cached_property
    def _stats(self) -> tuple[RowStats, np.ndarray]:
        stats, flat = structured_row_stats(self.mix, self.noise_pos, self.flat_pos)
        a = self.signal_scale
        return RowStats(
            stats.l1_signal * a, stats.l2_signal * a, stats.l2_noise, stats.linf_noise
        ), flat

    def row_stats(self) -> RowStats:
        return self._stats[0]

    #: ``Pi = a Q[:, signal]`` and ``Pi_left = Q[:, signal]^T / a``: decoding amplifies nothing.
    inverse_gain = 1.0

    def flat_entries(self) -> np.ndarray:
        """``|Q[i, flat column of row i's group]|`` for every row i."""
        return self._stats[1]

    def transform(self, backend: Any) -> OrthogonalTransform:
        """``Q`` on ``backend``: one object shared by every encoder and decoder of this code.

        While one transform built for this ``backend`` object is alive, later calls return it, so
        the user handle and a target in the same process hold one copy of the factors (a target
        pickled for another process carries its own). The code keeps only weak references.
        """
        shared = self.__dict__.get("_shared_transform")
        if shared is not None and shared[0]() is backend:
            transform: OrthogonalTransform | None = shared[1]()
            if transform is not None:
                return transform
        transform = OrthogonalTransform(self.mix, backend)
        try:
            refs = (weakref.ref(backend), weakref.ref(transform))
        except TypeError:  # a backend that takes no weak references: nothing is shared
            return transform
        object.__setattr__(self, "_shared_transform", refs)
        return transform

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the code without the (unpicklable, per-process) shared transform."""
        return {k: v for k, v in self.__dict__.items() if k != "_shared_transform"}

    def encoder(
        self, backend: Any, transform: OrthogonalTransform | None = None
    ) -> StructuredEncoder:
        return StructuredEncoder(
            transform or self.transform(backend), self.signal_pos, backend, self.signal_scale
        )

    def decoder(
        self, backend: Any, transform: OrthogonalTransform | None = None
    ) -> StructuredDecoder:
        return StructuredDecoder(
            transform or self.transform(backend), self.signal_pos, backend, self.signal_scale
        )

    def noisy_encoder(
        self, backend: Any, transform: OrthogonalTransform | None = None
    ) -> StructuredNoisyEncoder:
        return StructuredNoisyEncoder(
            transform or self.transform(backend),
            self.signal_pos,
            self.noise_pos,
            backend,
            self.signal_scale,
        )


Code = DenseCode | StructuredCode


def row_norms(m: np.ndarray) -> np.ndarray:
    """Row 2-norms of ``m`` without underflow (a mask scaled by 1e-170 squares to 0) or overflow."""
    scale = np.abs(m).max(axis=1, initial=0.0)
    safe = np.where(scale > 0, scale, 1.0)
    return scale * np.linalg.norm(m / safe[:, None], axis=1)


class DenseMaskOp(DenseEncoder):
    """``y~ -> Pi4 y~`` with an explicit matrix (same algebra as the encoder)."""


@dataclass(frozen=True, eq=False)
class DenseMask:
    """An explicit output mask ``Pi4`` (n~_u x n~_y), seed 002 eq. 17."""

    pi4: np.ndarray

    def dense(self, input_code: Code, output_code: Code) -> np.ndarray:
        return self.pi4

    def noise_row_norms(self, input_code: Code, output_code: Code) -> np.ndarray:
        """``||(Pi4 N1)^j||_2`` for every output element j."""
        return row_norms(self.pi4 @ input_code.dense_noise_basis())

    def noise_row_linf(self, input_code: Code, output_code: Code) -> np.ndarray:
        """``||(Pi4 N1)^j||_inf`` for every output element j."""
        return np.abs(self.pi4 @ input_code.dense_noise_basis()).max(axis=1)

    def data_row_l1(self, input_code: Code, output_code: Code) -> np.ndarray:
        """``||(Pi4 Pi1)^j||_1``: how much input data leaks into the mask of output element j."""
        return np.abs(self.pi4 @ input_code.dense_pi()).sum(axis=1)

    def operator(self, input_code: Code, output_code: Code, backend: Any) -> DenseMaskOp:
        return DenseMaskOp(self.pi4, backend)

    @property
    def nbytes(self) -> int:
        return self.pi4.nbytes


class StructuredMaskOp:
    """``y~ -> beta * Q_u scatter(flat_u, signs * (N1^T y~)[source])``."""

    def __init__(
        self,
        mask: "StructuredMask",
        input_code: StructuredCode,
        output_code: StructuredCode,
        backend: Any,
    ) -> None:
        self._pick = StructuredDecoder(
            input_code.transform(backend), input_code.noise_pos[mask.source], backend
        )
        self._place = StructuredEncoder(
            output_code.transform(backend), output_code.flat_pos, backend
        )
        self._weights = backend.asarray(mask.beta * mask.signs)

    def __call__(self, y_enc: Any) -> Any:
        return self._place(self._pick(y_enc) * self._weights)


@dataclass(frozen=True, eq=False)
class StructuredMask:
    """``Pi4 = beta * sum_g sign_g Q_u[:, flat_g] N1[:, source_g]^T`` for block keys.

    ``Pi4 Pi1 = 0`` (the mask carries noise only, no input data), and row j of ``Pi4 N1`` has a
    single non-zero entry ``beta * Q_u[j, flat_g(j)]``, so its norm is known exactly.
    """

    beta: float
    signs: np.ndarray  # (groups of the output code,)
    source: np.ndarray  # input noise coordinate feeding each output group

    def dense(self, input_code: StructuredCode, output_code: StructuredCode) -> np.ndarray:
        n_in = input_code.dense_noise_basis()[:, self.source] * (self.beta * self.signs)
        q_flat = output_code._columns(output_code.flat_pos, "Pi4")
        return q_flat @ n_in.T

    def noise_row_norms(
        self, input_code: StructuredCode, output_code: StructuredCode
    ) -> np.ndarray:
        return self.beta * output_code.flat_entries()

    def noise_row_linf(self, input_code: StructuredCode, output_code: StructuredCode) -> np.ndarray:
        """Equal to the 2-norm: each row of ``Pi4 N1`` has a single non-zero entry."""
        return self.noise_row_norms(input_code, output_code)

    def data_row_l1(self, input_code: StructuredCode, output_code: StructuredCode) -> np.ndarray:
        """Zero by construction: ``Pi4 Pi1 = N_u (...) N1^T Pi1 = 0``."""
        return np.zeros(output_code.n_total)

    def operator(
        self, input_code: StructuredCode, output_code: StructuredCode, backend: Any
    ) -> StructuredMaskOp:
        return StructuredMaskOp(self, input_code, output_code, backend)

    @property
    def nbytes(self) -> int:
        return self.signs.nbytes + self.source.nbytes
