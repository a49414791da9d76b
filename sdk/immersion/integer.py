"""The shared integer arithmetic of the project: fixed point and linear algebra modulo 2^64.

Every integer coding (the modular immersion of :mod:`immersion.coding.modular`, a lattice coding)
works on ``uint64`` arrays and reads their values modulo ``2^64``; this module is the one place that

* turns real values into fixed-point integers, ``q(y) = round(y 2^f)`` stored as ``uint64`` in
  two's complement, refusing (with the signal's name and the largest representable magnitude)
  any value whose fixed-point form would wrap, and turns them back;
* multiplies and sums ``uint64`` arrays modulo ``2^64`` and checks that a weighted sum of
  fixed-point values still fits (headroom) before it is computed;
* inverts odd numbers and square matrices modulo ``2^64`` (Gauss-Jordan with odd pivots),
  solves linear systems modulo ``2^64``, draws unimodular matrices ``K = L U`` (unit triangular
  integer factors) with their inverses, and draws noise uniform modulo ``2^64``.

Why ``uint64`` in numpy: numpy's ``uint64`` ``+``, ``*`` and ``@`` on arrays wrap modulo ``2^64``
silently and exactly (C unsigned arithmetic; ``@`` on integers uses numpy's own loop, not BLAS).
Operations on numpy *scalars* warn on overflow, so everything here works on arrays. torch has no
``uint64`` matrix product (``addmm`` is not implemented for UInt64) and no ``int64`` product on
CUDA; ``int64`` products on the CPU wrap in practice and equal the ``uint64`` ones bit for bit
(two's complement), but signed overflow is undefined behaviour in C++, so the project keeps this
arithmetic in numpy.

Exactness: addition and multiplication modulo ``2^64`` are exact, and so is every function here
except :func:`decode_fixed`, whose conversion to float64 is exact while ``|q| <= 2^53``
(``|y| <= 2^(53 - f)``). Nothing in this module reads floating-point state.

Examples
--------
>>> import numpy as np
>>> q = encode_fixed(np.array([1.5, -0.25]), 8, name="y")      # round(y * 2^8), two's complement
>>> q.dtype.name, to_signed(q).tolist()
('uint64', [384, -64])
>>> decode_fixed(q, 8).tolist()
[1.5, -0.25]
>>> k, k_inv = random_unimodular(3, np.random.default_rng(0))
>>> bool((wrapping_matmul(k_inv, k) == np.eye(3, dtype=np.uint64)).all())
True
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .validation import finite_array

#: Values are integers modulo ``2^MODULUS_BITS``.
MODULUS_BITS = 64
#: Fixed-point integers are signed: ``|q| < 2^SIGNED_BITS``.
SIGNED_BITS = MODULUS_BITS - 1
#: Largest accepted ``fraction_bits`` (one integer bit of magnitude is left).
MAX_FRACTION_BITS = 62
#: :func:`decode_fixed` converts to float64 exactly while ``|q| <= 2^EXACT_FLOAT_BITS``.
EXACT_FLOAT_BITS = 53

#: ``fraction_bits`` when none is given: a grid step of 2^-32 (2.3e-10) and values up to 2^31.
DEFAULT_FRACTION_BITS = 32

_ONE = np.ones(1, dtype=np.uint64)
_TWO = np.full(1, 2, dtype=np.uint64)


# ---------------------------------------------------------------- checks
def check_fraction_bits(fraction_bits: Any, *, name: str = "fraction_bits") -> int:
    """``fraction_bits`` as an int in ``[0, MAX_FRACTION_BITS]``, or an error naming ``name``.

    Examples
    --------
    >>> check_fraction_bits(32)
    32
    """
    if isinstance(fraction_bits, bool) or not isinstance(fraction_bits, numbers.Integral):
        raise InvalidArgumentError(
            name, f"expected an integer in [0, {MAX_FRACTION_BITS}], got {fraction_bits!r}"
        )
    if not 0 <= int(fraction_bits) <= MAX_FRACTION_BITS:
        raise InvalidArgumentError(
            name, f"expected an integer in [0, {MAX_FRACTION_BITS}], got {fraction_bits}"
        )
    return int(fraction_bits)


def _check_headroom_bits(headroom_bits: Any, fraction_bits: int) -> int:
    if (
        isinstance(headroom_bits, bool)
        or not isinstance(headroom_bits, numbers.Integral)
        or not 0 <= int(headroom_bits) <= SIGNED_BITS - fraction_bits
    ):
        raise InvalidArgumentError(
            "headroom_bits",
            f"expected an integer in [0, {SIGNED_BITS - fraction_bits}] with fraction_bits="
            f"{fraction_bits}, got {headroom_bits!r}",
        )
    return int(headroom_bits)


def largest_magnitude(fraction_bits: int, *, headroom_bits: int = 0) -> float:
    """``2^(63 - headroom_bits - fraction_bits)``: :func:`encode_fixed` takes ``|y|`` below it.

    ``headroom_bits`` keeps ``2^headroom_bits`` such values summable without wrapping.

    Examples
    --------
    >>> largest_magnitude(32), largest_magnitude(32, headroom_bits=10)
    (2147483648.0, 2097152.0)
    """
    f = check_fraction_bits(fraction_bits)
    return float(2.0 ** (SIGNED_BITS - _check_headroom_bits(headroom_bits, f) - f))


def quantisation_step(fraction_bits: int) -> float:
    """``2^-f``: the spacing of fixed-point values (rounding moves a value by at most half of it).

    Examples
    --------
    >>> quantisation_step(16)
    1.52587890625e-05
    """
    return float(2.0 ** -check_fraction_bits(fraction_bits))


def as_uint64(name: str, value: Any, *, last_dim: int | None = None) -> np.ndarray:
    """``value`` as a ``uint64`` array (integers modulo ``2^64``), or an error naming ``name``.

    ``uint64`` arrays pass through unchanged; other integer arrays are read modulo ``2^64``
    (negative numbers in two's complement). Floats, NaN and objects are refused: an encoded
    value that went through floating point has lost its low bits.

    Examples
    --------
    >>> as_uint64("y", [-1, 2]).tolist()
    [18446744073709551615, 2]
    """
    if isinstance(value, np.ndarray) and value.dtype == np.uint64:
        arr = value
    else:
        try:
            raw = np.asarray(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(name, f"expected an array of integers ({exc})") from None
        if raw.dtype.kind == "O" and raw.size:
            try:  # Python ints beyond int64: reduce modulo 2^64 exactly
                raw = np.array(
                    [int(v) % (1 << MODULUS_BITS) for v in raw.ravel()], dtype=np.uint64
                ).reshape(raw.shape)
            except (TypeError, ValueError):
                raise InvalidArgumentError(name, "expected integers (values modulo 2^64)") from None
        if raw.dtype.kind not in "iu" and not (raw.dtype.kind == "O" and raw.size == 0):
            raise InvalidArgumentError(
                name,
                f"expected integers modulo 2^64 (uint64), got dtype {raw.dtype}: encoded values "
                "must not pass through floating point",
            )
        arr = raw.astype(np.int64).view(np.uint64) if raw.dtype.kind == "i" else raw
        arr = arr.astype(np.uint64, copy=False)
    if last_dim is not None and (arr.ndim == 0 or arr.shape[-1] != last_dim):
        raise InvalidArgumentError(name, f"expected shape (..., {last_dim}), got shape {arr.shape}")
    return arr


# ---------------------------------------------------------------- fixed point
def encode_fixed(
    values: Any, fraction_bits: int, *, name: str = "values", headroom_bits: int = 0
) -> np.ndarray:
    """``q(y) = round(y 2^f)`` as ``uint64`` two's complement (round half to even).

    ``y * 2^f`` is exact in float64 and so is the rounding, so ``q`` is a function of ``y`` alone,
    bit for bit on every machine. Values with ``|y| >= largest_magnitude(f, headroom_bits=h)``
    are refused with an :class:`InvalidArgumentError` naming ``name`` (their fixed-point form
    would wrap modulo 2^64, or leave fewer than ``h`` bits of headroom); NaN and inf are refused
    too.

    Examples
    --------
    >>> to_signed(encode_fixed([0.5, 2.5, -1.0], 1)).tolist()          # ties go to even
    [1, 5, -2]
    >>> encode_fixed([3e9], 32, name="u")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: u: |u| reaches 3e+09, ... below 2.14748e+09 (2^31)
    """
    f = check_fraction_bits(fraction_bits)
    h = _check_headroom_bits(headroom_bits, f)
    arr = finite_array(name, values)
    with np.errstate(over="ignore"):  # overflow to inf is refused just below
        scaled = np.ldexp(arr, f)
    limit = 2.0 ** (SIGNED_BITS - h)
    if arr.size:
        biggest = float(np.abs(scaled).max())
        if not biggest < limit:  # inf too (a finite y can overflow once scaled)
            raise InvalidArgumentError(
                name,
                f"|{name}| reaches {float(np.abs(arr).max()):.6g}, but fixed point with "
                f"fraction_bits={f} and headroom_bits={h} represents magnitudes below "
                f"{limit / 2.0**f:.6g} (2^{SIGNED_BITS - h - f})",
            )
    return np.rint(scaled).astype(np.int64).view(np.uint64)


def to_signed(encoded: np.ndarray) -> np.ndarray:
    """``uint64`` values read as signed two's complement integers (``int64``), without a copy."""
    return np.asarray(encoded, dtype=np.uint64).view(np.int64)


def decode_fixed(encoded: Any, fraction_bits: int) -> np.ndarray:
    """``signed(q) 2^-f`` as float64: the value a fixed-point integer stands for.

    Exact while ``|q| <= 2^53``; beyond that the conversion to float64 rounds (the integer
    ``q`` itself is always exact).

    Examples
    --------
    >>> decode_fixed(encode_fixed([-3.0], 4), 4).tolist()
    [-3.0]
    """
    q = to_signed(as_uint64("encoded", encoded))
    return np.ldexp(q.astype(np.float64), -check_fraction_bits(fraction_bits))


def quantise(values: Any, fraction_bits: int, *, name: str = "values") -> np.ndarray:
    """``q(y) 2^-f``: ``y`` rounded to the fixed-point grid (the fixed-point twin of a float value).

    Examples
    --------
    >>> quantise([0.3], 2).tolist()
    [0.25]
    """
    return decode_fixed(encode_fixed(values, fraction_bits, name=name), fraction_bits)


# ---------------------------------------------------------------- wrapping arithmetic
def wrapping_matmul(a: Any, b: Any) -> np.ndarray:
    """``a @ b`` modulo ``2^64`` (numpy's ``uint64`` product wraps exactly).

    Examples
    --------
    >>> big = np.array([[2**63]], dtype=np.uint64)
    >>> wrapping_matmul(big, np.array([[3]], dtype=np.uint64)).tolist()   # 3 * 2^63 mod 2^64
    [[9223372036854775808]]
    """
    return np.matmul(as_uint64("a", a), as_uint64("b", b))


def weighted_sum(arrays: Sequence[Any], weights: Sequence[int]) -> np.ndarray:
    """``sum_k w_k a_k`` modulo ``2^64`` with integer weights, in any order (same result).

    Integer addition modulo ``2^64`` is associative and commutative, so an aggregate of encoded
    uploads does not depend on the order in which they arrive. Check the headroom of the plain
    sum first with :func:`check_sum_headroom` if its signed value matters.

    Examples
    --------
    >>> total = weighted_sum([encode_fixed([1.0], 4), encode_fixed([-2.0], 4)], [3, 1])
    >>> to_signed(total).tolist()
    [16]
    """
    if len(arrays) == 0 or len(arrays) != len(weights):
        raise InvalidArgumentError(
            "weights",
            f"expected one integer weight per array, got {len(weights)} for {len(arrays)}",
        )
    total: np.ndarray | None = None
    for i, (arr, w) in enumerate(zip(arrays, weights, strict=True)):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise InvalidArgumentError("weights", f"expected integers, got {w!r} at {i}")
        term = as_uint64(f"arrays[{i}]", arr) * as_uint64("weights", [int(w)])
        if total is not None and term.shape != total.shape:
            raise InvalidArgumentError(
                f"arrays[{i}]", f"expected shape {total.shape}, got {term.shape}"
            )
        total = term if total is None else total + term
    assert total is not None
    return total


def check_sum_headroom(
    max_abs_value: float, weights: Sequence[int], fraction_bits: int, *, name: str
) -> None:
    """Refuse a weighted sum of fixed-point values that could leave the signed range.

    With values ``|y| <= max_abs_value`` and integer weights ``w_k``, the sum of ``w_k q(y_k)``
    stays below ``2^63`` in magnitude, and so decodes to its true signed value, when
    ``sum |w_k| (max_abs_value 2^f + 1/2) < 2^63``.

    Examples
    --------
    >>> check_sum_headroom(10.0, [1000, 2000], 32, name="uploads")    # fits: nothing happens
    >>> check_sum_headroom(1e6, [10**6], 32, name="uploads")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: uploads: ... keep |uploads| below 2147.48 or ...
    """
    f = check_fraction_bits(fraction_bits)
    total = sum(abs(int(w)) for w in weights)
    if total == 0:
        return
    if not max_abs_value * 2.0**f + 0.5 < 2.0**SIGNED_BITS / total:
        safe = (2.0**SIGNED_BITS / total - 0.5) / 2.0**f
        raise InvalidArgumentError(
            name,
            f"a weighted sum with total weight {total} of values up to {max_abs_value:.6g} could "
            f"wrap modulo 2^64 with fraction_bits={f}: keep |{name}| below {safe:.6g} or lower "
            "the weights or fraction_bits",
        )


# ---------------------------------------------------------------- inverses and systems
def inverse_odd(values: Any) -> np.ndarray:
    """Multiplicative inverses modulo ``2^64`` of odd integers (Newton: each step doubles the bits).

    Examples
    --------
    >>> a = np.array([3, 12345677], dtype=np.uint64)
    >>> (a * inverse_odd(a)).tolist()
    [1, 1]
    """
    a = as_uint64("values", values)
    if a.size and not (a & _ONE).all():
        raise InvalidArgumentError("values", "even numbers have no inverse modulo 2^64")
    x = a.copy()  # a * a = 1 mod 8: three correct bits
    for _ in range(5):  # 3 -> 6 -> 12 -> 24 -> 48 -> 96 bits
        x = x * (_TWO - a * x)
    return x


def _eliminate(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gauss-Jordan on ``[a | b]`` modulo 2^64, odd pivots: (reduced a, reduced b, pivot rows)."""
    a, b = a.copy(), b.copy()
    rows, cols = a.shape
    pivots = np.empty(cols, dtype=np.int64)
    for c in range(cols):
        candidates = np.flatnonzero(a[c:, c] & _ONE)
        if candidates.size == 0:
            raise np.linalg.LinAlgError(
                f"column {c} has no odd pivot: the matrix is singular modulo 2"
            )
        p = c + int(candidates[0])
        if p != c:
            a[[c, p]], b[[c, p]] = a[[p, c]], b[[p, c]]
        pivots[c] = p
        inv = inverse_odd(a[c, c : c + 1])
        a[c] *= inv
        b[c] *= inv
        factors = a[:, c].copy()
        factors[c] = 0
        a -= factors[:, None] * a[c][None, :]
        b -= factors[:, None] * b[c][None, :]
    return a, b, pivots


def inverse_mod(matrix: Any, *, name: str = "matrix") -> np.ndarray:
    """Inverse of a square integer matrix modulo ``2^64`` (exists iff its determinant is odd).

    Examples
    --------
    >>> m = np.array([[2, 1], [1, 1]], dtype=np.uint64)
    >>> to_signed(inverse_mod(m)).tolist()
    [[1, -1], [-1, 2]]
    """
    a = as_uint64(name, matrix)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise InvalidArgumentError(name, f"expected a square matrix, got shape {a.shape}")
    try:
        _, inv, _ = _eliminate(a, np.eye(a.shape[0], dtype=np.uint64))
    except np.linalg.LinAlgError as exc:
        raise InvalidArgumentError(name, f"is not invertible modulo 2^64 ({exc})") from None
    return inv


def solve_mod(matrix: Any, rhs: Any) -> np.ndarray:
    """``x`` with ``matrix @ x = rhs`` modulo ``2^64``, for a tall ``matrix`` of full rank modulo 2.

    ``matrix`` is ``(r, c)`` with ``r >= c``; Gauss-Jordan with odd pivots picks ``c`` rows that
    are invertible modulo 2, solves on them, and checks every other row. Raises
    :class:`numpy.linalg.LinAlgError` if no odd pivot exists for some column (the rows span
    less than ``Z^c`` modulo 2) or if the system is inconsistent.

    Examples
    --------
    >>> a = np.array([[1, 2], [3, 5], [4, 7]], dtype=np.uint64)
    >>> x = np.array([[7], [2**63 + 1]], dtype=np.uint64)
    >>> bool((solve_mod(a, wrapping_matmul(a, x)) == x).all())
    True
    """
    a, b = as_uint64("matrix", matrix), as_uint64("rhs", rhs)
    vector = b.ndim == 1
    if vector:
        b = b[:, None]
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0] or a.shape[0] < a.shape[1]:
        raise InvalidArgumentError(
            "matrix",
            f"expected a tall (r, c) matrix and (r, k) right side, got {a.shape}, {b.shape}",
        )
    cols = a.shape[1]
    reduced_a, reduced_b, _ = _eliminate(a, b)
    if (reduced_a[cols:] != 0).any() or (reduced_b[cols:] != 0).any():
        raise np.linalg.LinAlgError("the system has no solution modulo 2^64")
    x = reduced_b[:cols]
    return x[:, 0] if vector else x


# ---------------------------------------------------------------- random draws
def uniform_noise(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Entries i.i.d. uniform on ``{0, ..., 2^64 - 1}`` (``uint64``), from ``rng`` only.

    Examples
    --------
    >>> uniform_noise(np.random.default_rng(0), 2).dtype.name
    'uint64'
    """
    return rng.integers(0, 1 << MODULUS_BITS, size=shape, dtype=np.uint64)


def _unit_lower_inverse(lower: np.ndarray) -> np.ndarray:
    """Inverses modulo 2^64 of a stack of unit lower-triangular matrices ``(k, b, b)``, by rows."""
    b = lower.shape[-1]
    inv = np.zeros_like(lower)
    idx = np.arange(b)
    inv[:, idx, idx] = 1
    for i in range(1, b):
        # row i of L^-1: e_i - L[i, :i] L^-1[:i, :]
        inv[:, i, :i] = -np.matmul(lower[:, i : i + 1, :i], inv[:, :i, :i])[:, 0, :]
    return inv


def random_unimodular_stack(
    rng: np.random.Generator, count: int, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` matrices ``K = L U`` (random unit lower/upper triangular, uniform off-diagonal
    entries modulo ``2^64``) and their inverses ``U^-1 L^-1``; shapes ``(count, size, size)``.

    ``det K = 1``, so every ``K`` is invertible modulo ``2^64`` and the inverse is exact.
    """
    k = np.empty((count, size, size), dtype=np.uint64)
    k_inv = np.empty_like(k)
    if count == 0 or size == 0:
        return k, k_inv
    chunk = max(1, (1 << 20) // (size * size))  # bounded temporaries
    strict_lower = np.tril(np.ones((size, size), dtype=bool), -1)
    eye = np.eye(size, dtype=np.uint64)
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        lower = np.where(strict_lower, uniform_noise(rng, (hi - lo, size, size)), eye)
        upper_t = np.where(strict_lower, uniform_noise(rng, (hi - lo, size, size)), eye)
        upper = upper_t.transpose(0, 2, 1)
        k[lo:hi] = np.matmul(lower, upper)
        k_inv[lo:hi] = np.matmul(
            _unit_lower_inverse(upper_t).transpose(0, 2, 1), _unit_lower_inverse(lower)
        )
    return k, k_inv


def random_unimodular(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One ``size x size`` matrix ``K = L U`` invertible modulo ``2^64``, and its inverse.

    Examples
    --------
    >>> k, k_inv = random_unimodular(4, np.random.default_rng(1))
    >>> bool((wrapping_matmul(k, k_inv) == np.eye(4, dtype=np.uint64)).all())
    True
    """
    k, k_inv = random_unimodular_stack(rng, 1, size)
    return k[0], k_inv[0]


class FixedPointDecoder:
    """``x~ -> 2^-f Pi_left x~`` (the decoded fixed-point value, in float64).

    Parameters
    ----------
    decoder:
        ``x~ -> Pi_left x~`` modulo ``2^64`` (a code's decoder).
    fraction_bits:
        ``f`` of ``q(v) = round(v 2^f)``.
    """

    def __init__(self, decoder: Callable[[np.ndarray], np.ndarray], fraction_bits: int) -> None:
        self._decoder, self._f = decoder, fraction_bits

    def __call__(self, encoded: np.ndarray) -> np.ndarray:
        return decode_fixed(self._decoder(encoded), self._f)


class FixedPointEncoder:
    """``v -> Pi q(v)``, refusing values whose fixed-point form would wrap (names the signal).

    Parameters
    ----------
    encoder:
        ``q -> Pi q`` modulo ``2^64`` (a code's encoder).
    fraction_bits:
        ``f`` of ``q(v) = round(v 2^f)``.
    name:
        The signal named by a range refusal.
    """

    def __init__(
        self, encoder: Callable[[np.ndarray], np.ndarray], fraction_bits: int, name: str
    ) -> None:
        self._encoder, self._f, self._name = encoder, fraction_bits, name

    def __call__(self, values: Any) -> np.ndarray:
        return self._encoder(encode_fixed(values, self._f, name=self._name))
