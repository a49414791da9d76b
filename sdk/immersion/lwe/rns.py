"""The ring ``R_Q = Z_Q[X] / (X^N + 1)`` in residue-number (RNS) and NTT form.

``Q = q_1 ... q_L`` with NTT-friendly primes ``q_i = 1 (mod 2N)`` below ``2^25``. A polynomial is
held as an ``(L, N)`` uint64 array of its values at the ``N`` roots of ``X^N + 1`` modulo each
``q_i`` (the negacyclic NTT, bit-reversed order as in SEAL and Lattigo), so products are pointwise.
A product of two residues is below ``2^50``, so up to ``2^13`` of them add up in a uint64 before
one reduction (lazy reduction). Integer arithmetic only: every result is the same on every CPU.

Reading one coefficient of a polynomial given in NTT form costs one dot product of length ``N``
(``a_p = N^-1 sum_k a^_k w_k^-p``), not an inverse NTT. The hot loops (the NTT, the cloud's sums
of products) run as numba kernels when numba is installed (extra ``lwe``), else in numpy; both
compute the same integers.

Examples
--------
>>> ring = RnsRing(16, ntt_primes(16, 2))
>>> a = np.zeros(16, dtype=np.int64); a[1] = 1            # X
>>> b = np.zeros(16, dtype=np.int64); b[15] = 1           # X^15
>>> ring.coefficients(ring.mul(ring.ntt(a), ring.ntt(b)), [0])   # X^16 = -1
[-1]
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Sequence

import numpy as np

from . import kernels

#: Bits of every RNS prime: products of two residues stay below 2^50, exact in float64.
PRIME_BITS = 25


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for ``n < 3.3e24`` (the first 13 prime bases)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def previous_prime(bound: int) -> int:
    """The largest prime below ``bound`` (``bound >= 3``).

    Examples
    --------
    >>> previous_prime(2**37)
    137438953447
    """
    n = bound - 1
    while not _is_prime(n):
        n -= 1
    return n


@functools.lru_cache(maxsize=None)
def ntt_primes(degree: int, count: int, bits: int = PRIME_BITS) -> tuple[int, ...]:
    """The ``count`` largest primes below ``2^bits`` with ``q = 1 (mod 2 degree)``.

    Examples
    --------
    >>> ntt_primes(4096, 2)
    (33538049, 33349633)
    """
    step = 2 * degree
    q = (2**bits - 1) // step * step + 1
    out: list[int] = []
    while len(out) < count:
        if q < step:
            raise ValueError(f"fewer than {count} NTT primes below 2^{bits} for N = {degree}")
        if _is_prime(q):
            out.append(q)
        q -= step
    return tuple(out)


def _primitive_root_2n(q: int, degree: int) -> int:
    """A primitive ``2N``-th root of unity modulo ``q`` (the smallest such ``g^((q-1)/2N)``)."""
    for g in range(2, q):
        psi = pow(g, (q - 1) // (2 * degree), q)
        if pow(psi, degree, q) == q - 1:
            return psi
    raise ValueError(f"no primitive {2 * degree}-th root of unity modulo {q}")


def _bit_reverse(degree: int) -> np.ndarray:
    bits = degree.bit_length() - 1
    idx = np.arange(degree)
    out = np.zeros(degree, dtype=np.int64)
    for b in range(bits):
        out |= ((idx >> b) & 1) << (bits - 1 - b)
    return out


class RnsRing:
    """``Z_Q[X] / (X^N + 1)``, ``Q = prod(primes)``, polynomials as ``(L, N)`` NTT residues.

    Parameters
    ----------
    degree:
        ``N``, a power of two.
    primes:
        The RNS primes, each ``= 1 (mod 2N)`` and below ``2^25`` (:func:`ntt_primes`).
    """

    def __init__(self, degree: int, primes: Sequence[int]) -> None:
        if degree < 2 or degree & (degree - 1):
            raise ValueError(f"degree must be a power of two >= 2, got {degree}")
        for q in primes:
            if q >= 2**PRIME_BITS or q % (2 * degree) != 1 or not _is_prime(q):
                raise ValueError(f"{q} is not an NTT prime below 2^{PRIME_BITS} for N={degree}")
        self.degree, self.primes = degree, tuple(int(q) for q in primes)
        self.modulus = 1
        for q in self.primes:
            self.modulus *= q
        self.q = np.array(self.primes, dtype=np.uint64)[:, None]  # (L, 1)
        rev = _bit_reverse(degree)
        psi_rev, psi_inv_rev, points = [], [], []
        for q in self.primes:
            psi = _primitive_root_2n(q, degree)
            psi_inv = pow(psi, -1, q)
            powers, inv_powers = [1] * degree, [1] * degree
            for i in range(1, degree):
                powers[i] = powers[i - 1] * psi % q
                inv_powers[i] = inv_powers[i - 1] * psi_inv % q
            psi_rev.append([powers[r] for r in rev])
            psi_inv_rev.append([inv_powers[r] for r in rev])
            # output k of the forward transform is the value at psi^(2 rev(k) + 1), psi^N = -1
            odd = [2 * int(r) + 1 for r in rev]
            points.append([powers[e] if e < degree else q - powers[e - degree] for e in odd])
        self._psi_rev = np.array(psi_rev, dtype=np.uint64)
        self._psi_inv_rev = np.array(psi_inv_rev, dtype=np.uint64)
        self._psi_rev_q = kernels.quotients(self._psi_rev, self.q[:, 0])
        self._psi_inv_rev_q = kernels.quotients(self._psi_inv_rev, self.q[:, 0])
        self._ones = np.ones(len(self.primes), dtype=np.uint64)
        self._points = points
        self._n_inv = np.array([pow(degree, -1, q) for q in self.primes], dtype=np.uint64)[:, None]
        self._crt = [(self.modulus // q) * pow(self.modulus // q, -1, q) for q in self.primes]
        self._readers: dict[tuple[int, ...], np.ndarray] = {}

    @property
    def n_primes(self) -> int:
        return len(self.primes)

    @property
    def modulus_bits(self) -> float:
        """``log2 Q``."""
        return float(np.log2(float(self.modulus)))

    # ------------------------------------------------------------------ elementwise arithmetic
    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Pointwise ``a b mod q`` (NTT form: the polynomial product)."""
        return (a * b) % self.q

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a + b mod q``."""
        return (a + b) % self.q

    def scalar(self, value: int) -> np.ndarray:
        """The integer ``value`` modulo each prime, ``(L, 1)``."""
        return np.array([[int(value) % q] for q in self.primes], dtype=np.uint64)

    # ------------------------------------------------------------------ transforms
    def ntt(self, coeffs: Any, scale: int = 1) -> np.ndarray:
        """The NTT form of ``scale`` times a polynomial given by signed integer coefficients
        ``(N,)``, ``|c| < 2^53`` (``scale`` any integer: taken modulo each prime)."""
        residues = self._ones if scale == 1 else self.scalar(scale)[:, 0]
        return kernels.ntt_signed(
            np.asarray(coeffs, dtype=np.int64),
            residues,
            self._psi_rev,
            self._psi_rev_q,
            self.q[:, 0],
        )

    def ntt_residues(self, a: np.ndarray) -> np.ndarray:
        """Forward negacyclic NTT of ``(L, N)`` residues (Cooley-Tukey, bit-reversed output)."""
        return kernels.ntt(
            np.array(a, dtype=np.uint64, copy=True), self._psi_rev, self._psi_rev_q, self.q[:, 0]
        )

    def intt(self, a: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`ntt_residues`: ``(L, N)`` coefficient residues."""
        out = kernels.intt(
            np.array(a, dtype=np.uint64, copy=True),
            self._psi_inv_rev,
            self._psi_inv_rev_q,
            self.q[:, 0],
        )
        return (out * self._n_inv) % self.q

    # ------------------------------------------------------------------ sparse access
    def monomials(self, positions: Sequence[int]) -> np.ndarray:
        """NTT forms of ``X^p`` for each position, ``(len, L, N)`` (for sparse encoding)."""
        out = np.empty((len(positions), self.n_primes, self.degree), dtype=np.uint64)
        for i, p in enumerate(positions):
            for j, q in enumerate(self.primes):
                out[i, j] = [pow(w, int(p), q) for w in self._points[j]]
        return out

    def readers(self, positions: Sequence[int]) -> np.ndarray:
        """``N^-1 w_k^-p`` for each position ``p``: coefficient ``p`` of ``a`` in NTT form is
        ``sum_k a^_k r[p, k] (mod q)``. Shape ``(len, L, N)``; computed once per positions."""
        key = tuple(int(p) for p in positions)
        if key not in self._readers:
            self._readers[key] = self._make_readers(key)
        return self._readers[key]

    def _make_readers(self, positions: Sequence[int]) -> np.ndarray:
        out = np.empty((len(positions), self.n_primes, self.degree), dtype=np.uint64)
        for i, p in enumerate(positions):
            for j, q in enumerate(self.primes):
                n_inv = pow(self.degree, -1, q)
                out[i, j] = [n_inv * pow(w, -int(p), q) % q for w in self._points[j]]
        return out

    def read(self, a: np.ndarray, readers: np.ndarray) -> np.ndarray:
        """Residues ``(len, L)`` of the coefficients that ``readers`` select, from NTT form ``a``
        (each product is below ``2^50``; ``N <= 2^13`` of them add up in a uint64)."""
        return kernels.read(a, readers, self.q[:, 0])

    def crt(self, residues: np.ndarray) -> list[int]:
        """Integers in ``(-Q/2, Q/2]`` from residues ``(L, m)``."""
        modulus, half = self.modulus, self.modulus // 2
        out = []
        for column in np.asarray(residues).T.tolist():  # Python integers from here on
            x = sum(map(operator.mul, column, self._crt)) % modulus
            out.append(x - modulus if x > half else x)
        return out

    def coefficients(self, a: np.ndarray, positions: Sequence[int]) -> list[int]:
        """Centred coefficients at ``positions`` of the polynomial ``a`` in NTT form."""
        return self.crt(self.read(a, self.readers(positions)).T)
