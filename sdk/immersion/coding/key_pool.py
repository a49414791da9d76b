"""Keys drawn ahead of time for key rotation: many periods of small dense keys in stacked arrays.

:class:`~immersion.coding.rotation.RotatingImmersion` draws fresh keys every ``rotate_keys_every``
samples. Drawing one set as :func:`~immersion.immerse` does (the structured machinery for one
block, then densified and validated, the noise designed, the precision checked) costs about a
millisecond, dozens of closed-loop samples of a small controller. For small dense keys on numpy
float64, :class:`DenseKeyPool` draws the keys of many periods at once, vectorised over the
periods: one stacked QR per code, the reflections, scales and masks, the noise design
(seed 002 Theorem 1, seed 000 Theorem 2 for Gaussian noise) and the precision estimate.

Each period's keys have the law of those ``Keys.draw(kind="dense")`` draws
(:func:`draw_dense_codes`) and the same design: the noise scale meets ``epsilon_input`` at the
worst element of ``y~`` and the mask scale ``epsilon_output`` at the worst element of ``u~``,
computed from that period's keys, and a period whose estimated decode error exceeds the
tolerance raises the :class:`~immersion.errors.PrecisionError` of :func:`~immersion.immerse`
when it is due. A period becomes a :class:`PooledImmersion` (an
:class:`~immersion.coding.handle.Immersion`) and a :class:`~immersion.coding.target.TargetAlgorithm`
built from views of the stacked arrays, without copies and without ``Keys.validate`` (the library
drew them; keys from files or from elsewhere are still validated where they enter). Its
:class:`~immersion.keys.Keys` object is built on first use (``keys``, ``report()``, the decode
bounds, a remote ``rekey``) from the same arrays, so every figure describes the keys in use.

The keys of the periods to come are in memory before their period starts, next to the current
ones (the same process, the same secrecy).
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np

from .. import validation as v
from ..errors import InvalidArgumentError
from ..keys import Keys, NoiseLaw
from ..keys.codes import DenseCode, DenseMask, DenseNoisyEncoder, DenseTargetSample, DenseUserSample
from ..keys.structured import _haar_orthogonal
from ..privacy.precision import ROUNDING_CONSTANT, TAIL, refuse_infeasible_precision
from ..privacy.theorems import gaussian_min_sigma_bar
from .factory import FloatDesign, Immersion
from .noise_blocks import NoiseBlocks, block_rows
from .target import TargetAlgorithm

_FLOAT64 = np.dtype(np.float64)
_ndarray = np.ndarray
_isfinite = math.isfinite
_SIGNS = np.array([-1.0, 1.0])

#: Periods the first refill draws; each later refill draws twice as many, up to ``MAX_PERIODS``.
FIRST_PERIODS, MAX_PERIODS = 16, 256
#: Float64 entries of key matrices one refill may hold (bounds the memory drawn ahead).
POOL_ENTRIES = 1 << 20
#: A period whose vectorised precision estimate comes this close to the tolerance is checked
#: again by :func:`~immersion.privacy.precision.refuse_infeasible_precision` on its keys.
_CHECK_MARGIN = 1e-9


def draw_dense_codes(
    rng: np.random.Generator, count: int, n: int, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` dense codes ``(Pi, Pi_left, N)`` with ``n`` signal and ``m`` noise entries.

    The law of the codes :func:`~immersion.keys.keys.draw_structured_code` makes with a single
    block (what ``Keys.draw(kind="dense")`` densifies), stacked: ``Q = H B`` with ``B``
    Haar-random orthogonal (one stacked QR) and ``H`` the Householder reflection mapping the
    first column of ``B`` to a flat vector of random signs ``+-1/sqrt(n + m)`` (so every row of
    ``N`` has an entry of that size); ``N`` is the first ``m`` columns of ``Q``, ``Pi = a Q[:, m:]``
    and ``Pi_left = Q[:, m:]^T / a`` with ``a`` log-uniform in ``[1/2, 2]``. The structured code
    also permutes the rows of ``Q`` and picks the positions of the noise columns at random: for
    a Haar-random ``B`` (whose law no permutation changes) these leave the law of ``(Pi, N)`` as
    it is, so they are not drawn here.

    Parameters
    ----------
    rng : numpy.random.Generator
        The key stream.
    count : int
        Codes to draw.
    n, m : int
        Signal and noise entries of each code.

    Returns
    -------
    tuple of np.ndarray
        Shapes ``(count, n + m, n)``, ``(count, n, n + m)`` and ``(count, n + m, m)``.

    Examples
    --------
    >>> pi, pi_left, noise = draw_dense_codes(np.random.default_rng(0), 5, 2, 3)
    >>> bool(np.allclose(pi_left @ pi, np.eye(2)) and np.allclose(pi_left @ noise, 0.0))
    True
    >>> bool(np.allclose(np.abs(noise[..., 0]), 1 / np.sqrt(5)))
    True
    """
    size = n + m
    blocks = _haar_orthogonal(rng, count, size)
    signs = rng.choice(_SIGNS, size=(count, size))
    diff = blocks[:, :, 0] - signs / math.sqrt(size)
    norm = np.sqrt((diff * diff).sum(axis=1, keepdims=True))
    h = np.divide(diff, norm, out=np.zeros_like(diff), where=norm > 1e-12)
    q = blocks - (2.0 * h[:, :, None]) * (h[:, :, None] * blocks).sum(axis=1)[:, None, :]
    scale = np.exp(rng.uniform(math.log(0.5), math.log(2.0), count))[:, None, None]
    q_signal = q[:, :, m:]
    return q_signal * scale, q_signal.transpose(0, 2, 1) / scale, q[:, :, :m]


def _norms(m: np.ndarray) -> np.ndarray:
    """Row 2-norms of stacked matrices (``np.linalg.norm(m, axis=-1)``, as the key statistics)."""
    return np.sqrt((m * m).sum(axis=-1))


def row_norms(m: np.ndarray) -> np.ndarray:
    """:func:`immersion.keys.codes.row_norms` of stacked matrices (no underflow or overflow)."""
    scale = np.abs(m).max(axis=-1, initial=0.0)
    safe = np.where(scale > 0, scale, 1.0)
    return scale * _norms(m / safe[..., None])


def _scale_needed(
    sensitivity: np.ndarray, noise_l2: np.ndarray, noise: str, epsilon: float, delta: Any
) -> np.ndarray:
    """Per period, the noise scale meeting ``epsilon`` at the worst element (``design_noise``)."""
    if noise == "laplace":
        return np.max(sensitivity / (noise_l2 * epsilon), axis=-1)
    return np.max(gaussian_min_sigma_bar(sensitivity, epsilon, delta) / noise_l2, axis=-1)


def _t(stacked: np.ndarray) -> np.ndarray:
    """The transposes of stacked matrices, C-contiguous (what a ``gemv`` reads)."""
    return np.ascontiguousarray(stacked.transpose(0, 2, 1))


class _Batch:
    """The keys of ``count`` periods in stacked arrays, with their noise design and checks."""

    def __init__(self, design: FloatDesign, rng: np.random.Generator, count: int) -> None:
        dims, t = design.dims, design.targets
        self.design, self.count = design, count
        self.sizes = (dims["n_state"], dims["n_input"], dims["n_output"])
        pi1, pi1_left, n1 = draw_dense_codes(rng, count, dims["n_input"], dims["extra_input"])
        pi2, pi2_left, n2 = draw_dense_codes(rng, count, dims["n_state"], dims["extra_state"])
        pi3, pi3_left, n3 = draw_dense_codes(rng, count, dims["n_output"], dims["extra_output"])
        signs = rng.choice(_SIGNS, size=count)
        # the generated mask Pi4 = sign (flat column of N3)(flat column of N1)^T: noise only
        unit_mask = n3[:, :, :1] * (n1[:, :, 0] * signs[:, None])[:, None, :]
        self.codes = ((pi1, pi1_left, n1), (pi2, pi2_left, n2), (pi3, pi3_left, n3))
        self.unit_mask = unit_mask

        # the noise design of design_noise, period by period
        laplace = t.noise == "laplace"
        l1_in = np.abs(pi1).sum(axis=-1)
        rows_in = l1_in if laplace else _norms(pi1)
        rows_out = np.abs(pi3).sum(axis=-1) if laplace else _norms(pi3)
        l2_in = _norms(n1)
        l2_out = row_norms(unit_mask @ n1)
        data_out = np.abs(unit_mask @ pi1).sum(axis=-1)
        sigma = _scale_needed(
            rows_in * t.sensitivity_input, l2_in, t.noise, t.epsilon_input, t.delta_input
        )
        needed = _scale_needed(
            rows_out * t.sensitivity_output + data_out * t.sensitivity_input,
            l2_out,
            t.noise,
            t.epsilon_output,
            t.delta_output,
        )
        with np.errstate(all="ignore"):  # out-of-range designs are refused below, named
            mask_scale = needed / sigma
            in_range = np.ones(count, dtype=bool)
            for value in (sigma, needed, mask_scale):
                in_range &= np.isfinite(value) & (value > 1e-300) & (value < 1e300)
        mask_scale = np.where(in_range, mask_scale, 1.0)
        self.sigma, self.mask = sigma, unit_mask * mask_scale[:, None, None]

        # the precision estimate of predict_decode_error, period by period
        u = design.backend.unit_roundoff
        std = (math.sqrt(2.0) if laplace else 1.0) * sigma[:, None]
        spread = abs(t.noise_mean) * math.sqrt(dims["extra_input"]) + TAIL * std
        m_in = np.max(l2_in * spread, axis=-1) + 1.0
        m_out = np.max(l2_out * mask_scale[:, None] * spread, axis=-1) + 1.0
        n_y, n_u = pi1.shape[1], pi3.shape[1]
        mask_rows = _norms(unit_mask).max(axis=-1) * mask_scale
        rounding = mask_rows * u * math.sqrt(n_y) * (m_in + l1_in.max(axis=-1))

        def inverse_gain(pi: np.ndarray, pi_left: np.ndarray) -> np.ndarray:
            gain = _norms(pi_left).max(axis=-1) * _norms(pi.transpose(0, 2, 1)).max(axis=-1)
            return np.maximum(1.0, gain)

        estimate = (
            ROUNDING_CONSTANT
            * u
            * (
                math.sqrt(n_y) * m_in * max(1.0, design.input_gain) * inverse_gain(pi1, pi1_left)
                + math.sqrt(n_u) * (m_out + rounding) * inverse_gain(pi3, pi3_left)
            )
        )
        tolerance = design.tolerance
        close = (
            np.zeros(count, dtype=bool)
            if tolerance is None
            else estimate > tolerance * (1.0 - _CHECK_MARGIN)
        )
        #: periods that the checks of ``immerse`` must see on their keys before they are used
        self.recheck: list[bool] = (close | ~in_range).tolist()
        self.in_range: list[bool] = in_range.tolist()

        # the transposed matrices of the short paths, C-contiguous
        mean = t.noise_mean
        self.state_left_t, self.input_left_t = _t(pi2_left), _t(pi1_left)
        self.state_t, self.output_t, self.mask_t = _t(pi2), _t(pi3), _t(self.mask)
        self.input_t, self.output_left_t = _t(pi1), _t(pi3_left)
        self.noise_t = _t(n1 * sigma[:, None, None])
        self.offset = None if mean == 0.0 else mean * n1.sum(axis=-1)
        self.report_args = dict(
            unit_roundoff=u, dtype=design.backend.dtype_name, input_gain=design.input_gain
        )
        self.law_args = t.design_kwargs()

    def keys(self, i: int) -> Keys:
        """Period ``i``'s keys with their noise law (views of the stacked arrays)."""
        law = self.law_args
        noise = NoiseLaw(
            law["noise"],
            float(self.sigma[i]),
            law["noise_mean"],
            law["sensitivity_input"],
            law["sensitivity_output"],
            law["delta_input"] or 0.0,
            law["delta_output"] or 0.0,
        )
        return Keys(*self._codes(i), DenseMask(self.mask[i]), noise, True)

    def _codes(self, i: int) -> list[DenseCode]:
        return [DenseCode(pi[i], pi_left[i], n[i]) for pi, pi_left, n in self.codes]

    def check(self, i: int) -> None:
        """What ``immerse`` refuses, on period ``i``'s keys: a noise scale outside float64
        (:class:`~immersion.errors.InvalidArgumentError` naming the epsilon) or an estimated
        decode error above the tolerance (:class:`~immersion.errors.PrecisionError`)."""
        design = self.design
        unit = Keys(*self._codes(i), DenseMask(self.unit_mask[i]))
        keys = design.targets.apply(unit)  # raises where the design is out of range
        if not self.in_range[i]:  # at the edge of float64, where the two evaluations differ
            raise InvalidArgumentError(
                "epsilon_input",
                "is outside the range whose noise scale is representable in float64",
            )
        if design.tolerance is not None:
            refuse_infeasible_precision(
                keys, design.backend, design.tolerance, design.targets, design.input_gain
            )


class _ScaledNoise:
    """``s = mean + scale z`` from a shared stream of standard ``z`` (the general path's noise)."""

    def __init__(self, standard: NoiseBlocks, scale: float, mean: float) -> None:
        self._standard, self._scale, self._mean = standard, scale, mean

    def take(self, lead: tuple[int, ...]) -> Any:
        return self._standard.take(lead) * self._scale + self._mean


class PooledImmersion(Immersion):
    """The user handle of one key period drawn by a :class:`DenseKeyPool`.

    An :class:`~immersion.coding.handle.Immersion` whose keys, operators and noise source are built
    on first use; one sample takes the dense short paths (``encode_input``: ``Pi1 y + N1 s`` with
    ``s`` from the pool's stream of standard noise, scaled by this period's noise scale).
    """

    _report = None
    _bounds = None
    _signal_enc = None

    def __init__(
        self, batch: _Batch, index: int, target: TargetAlgorithm, standard: NoiseBlocks
    ) -> None:
        self._batch, self._index, self._standard = batch, index, standard
        self._design, self.target, self.backend = batch.design, target, batch.design.backend
        self.n_state, self.n_input, self.n_output = batch.sizes
        self._dense_user = DenseUserSample(
            None, batch.mask_t[index], batch.output_left_t[index], batch.state_left_t[index]
        )
        self._signal_t, self._noise_t = batch.input_t[index], batch.noise_t[index]
        self._offset = None if batch.offset is None else batch.offset[index]
        self._report_args = batch.report_args

    @cached_property
    def keys(self) -> Keys:  # type: ignore[override]
        """This period's keys (built from the pool's arrays on first use)."""
        return self._batch.keys(self._index)

    @cached_property
    def _input_enc(self) -> DenseNoisyEncoder:  # type: ignore[override]
        return self.keys.input_code.noisy_encoder(self.backend)  # type: ignore[return-value]

    @cached_property
    def _state_enc(self) -> Any:  # type: ignore[override]
        return self.keys.state_code.encoder(self.backend)

    @cached_property
    def _state_dec(self) -> Any:  # type: ignore[override]
        return self.keys.state_code.decoder(self.backend)

    @cached_property
    def _output_dec(self) -> Any:  # type: ignore[override]
        return self.keys.output_code.decoder(self.backend)

    @cached_property
    def _mask(self) -> Any:
        keys = self.keys
        return keys.mask.operator(keys.input_code, keys.output_code, self.backend)

    @cached_property
    def _noise_blocks(self) -> Any:  # type: ignore[override]
        law = self.keys.noise
        assert law is not None
        return _ScaledNoise(self._standard, law.scale, law.mean)

    def encode_input(self, y: Any) -> Any:
        """``y~ = Pi1 y + N1 s`` with fresh noise ``s`` on every call (eq. 16); ``y`` may be
        batched."""
        if (
            type(y) is _ndarray
            and y.dtype is _FLOAT64
            and y.shape == self._signal_t.shape[:1]
            and _isfinite(sum(y.tolist()))
        ):
            encoded = y.dot(self._signal_t) + self._standard.next().dot(self._noise_t)
            if self._offset is not None:
                encoded += self._offset
            if _isfinite(sum(encoded.tolist())):
                return encoded
            return v.finite_result(self.backend, "y", encoded, "encoding it")
        return super().encode_input(y)


class DenseKeyPool:
    """Key periods of one design drawn ahead of time (small dense keys, numpy float64).

    Parameters
    ----------
    design : FloatDesign
        What :func:`~immersion.immerse` checked for the first period (``f``, ``g``, backend,
        dimensions, noise targets, tolerance, input gain).
    rng : numpy.random.Generator
        The pool's stream; the keys and the encoding noise use two streams spawned from it.

    Examples
    --------
    >>> from immersion import immerse
    >>> imm = immerse(lambda x, y: 0.5 * x + y, lambda x, y: x, 1, 1, 1, keys="dense", rng=0)
    >>> pool = DenseKeyPool(imm._design, np.random.default_rng(1))
    >>> period = pool.take()
    >>> xt, yt = period.encode_state(np.ones(1)), period.encode_input(np.array([0.5]))
    >>> ut, xt_next = period.target.advance(xt, yt)
    >>> bool(abs(period.decode_output(ut, yt)[0] - 1.0) < 1e-9)
    True
    >>> round(period.report().epsilon_input / imm.report().epsilon_input, 9)
    1.0
    """

    def __init__(self, design: FloatDesign, rng: np.random.Generator) -> None:
        key_rng, noise_rng = rng.spawn(2)
        self._design, self._rng = design, key_rng
        draw = noise_rng.laplace if design.targets.noise == "laplace" else noise_rng.normal
        m = design.dims["extra_input"]
        self._standard = NoiseBlocks(lambda shape: draw(0.0, 1.0, shape), m, rows=block_rows(m))
        sizes = [
            design.dims[n] + design.dims["extra" + n[1:]]
            for n in ("n_state", "n_input", "n_output")
        ]
        per_period = 3 * sum(s * s for s in sizes) + sizes[1] * sizes[2]
        self._most = max(1, min(MAX_PERIODS, POOL_ENTRIES // per_period))
        self._count = min(FIRST_PERIODS, self._most)
        self._batch: _Batch | None = None
        self._next = 0

    def take(self) -> PooledImmersion:
        """The next period's handle (its ``target`` is the cloud side)."""
        batch, i = self._batch, self._next
        if batch is None or i == batch.count:
            batch, i = self._refill(), 0
        self._next = i + 1
        if batch.recheck[i]:
            batch.check(i)
        design = self._design
        target = TargetAlgorithm.from_dense(
            f=design.f,
            g=design.g,
            backend=design.backend,
            dense=DenseTargetSample(
                batch.state_left_t[i],
                batch.input_left_t[i],
                batch.state_t[i],
                batch.output_t[i],
                batch.mask_t[i],
            ),
        )
        return PooledImmersion(batch, i, target, self._standard)

    def _refill(self) -> _Batch:
        self._batch = _Batch(self._design, self._rng, self._count)
        self._count = min(2 * self._count, self._most)
        return self._batch
