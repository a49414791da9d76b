"""Fixed-point realisation of the history form, its bits budget, and the twin without encryption.

Integers everywhere after quantisation (Python ints: exact at any size):

* ``y_q = round(y 2^f_y)``; ``u_q`` at scale ``2^f_u``;
* coefficients ``round(theta_y[i] 2^(f_c + f_u - f_y))`` and ``round(theta_u[i] 2^f_c)``, side by
  side in one matrix ``M``: ``acc_k = M [y_q(k), u_q(k-1), window]`` at scale ``2^(f_c + f_u)``;
* ``u_q(k) = round((acc_k + init_q(k)) / 2^f_c)``, ``u_k = u_q(k) 2^-f_u``.

Under LWE the cloud computes ``L acc_k + e`` (``L = 2^l``, :data:`CHECK_BITS`); the user, who
drew every error, subtracts ``e`` with the mask, gets ``acc_k`` exactly and applies the same last
line, so the decoded ``u`` is bit-identical to :class:`FixedPointTwin`'s. The budget proves
``|L acc_k| < q / 2`` for all inputs and outputs within the declared ranges: no wrap-around (the
noise is subtracted before any reduction matters, so it needs no bits of ``q``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from .._validation import finite_array
from ..errors import ImmersionError, InvalidArgumentError
from .convert import HistoryForm
from .ring import round_shift

#: ``u`` converts to float64 exactly (``|u_q| < 2^52``); ``y_q`` stays below ``2^62``.
_FLOAT_BITS, _INT_BITS = 52, 62
#: ``log2 L`` of the LWE coding. Its decoder subtracts the noise exactly, so ``L`` is not sized
#: by the noise: ``L = 2^8`` makes a reply altered by other than a multiple of ``L`` fail the
#: check with probability ``1 - 2^-8`` and keeps single uplink ciphertexts (noise at most 19 <
#: ``L / 2``) decryptable with the key alone. Each bit costs about half a bit of precision.
CHECK_BITS = 8


class WrapAroundError(ImmersionError, ValueError):
    """A setting or a value could make a ciphertext wrap around the modulus (wrong decryption)."""


def quantize(values: Iterable[Any], bits: int) -> list[int]:
    """``floor(v 2^bits + 1/2)`` for each value, as Python ints (a power-of-two scaling is exact).

    Examples
    --------
    >>> quantize([0.3, -0.3, 2.5], 2)
    [1, -1, 10]
    """
    return [math.floor(math.ldexp(float(v), bits) + 0.5) for v in values]


@dataclass(frozen=True)
class FixedPointDesign:
    """Scales, the cloud's integer matrix and the proven bounds of one fixed-point controller.

    ``matrix`` rows: ``acc = M [y_k, u_(k-1), y_(k-1) .. y_(k-N), u_(k-2) .. u_(k-N)]``.
    """

    frac_input: int
    frac_output: int
    frac_gain: int
    matrix: tuple[tuple[int, ...], ...]
    initial: np.ndarray  # (N, n_u, n_x) floats: H F_R^k, quantised per x0 at encode_state
    input_max_q: tuple[int, ...]
    output_max_q: tuple[int, ...]
    acc_bound: int
    noise_gain: int  # max over rows of sum |M|: the output noise is at most noise_gain * B
    noise_bits: int  # l: plaintexts are scaled by L = 2^l > 2 noise_gain B
    window: int
    n_input: int
    n_output: int
    predicted_step_error: float

    @property
    def n_feedback(self) -> int:
        """Fed-back ``u`` entries per sample (0 for a static gain)."""
        return self.n_output if self.window else 0

    @property
    def n_window(self) -> int:
        """Elements of the cloud's state: ``N n_y + (N - 1) n_u``."""
        return self.window * self.n_input + max(self.window - 1, 0) * self.n_output

    def initial_terms(self, x0: np.ndarray) -> list[list[int]]:
        """``round(H F_R^k x0 2^(f_c + f_u))`` for ``k < N``; refuses an ``x0`` that alone
        would push ``u`` far outside ``output_range``."""
        bits = self.frac_gain + self.frac_output
        terms = [quantize(row, bits) for row in self.initial @ x0]
        limit = ((2 * max(self.output_max_q) + 1) << self.frac_gain) + self.acc_bound
        if any(abs(v) > limit for row in terms for v in row):
            raise WrapAroundError(
                "x0: its response H F_R^k x0 alone exceeds the declared output_range; declare "
                "a larger output_range or start closer to 0"
            )
        return terms

    def finish(self, acc: Sequence[int], initial: Sequence[int] | None) -> list[int]:
        """``u_q = round((acc + init) / 2^f_c)``, checked against ``output_range``."""
        if initial is not None:
            acc = [a + b for a, b in zip(acc, initial, strict=True)]
        u_q = [round_shift(a, self.frac_gain) for a in acc]
        for j, (v, bound) in enumerate(zip(u_q, self.output_max_q, strict=True)):
            if abs(v) > bound:
                raise WrapAroundError(
                    f"output_range: the controller's output u[{j}] = "
                    f"{math.ldexp(v, -self.frac_output):.6g} left the declared range "
                    f"+-{math.ldexp(bound, -self.frac_output):.6g}; fed back, it could wrap around "
                    "the modulus. Declare a larger output_range."
                )
        return u_q

    def to_float(self, u_q: Sequence[int]) -> np.ndarray:
        return np.array([math.ldexp(v, -self.frac_output) for v in u_q])

    def summary(self) -> dict[str, Any]:
        return {
            "frac_input": self.frac_input,
            "frac_output": self.frac_output,
            "frac_gain": self.frac_gain,
            "acc_bits": max(self.acc_bound, 1).bit_length(),
            "noise_gain": self.noise_gain,
            "noise_bits": self.noise_bits,
        }


def ranges(name: str, value: Any, size: int) -> np.ndarray:
    """A positive finite bound per component (a scalar applies to all), naming ``name``."""
    if value is None:
        raise InvalidArgumentError(
            name,
            "is required: the largest magnitude the signal can take (it sizes the fixed-point "
            "scales and proves that no ciphertext wraps around the modulus)",
        )
    try:
        arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (size,)).copy()
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            name, f"expected a positive number or {size} of them ({exc})"
        ) from None
    arr = finite_array(name, arr)
    if (arr <= 0).any():
        raise InvalidArgumentError(name, f"expected positive bounds on |value|, got {arr.tolist()}")
    return arr


def _exact(values: np.ndarray, bits: int) -> list[int]:
    return quantize(np.ravel(values), bits)


@dataclass(frozen=True)
class _Budget:
    frac: tuple[int, int, int]
    matrix: tuple[tuple[int, ...], ...]
    in_max: tuple[int, ...]
    out_max: tuple[int, ...]
    acc_bound: int
    noise_gain: int
    noise_bits: int
    total_bits: float


def _matrix(h: HistoryForm, frac: tuple[int, int, int]) -> tuple[tuple[int, ...], ...]:
    """``[Ty[0], Tu[1], Ty[1..N], Tu[2..N]]`` side by side, rounded to integers."""
    f_y, f_u, f_c = frac
    n_u = h.n_output
    ty = np.array(_exact(h.theta_y, f_c + f_u - f_y), dtype=object).reshape(h.theta_y.shape)
    tu = np.array(_exact(h.theta_u, f_c), dtype=object).reshape(h.theta_u.shape)
    blocks = [ty[0]]
    if h.window:
        blocks += [tu[0]] + [ty[i] for i in range(1, h.window + 1)]
        blocks += [tu[i] for i in range(1, h.window)]
    joined = np.concatenate(blocks, axis=1) if blocks else np.zeros((n_u, 0), dtype=object)
    return tuple(tuple(int(v) for v in row) for row in joined)


def _budget(
    h: HistoryForm,
    frac: tuple[int, int, int],
    in_range: np.ndarray,
    out_range: np.ndarray,
    error_bound: int,
    scale_bits: int | None = None,
) -> _Budget:
    """The integer matrix and proven bounds of ``frac``. ``scale_bits=None``: ``L`` above twice
    the output noise (a decoder that rounds the noise away); else ``L = 2^scale_bits`` and the
    noise is not in the budget (a decoder that subtracts it exactly)."""
    f_y, f_u, _ = frac
    matrix = _matrix(h, frac)
    in_max = tuple(quantize(in_range, f_y))
    out_max = tuple(math.floor(math.ldexp(float(v), f_u)) for v in out_range)
    entry_max = list(in_max) + (list(out_max) if h.window else [])
    entry_max += list(in_max) * h.window + list(out_max) * max(h.window - 1, 0)
    acc_bound = max(
        (sum(abs(c) * m for c, m in zip(row, entry_max, strict=True)) for row in matrix), default=0
    )
    noise_gain = max((sum(abs(c) for c in row) for row in matrix), default=0)
    if scale_bits is None:
        noise_bits = (noise_gain * error_bound).bit_length() + 1  # L / 2 > noise bound
        total = (acc_bound << noise_bits) + noise_gain * error_bound
    else:
        noise_bits, total = scale_bits, acc_bound << scale_bits
    return _Budget(
        frac, matrix, in_max, out_max, acc_bound, noise_gain, noise_bits, math.log2(max(total, 1))
    )


def _rounding(theta: np.ndarray, weights: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """``sum |round(theta 2^s) 2^-s - theta| * weight`` for each shift ``s`` (rows: outputs).

    ``theta``: ``(terms, n_out, n_in)``; ``weights``: ``(n_in,)``. Returns ``(len(s), n_out)``.
    """
    if theta.size == 0:
        return np.zeros((shifts.size, theta.shape[1]))
    exponent = shifts.astype(np.int64)[:, None, None, None]
    scaled = np.ldexp(theta[None], exponent)  # exact: a power-of-two scaling
    error = np.ldexp(np.abs(np.floor(scaled + 0.5) - scaled), -exponent)
    return (error * weights).sum(axis=(1, 3))


def _step_error(h: HistoryForm, frac: Any, in_range: np.ndarray, out_range: np.ndarray) -> Any:
    """A per-sample bound on ``|u_twin - u_float|`` from one step's roundings (history exact).

    Output rounding, input quantisation through ``theta_y``, and the actual rounding of each
    coefficient times the declared range of what it multiplies (worst output row). ``frac`` may
    hold broadcastable integer arrays (the search evaluates a grid at once).
    """
    f_y, f_u, f_c = (np.asarray(f, dtype=np.int64) for f in frac)
    abs_ty = float(np.abs(h.theta_y).sum(axis=(0, 2)).max())
    lo = -128
    shifts = np.arange(lo, 257)
    coef_y = _rounding(h.theta_y, in_range, shifts)  # (shifts, n_out)
    coef_u = _rounding(h.theta_u, out_range, shifts)
    total = coef_y[f_c + f_u - f_y - lo] + coef_u[f_c - lo]  # (..., n_out)
    return np.exp2(-(f_u + 1.0)) + abs_ty * np.exp2(-(f_y + 1.0)) + total.max(axis=-1)


def design(
    h: HistoryForm,
    *,
    input_range: np.ndarray,
    output_range: np.ndarray,
    modulus_bits: int,
    error_bound: int,
    fractional_bits: tuple[int, int, int] | None = None,
    scale_bits: int | None = None,
) -> FixedPointDesign:
    """Choose ``(f_y, f_u, f_c)`` (or check the user's) so that nothing can wrap modulo ``q``.

    Among the scalings whose proven bound stays below ``q / 2``, the one with the smallest
    per-sample rounding bound (:func:`_step_error`) is taken; ``f_y`` and ``f_u`` are capped so
    that ``y_q`` stays below ``2^62`` and ``u`` converts to float64 exactly. Raises
    :class:`WrapAroundError` when none fits (or the given one does not), with the bits needed.

    The bound is ``L acc_max + e_max`` with ``L > 2 e_max`` for a decoder that rounds the noise
    away (``scale_bits=None``; ``e_max = sum |M| error_bound``), and ``L acc_max`` with
    ``L = 2^scale_bits`` for one that subtracts the noise exactly (the LWE handle: it drew every
    error), where the noise needs no bits of the modulus at all.
    """
    limit = modulus_bits - 1
    caps = (_INT_BITS - _bits(input_range), _FLOAT_BITS - _bits(output_range))
    if fractional_bits is not None:
        frac = _checked_bits(fractional_bits, caps)
    else:
        frac = _search(h, input_range, output_range, modulus_bits, error_bound, caps, scale_bits)
    chosen = _budget(h, frac, input_range, output_range, error_bound, scale_bits)
    while fractional_bits is None and chosen.total_bits >= limit and frac[2] > 0:
        frac = (frac[0], frac[1], frac[2] - 1)  # the search's float estimate was a hair optimistic
        chosen = _budget(h, frac, input_range, output_range, error_bound, scale_bits)
    if chosen.total_bits >= limit:
        what = (
            f"fractional_bits={frac}" if fractional_bits is not None else "no fixed-point scaling"
        )
        raise WrapAroundError(
            f"{what}: the ciphertexts could wrap around q = 2^{modulus_bits}: the scale L needs "
            f"{chosen.noise_bits} bits and the largest accumulator "
            f"{max(chosen.acc_bound, 1).bit_length()} bits, {chosen.total_bits:.1f} in all "
            f"> {limit}; use fewer fractional bits, smaller input_range/output_range, or a "
            "larger modulus_bits (up to 128)"
        )
    return FixedPointDesign(
        frac_input=frac[0],
        frac_output=frac[1],
        frac_gain=frac[2],
        matrix=chosen.matrix,
        initial=h.initial,
        input_max_q=chosen.in_max,
        output_max_q=chosen.out_max,
        acc_bound=chosen.acc_bound,
        noise_gain=chosen.noise_gain,
        noise_bits=chosen.noise_bits,
        window=h.window,
        n_input=h.n_input,
        n_output=h.n_output,
        predicted_step_error=float(_step_error(h, frac, input_range, output_range)),
    )


def _bits(bounds: np.ndarray) -> int:
    """Integer bits of the largest bound: ``ceil(log2 max)``, at least 0."""
    return max(math.ceil(math.log2(float(bounds.max()))), 0)


def _checked_bits(value: Any, caps: tuple[int, int]) -> tuple[int, int, int]:
    ok = (
        isinstance(value, (tuple, list))
        and len(value) == 3
        and all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in value)
    )
    if not ok or not all(0 <= int(b) <= 120 for b in value):
        raise InvalidArgumentError(
            "fractional_bits", f"expected three integers (f_y, f_u, f_c) in [0, 120], got {value!r}"
        )
    f_y, f_u, f_c = (int(b) for b in value)
    if f_y > caps[0] or f_u > caps[1]:
        raise InvalidArgumentError(
            "fractional_bits",
            f"f_y <= {caps[0]} (y_q below 2^62) and f_u <= {caps[1]} (u exact in float64) for "
            f"these ranges; got ({f_y}, {f_u}, {f_c})",
        )
    return f_y, f_u, f_c


def _search(
    h: HistoryForm,
    input_range: np.ndarray,
    output_range: np.ndarray,
    modulus_bits: int,
    error_bound: int,
    caps: tuple[int, int],
    scale_bits: int | None = None,
) -> tuple[int, int, int]:
    """The grid point with the smallest step error among those a conservative float bound admits."""
    top = modulus_bits - 1
    f_y = np.arange(0, max(caps[0], 0) + 1, dtype=np.float64)[:, None, None, None]
    f_u = np.arange(0, max(caps[1], 0) + 1, dtype=np.float64)[None, :, None, None]
    f_c = np.arange(0, top + 1, dtype=np.float64)[None, None, :, None]
    ty, tu = np.abs(h.theta_y), np.abs(h.theta_u)  # last axis of the grid: output rows
    s_y = np.exp2(f_c + f_u - f_y)
    n_ty, n_tu = (h.window + 1) * h.n_input, h.window * h.n_output
    noise = ty.sum(axis=(0, 2)) * s_y + n_ty / 2 + tu.sum(axis=(0, 2)) * np.exp2(f_c) + n_tu / 2
    y_max, u_max = float(input_range.max()), float(output_range.max())
    acc = (
        (ty * input_range).sum(axis=(0, 2)) * s_y * np.exp2(f_y)
        + ty.sum(axis=(0, 2)) * s_y * 0.5
        + n_ty / 2 * (y_max * np.exp2(f_y) + 0.5)
        + (tu * output_range).sum(axis=(0, 2)) * np.exp2(f_c + f_u)
        + n_tu / 2 * u_max * np.exp2(f_u)
    )
    if scale_bits is None:
        noise_bits = np.floor(np.log2(np.maximum(noise.max(axis=-1) * error_bound, 1))) + 2
        total = np.log2(acc.max(axis=-1) * np.exp2(noise_bits) + noise.max(axis=-1) * error_bound)
    else:
        total = np.log2(np.maximum(acc.max(axis=-1), 1)) + scale_bits
    feasible = total < top - 0.01
    if not feasible.any():
        return (0, 0, 0)  # design() reports what the smallest scaling needs
    grid = (
        f_y[..., 0].astype(np.int64),
        f_u[..., 0].astype(np.int64),
        f_c[..., 0].astype(np.int64),
    )
    err = np.where(feasible, _step_error(h, grid, input_range, output_range), np.inf)
    i, j, k = np.unravel_index(int(np.argmin(err)), err.shape)
    return int(i), int(j), int(k)


def shift_window(
    window: np.ndarray | list[int],
    fresh: np.ndarray | list[int],
    n_input: int,
    n_output: int,
    length: int,
    width: int = 1,
) -> Any:
    """The cloud's state update, a 0/1 shift: push ``y_k`` and ``u_(k-1)`` in, drop the oldest.

    ``window``: ``[y_(k-1) .. y_(k-N), u_(k-2) .. u_(k-N)]``; ``fresh``: ``[y_k, u_(k-1)]``; each
    element is ``width`` consecutive entries (the limbs of a wide ring element). Works on uint64
    word arrays (the cloud) and on lists of ints (the user's masks, the twin).
    """
    n_y, n_u, N = n_input * width, n_output * width, length
    if N == 0:
        return window
    if N == 1:
        return fresh[:n_y].copy() if isinstance(fresh, np.ndarray) else list(fresh[:n_y])
    ys, us = window[: N * n_y], window[N * n_y :]
    parts = [fresh[:n_y], ys[: (N - 1) * n_y], fresh[n_y : n_y + n_u], us[: (N - 2) * n_u]]
    if isinstance(window, np.ndarray):
        return np.concatenate(parts)
    return [v for part in parts for v in part]


class FixedPointTwin:
    """The controller in the same integer arithmetic as the encrypted one, without encryption.

    ``reset(x0)``, then ``output(y)`` once per sample (it also advances the history). Its ``u`` is
    bit-identical to the encrypted loop's decoded ``u`` for the same inputs.

    Parameters
    ----------
    fp:
        The fixed-point design (scales, integer matrix, bounds).
    """

    def __init__(self, fp: FixedPointDesign) -> None:
        self.design = fp
        self.reset(np.zeros(fp.initial.shape[2]))

    def reset(self, x0: Any) -> None:
        """Start again from controller state ``x0`` with an empty history.

        Parameters
        ----------
        x0:
            Initial controller state ``(n_state,)``.
        """
        fp = self.design
        x0 = finite_array("x0", x0, last_dim=fp.initial.shape[2], ndim=1)
        self._init = fp.initial_terms(x0)
        self._window = [0] * fp.n_window
        self._u_prev = [0] * fp.n_feedback
        self.step_index = 0

    def output(self, y: Any) -> np.ndarray:
        """``u_k`` for the measurement ``y_k``; advances the history.

        Parameters
        ----------
        y:
            The measurement ``(n_input,)``.

        Returns
        -------
        numpy.ndarray
            ``u_k`` (floats exactly representing the fixed-point integers).
        """
        fp = self.design
        y = finite_array("y", y, last_dim=fp.n_input, ndim=1)
        fresh = quantize(y, fp.frac_input) + self._u_prev
        vector = fresh + self._window
        acc = [sum(c * v for c, v in zip(row, vector, strict=True)) for row in fp.matrix]
        k = self.step_index
        u_q = fp.finish(acc, self._init[k] if k < fp.window else None)
        self._window = shift_window(self._window, fresh, fp.n_input, fp.n_output, fp.window)
        if fp.window:
            self._u_prev = u_q
        self.step_index += 1
        return fp.to_float(u_q)
