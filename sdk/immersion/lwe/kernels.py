"""Hot integer loops of the RLWE controller: the negacyclic NTT, products with a fixed key,
encryption's sparse sums, the cloud's sums of products and the plant's reading of them.

Each function has a numpy form (always there) and a numba form (extra ``lwe``; compiled at first
use and cached on disk, :mod:`._numba_kernels`). Both compute the same integers: residues below
``2^25``, products below ``2^50``, exact reductions. Arrays are ``(L, N)`` uint64 residues, one
row per RNS prime ``q`` (``(L,)`` uint64). Set ``IMMERSION_NO_NUMBA=1`` to force the numpy forms.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def _numba() -> Any:
    if os.environ.get("IMMERSION_NO_NUMBA"):
        return None
    try:
        from . import _numba_kernels
    except ImportError:
        return None
    return _numba_kernels


def available() -> bool:
    """Whether the numba kernels are in use."""
    return _numba() is not None


def shoup(w: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``floor(w 2^32 / q)`` per residue (the companion of a fixed multiplier)."""
    return (w << np.uint64(32)) // q.reshape((-1,) + (1,) * (w.ndim - 1))


def ntt(a: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place forward negacyclic NTT (Cooley-Tukey, bit-reversed output)."""
    fast = _numba()
    if fast is not None:
        return fast.ntt(a, psi, psi_s, q)
    L, n = a.shape
    qq = q[:, None, None]
    m, t = 1, n
    while m < n:
        t //= 2
        view = a.reshape(L, m, 2, t)
        u = view[:, :, 0, :].copy()
        v = (view[:, :, 1, :] * psi[:, m : 2 * m, None]) % qq
        view[:, :, 0, :] = (u + v) % qq
        view[:, :, 1, :] = (u + qq - v) % qq
        m *= 2
    return a


def reject_uniform(words: np.ndarray, q: np.ndarray, n: int) -> np.ndarray | None:
    """Row ``i``: the first ``n`` of ``words[i] >> 39`` below ``q[i]`` (uniform residues), or
    None if a row ran short."""
    fast = _numba()
    if fast is not None:
        out, full = fast.reject_uniform(words, q, n)
        return out if full else None
    out = np.empty((words.shape[0], n), dtype=np.uint64)
    for row, ql in enumerate(q):
        top = words[row] >> np.uint64(39)
        kept = top[top < ql]
        if kept.size < n:
            return None
        out[row] = kept[:n]
    return out


def ntt_signed(c: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The NTT, ``(L, N)``, of a polynomial with signed int64 coefficients ``c`` (``(N,)``)."""
    fast = _numba()
    if fast is not None:
        return fast.ntt_signed(c, psi, psi_s, q)
    residues = (c[None, :] % q.astype(np.int64)[:, None]).astype(np.uint64)
    return ntt(residues, psi, psi_s, q)


def intt(a: np.ndarray, psi_inv: np.ndarray, psi_inv_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place inverse of :func:`ntt`, without the final factor ``N^-1``."""
    fast = _numba()
    if fast is not None:
        return fast.intt(a, psi_inv, psi_inv_s, q)
    L, n = a.shape
    qq = q[:, None, None]
    m, t = n, 1
    while m > 1:
        h = m // 2
        view = a.reshape(L, h, 2, t)
        u = view[:, :, 0, :].copy()
        v = view[:, :, 1, :].copy()
        view[:, :, 0, :] = (u + v) % qq
        view[:, :, 1, :] = ((u + qq - v) % qq * psi_inv[:, h:m, None]) % qq
        t *= 2
        m = h
    return a


def mul_fixed(x: np.ndarray, w: np.ndarray, ws: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``x w mod q``, ``w`` a fixed multiplier with companion ``ws`` (:func:`shoup`)."""
    fast = _numba()
    if fast is not None:
        return fast.mul_fixed(x, w, ws, q)
    return (x * w) % q[:, None]


def zero(
    a: np.ndarray, s: np.ndarray, s_s: np.ndarray, te: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 = t e - a s mod q``, the part of an encryption that does not depend on the message."""
    fast = _numba()
    if fast is not None:
        return fast.zero(a, s, s_s, te, q)
    qq = q[:, None]
    return (te + qq - (a * s) % qq) % qq


def add_sparse(
    b0: np.ndarray, monomials: np.ndarray, values: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 + sum_c values[c] X^(p_c) mod q`` (``values``: ``(count, L)`` residues)."""
    fast = _numba()
    if fast is not None:
        return fast.add_sparse(b0, monomials, values, q)
    total = b0 + (monomials * values[:, :, None]).sum(axis=0, dtype=np.uint64)
    return total % q[:, None]


def products(
    theta_b: np.ndarray,
    theta_a: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    window: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)`` as a degree-2 ciphertext: ``c0`` read at the
    readers' coefficients ``(positions, L)``, ``c1`` and ``c2`` in NTT form.

    ``theta_*``: ``(W + 1, L, N)`` uint64; the input's ``b``, ``a``: ``(L, N)`` uint64 (term 0);
    ``window``: ``(W, 2, L, N)`` uint32, the past inputs' ``(b, a)`` (terms 1..W). At most
    ``2^12`` terms (uint64 sums of products below ``2^50`` cannot wrap).
    """
    if theta_b.shape[0] > 2**12:
        raise ValueError("at most 4096 products are summed before one reduction")
    fast = _numba()
    if fast is not None:
        return fast.products(theta_b, theta_a, b, a, window, readers, q)
    qq = q[:, None]
    v_b = np.concatenate([b[None], window[:, 0].astype(np.uint64)])
    v_a = np.concatenate([a[None], window[:, 1].astype(np.uint64)])
    c0 = (theta_b * v_b).sum(axis=0, dtype=np.uint64) % qq
    c1 = ((theta_b * v_a).sum(axis=0, dtype=np.uint64) % qq) + (
        (theta_a * v_b).sum(axis=0, dtype=np.uint64) % qq
    )
    c2 = (theta_a * v_a).sum(axis=0, dtype=np.uint64) % qq
    return read(c0, readers, q), c1 % qq, c2


def read(a: np.ndarray, readers: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Coefficients ``(positions, L)`` of ``a`` (NTT form) where ``readers`` point
    (:meth:`~immersion.lwe.rns.RnsRing.readers`); ``N <= 2^13`` products per sum."""
    return (readers * a[None]).sum(axis=-1, dtype=np.uint64) % q


def decrypt_read(
    c1: np.ndarray,
    c2: np.ndarray | None,
    s: tuple[np.ndarray, np.ndarray],
    s2: tuple[np.ndarray, np.ndarray],
    readers: np.ndarray,
    q: np.ndarray,
) -> np.ndarray:
    """Coefficients ``(positions, L)`` of ``c1 s + c2 s^2`` (``s``, ``s2``: key and companion)."""
    fast = _numba()
    if c2 is None:
        c2 = np.zeros_like(c1)
    if fast is not None:
        return fast.decrypt_read(c1, c2, s[0], s[1], s2[0], s2[1], readers, q)
    qq = q[:, None]
    d = ((c1 * s[0]) % qq + (c2 * s2[0]) % qq) % qq
    return read(d, readers, q)
