"""Rigorous a posteriori bounds on the rounding error of each decode (seed 002 eq. 18).

What is bounded: for the encoded vectors a decode actually received, the difference between the
decoded value computed in floating point and the exact (real-arithmetic) decode of the same
vectors with the same stored keys:

* ``decode_output``: ``|fl(Pi3_left (u~ - Pi4 y~)) - Pi3_left (u~ - Pi4 y~)|``;
* ``decode_state``: ``|fl(Pi2_left x~) - Pi2_left x~|``.

The bound is elementwise and holds in every run (no model, no calibration). It is the standard
forward error bound of floating-point products (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Lemma 3.1 and eq. 3.5): every decode is a composition of linear stages
(dense products, or the permutation, Householder reflections and orthogonal blocks of a
structured code), so the computed result is a sum of monomials in the inputs, each carrying at
most ``D`` rounding factors ``(1 + delta)``, ``|delta| <= u``, where ``D`` is the number of
roundings on the longest path (a length-``k`` dot product contributes ``k``). Hence

    ``|fl(L v) - L v| <= gamma_D |L|_abs |v|``,   ``gamma_D = D u / (1 - D u)``,

where ``|L|_abs |v|`` is the same composition run with the absolute value of every factor on
``|v|`` (for a dense key: ``|Pi_left| |v|``). :class:`DecodeBounds` evaluates it in floating
point too, so the result is inflated by ``(1 + gamma_D)(1 + 4u)`` to cover that evaluation's own
rounding. Cost: one more pass of the decode on absolute values.

The exact decode is taken with the float64 keys the user holds: on a float32 backend the keys'
own rounding to float32 is inside the bound (one more rounding per key factor).

Assumptions: IEEE arithmetic with round-to-nearest in the backend's dtype (numpy, torch on the
CPU; not TF32 or other reduced-precision matrix units); no underflow on the way, beyond a
``D n 2^-1074`` allowance added to the bound; ``D u < 1/2`` (refused otherwise).

Not bounded here (and not a decode's rounding): the error the cloud's own decoding of ``y~`` and
``x~`` makes, amplified by ``f`` and ``g``, and what a closed loop carries forward in its state.
Report those as measured drift against a plain twin (``immersion demo reactor``). The
probe-point prediction of :mod:`immersion.privacy.precision` is an estimate
(``decode_error_estimate``), not a bound.

Examples
--------
>>> import numpy as np
>>> from immersion import immerse
>>> imm = immerse(lambda x, y: 0.5 * x + y, lambda x, y: 2.0 * x + y, n_state=1, n_input=1,
...               n_output=1, rng=0)
>>> xt, yt = imm.encode_state(np.array([1.0])), imm.encode_input(np.array([0.25]))
>>> ut = imm.target.output(xt, yt)
>>> decoded = imm.decode_output_with_bound(ut, yt)
>>> bool((decoded.value == imm.decode_output(ut, yt)).all())
True
>>> errors = exact_decode_output_errors(imm.keys, ut, yt, decoded.value)
>>> bool((errors <= decoded.error_bound).all()), bool((decoded.error_bound < 1e-9).all())
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Callable, NamedTuple

import numpy as np

from ..errors import InvalidArgumentError
from ..keys.codes import DenseCode, DenseMask, StructuredCode, StructuredMask
from ..keys.structured import MixParams, OrthogonalTransform

#: Smallest positive subnormal float64: the underflow allowance per rounding.
_ETA = 2.0**-1074


class Decoded(NamedTuple):
    """A decoded value with its rigorous elementwise rounding-error bound.

    Parameters
    ----------
    value : array
        What ``decode_output`` / ``decode_state`` return.
    error_bound : array
        Same shape: ``|value - exact decode of the same encoded vectors|`` is at most this.
    """

    value: Any
    error_bound: Any


def gamma(n_roundings: int, unit_roundoff: float) -> float:
    """``gamma_n = n u / (1 - n u)`` (Higham Lemma 3.1), refused when ``n u >= 1/2``.

    Parameters
    ----------
    n_roundings : int
        Roundings on the longest path of the computation.
    unit_roundoff : float
        ``u`` of the dtype (``2^-53`` for float64).

    Returns
    -------
    float
        ``gamma_n``.

    Examples
    --------
    >>> gamma(10, 2.0**-53) > 10 * 2.0**-53
    True
    """
    nu = n_roundings * unit_roundoff
    if not 0 <= nu < 0.5:
        raise InvalidArgumentError(
            "n_roundings", f"n u = {nu:.3g}: the rounding-error bound needs n u < 1/2"
        )
    return nu / (1.0 - nu)


def _factor(depth: int, unit_roundoff: float) -> float:
    """``gamma_D (1 + gamma_D)(1 + 4u)``: covers the bound's own floating-point evaluation."""
    g = gamma(depth, unit_roundoff)
    return g * (1.0 + g) * (1.0 + 4.0 * unit_roundoff)


AbsOp = Callable[[Any], Any]


def _conversion(backend: Any) -> int:
    """1 if the backend rounds the float64 keys to a narrower dtype (each key factor then
    carries one more rounding), else 0."""
    return 0 if backend.dtype_name == "float64" else 1


class _AbsTransform(OrthogonalTransform):
    """``|Q|_abs`` of a structured ``Q = P^T H B`` on absolute values (forward and adjoint).

    The same passes as :class:`~immersion.keys.structured.OrthogonalTransform` with ``|B|`` and
    ``|h|``, the reflection ``w - 2 h (h^T w)`` becoming ``w + 2 |h| (|h|^T w)``. Depth of one
    pass: ``b`` (a block row) + ``G + 2`` (a reflection over a group of ``G``).
    """

    def __init__(self, params: MixParams, backend: Any) -> None:
        absolute = dataclasses.replace(
            params,
            blocks=np.abs(params.blocks),
            tail=np.abs(params.tail),
            householder=np.abs(params.householder),
        )
        super().__init__(absolute, backend)
        block = params.blocks.shape[-1] if params.blocks.shape[0] else 0
        group = int(np.bincount(params.group_ids).max())
        # keys rounded to a narrower dtype: one more factor per block entry and two per h
        self.depth = max(block, params.tail.shape[0]) + group + 2 + 3 * _conversion(backend)

    def _reflect(self, w: Any) -> Any:
        be = self._backend
        sums = be.segment_sum(self._h * w, self._gid, self._n_groups)
        return w + 2.0 * self._h * be.take(sums, self._gid)


def _abs_decoder(code: Any, backend: Any) -> tuple[AbsOp, int]:
    """``|Pi_left|_abs`` as an operator on absolute values, and its depth."""
    if isinstance(code, DenseCode):
        left_t = backend.asarray(np.ascontiguousarray(np.abs(code.pi_left).T))
        return (lambda x: x @ left_t), code.n_total + _conversion(backend)
    if isinstance(code, StructuredCode):
        transform = _AbsTransform(code.mix, backend)
        pos = backend.asarray(code.signal_pos)
        inv_scale = abs(1.0 / code.signal_scale)

        def decode(x: Any) -> Any:
            return backend.take(transform.adjoint(x), pos) * inv_scale

        return decode, transform.depth + 1 + _conversion(backend)
    raise InvalidArgumentError("keys", f"no decode bound for codes of type {type(code).__name__}")


def _abs_mask(mask: Any, input_code: Any, output_code: Any, backend: Any) -> tuple[AbsOp, int]:
    """``|Pi4|_abs`` as an operator on absolute values, and its depth."""
    if isinstance(mask, DenseMask):
        pi4_t = backend.asarray(np.ascontiguousarray(np.abs(mask.pi4).T))
        return (lambda y: y @ pi4_t), input_code.n_total + _conversion(backend)
    if isinstance(mask, StructuredMask):
        pick_t = _AbsTransform(input_code.mix, backend)
        place_t = _AbsTransform(output_code.mix, backend)
        pick_pos = backend.asarray(input_code.noise_pos[mask.source])
        place_pos = backend.asarray(output_code.flat_pos)
        weights = backend.asarray(np.abs(mask.beta * mask.signs))
        n_out = output_code.n_total

        def apply(y: Any) -> Any:
            picked = backend.take(pick_t.adjoint(y), pick_pos) * weights
            v = backend.zeros(tuple(picked.shape[:-1]) + (n_out,))
            v[..., place_pos] = picked
            return place_t.forward(v)

        return apply, pick_t.depth + 1 + place_t.depth + _conversion(backend)
    raise InvalidArgumentError("keys", f"no decode bound for masks of type {type(mask).__name__}")


class DecodeBounds:
    """Rigorous elementwise bounds on the rounding error of ``decode_output`` and ``decode_state``.

    Parameters
    ----------
    keys : Keys
        The float keys the decodes use.
    backend : ArrayBackend
        The backend (and dtype) the decodes run on.

    Examples
    --------
    >>> from immersion import draw_keys
    >>> from immersion.backends import make_backend
    >>> keys = draw_keys(n_state=2, n_input=1, n_output=1, rng=0)
    >>> bounds = DecodeBounds(keys, make_backend("numpy"))
    >>> bounds.depth_output > bounds.depth_state > 0
    True
    """

    def __init__(self, keys: Any, backend: Any) -> None:
        self._u = float(backend.unit_roundoff)
        self._state, self.depth_state = _abs_decoder(keys.state_code, backend)
        self._output, depth_dec = _abs_decoder(keys.output_code, backend)
        self._mask, depth_mask = _abs_mask(keys.mask, keys.input_code, keys.output_code, backend)
        self.depth_output = depth_mask + 1 + depth_dec
        self._factor_state = _factor(self.depth_state, self._u)
        self._factor_output = _factor(self.depth_output, self._u)
        n_state, n_out = keys.state_code.n_total, keys.output_code.n_total + keys.input_code.n_total
        self._floor_state = self.depth_state * n_state * _ETA
        self._floor_output = self.depth_output * n_out * _ETA

    def state(self, encoded_state: Any) -> Any:
        """Bound for ``decode_state(encoded_state)`` (same shape as the decoded state).

        Parameters
        ----------
        encoded_state : array
            ``x~`` as the decode received it.

        Returns
        -------
        array
            ``gamma_D (1 + gamma_D)(1 + 4u) |Pi2_left|_abs |x~|`` plus the underflow allowance.
        """
        return self._state(abs(encoded_state)) * self._factor_state + self._floor_state

    def output(self, encoded_output: Any, encoded_input: Any) -> Any:
        """Bound for ``decode_output(encoded_output, encoded_input)``.

        Parameters
        ----------
        encoded_output : array
            ``u~`` as the cloud returned it.
        encoded_input : array
            The ``y~`` it was computed from.

        Returns
        -------
        array
            ``gamma_D (1 + gamma_D)(1 + 4u) |Pi3_left|_abs (|u~| + |Pi4|_abs |y~|)`` plus the
            underflow allowance.
        """
        inner = abs(encoded_output) + self._mask(abs(encoded_input))
        return self._output(inner) * self._factor_output + self._floor_output


# ---------------------------------------------------------------- exact reference (audits, tests)
def _fractions(values: Any) -> list[Fraction]:
    return [Fraction(float(v)) for v in np.asarray(values, dtype=np.float64).ravel()]


def _dense_apply(matrix: np.ndarray, x: list[Fraction]) -> list[Fraction]:
    return [
        sum((Fraction(float(a)) * b for a, b in zip(row, x, strict=True)), Fraction(0))
        for row in matrix
    ]


def _blocks_apply(params: MixParams, v: list[Fraction], *, transpose: bool) -> list[Fraction]:
    out: list[Fraction] = []
    b = params.blocks.shape[-1] if params.blocks.shape[0] else 0
    for k, block in enumerate(params.blocks):
        out += _dense_apply(block.T if transpose else block, v[k * b : (k + 1) * b])
    if params.tail.shape[0]:
        full = params.blocks.shape[0] * b
        out += _dense_apply(params.tail.T if transpose else params.tail, v[full:])
    return out


def _reflect_exact(params: MixParams, w: list[Fraction]) -> list[Fraction]:
    h = _fractions(params.householder)
    sums: dict[int, Fraction] = {}
    for i, g in enumerate(params.group_ids.tolist()):
        sums[g] = sums.get(g, Fraction(0)) + h[i] * w[i]
    return [w[i] - 2 * h[i] * sums[g] for i, g in enumerate(params.group_ids.tolist())]


def _forward_exact(params: MixParams, v: list[Fraction]) -> list[Fraction]:
    w = _reflect_exact(params, _blocks_apply(params, v, transpose=False))
    return [w[i] for i in params.row_perm.tolist()]


def _adjoint_exact(params: MixParams, x: list[Fraction]) -> list[Fraction]:
    inverse = np.argsort(params.row_perm).tolist()
    return _blocks_apply(params, _reflect_exact(params, [x[i] for i in inverse]), transpose=True)


def _decode_exact(code: Any, x: list[Fraction]) -> list[Fraction]:
    if isinstance(code, DenseCode):
        return _dense_apply(code.pi_left, x)
    inner = _adjoint_exact(code.mix, x)
    inv_scale = Fraction(1.0 / code.signal_scale) if code.signal_scale != 1.0 else Fraction(1)
    return [inner[p] * inv_scale for p in code.signal_pos.tolist()]


def _mask_exact(mask: Any, input_code: Any, output_code: Any, y: list[Fraction]) -> list[Fraction]:
    if isinstance(mask, DenseMask):
        return _dense_apply(mask.pi4, y)
    inner = _adjoint_exact(input_code.mix, y)
    weights = _fractions(mask.beta * mask.signs)
    v = [Fraction(0)] * output_code.n_total
    for g, (p, w) in enumerate(
        zip(input_code.noise_pos[mask.source].tolist(), weights, strict=True)
    ):
        v[int(output_code.flat_pos[g])] = inner[p] * w
    return _forward_exact(output_code.mix, v)


def _errors_up(computed: Any, exact: list[Fraction]) -> np.ndarray:
    """``|computed - exact|`` as floats rounded up (so ``error <= bound`` implies it exactly)."""
    out = []
    for c, e in zip(_fractions(computed), exact, strict=True):
        err = abs(c - e)
        f = float(err)
        out.append(math.nextafter(f, math.inf) if Fraction(f) < err else f)
    return np.array(out)


def exact_decode_output_errors(
    keys: Any, encoded_output: Any, encoded_input: Any, decoded: Any
) -> np.ndarray:
    """The exact error of one ``decode_output`` (rational arithmetic; for audits and tests).

    Parameters
    ----------
    keys : Keys
        Float keys (small: the exact arithmetic is slow).
    encoded_output, encoded_input : array
        ``u~`` and ``y~`` (one sample, 1-D).
    decoded : array
        What ``decode_output`` returned for them.

    Returns
    -------
    np.ndarray
        ``|decoded - Pi3_left (u~ - Pi4 y~)|`` computed exactly, then rounded up to float64.
    """
    y = _fractions(encoded_input)
    masked = _mask_exact(keys.mask, keys.input_code, keys.output_code, y)
    inner = [u - m for u, m in zip(_fractions(encoded_output), masked, strict=True)]
    return _errors_up(decoded, _decode_exact(keys.output_code, inner))


def exact_decode_state_errors(keys: Any, encoded_state: Any, decoded: Any) -> np.ndarray:
    """The exact error of one ``decode_state`` (rational arithmetic; for audits and tests).

    Parameters
    ----------
    keys : Keys
        Float keys.
    encoded_state : array
        ``x~`` (one sample, 1-D).
    decoded : array
        What ``decode_state`` returned for it.

    Returns
    -------
    np.ndarray
        ``|decoded - Pi2_left x~|`` computed exactly, then rounded up to float64.
    """
    return _errors_up(decoded, _decode_exact(keys.state_code, _fractions(encoded_state)))
