"""Hot integer loops of the RLWE controller: the negacyclic NTT, products with a fixed key,
encryption's sparse sums, the cloud's sums of products and the plant's reading of them.

Each function has a numpy form (always there, in exact integers) and a numba form (extra ``lwe``;
compiled at first use and cached on disk, :mod:`._numba_kernels`, exact integers held in float64
lanes). Both compute the same integers: residues below ``2^25``, products below ``2^50``, exact
reductions. Arrays are ``(L, N)`` residues, one row per RNS prime ``q`` (``(L,)`` uint64); a fixed
multiplier ``w`` comes with its quotient ``w / q`` (:func:`quotients`), which only the numba form
reads. Set ``IMMERSION_NO_NUMBA=1`` to force the numpy forms.
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


def quotients(w: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``w / q`` as float64 per residue (the companion of a fixed multiplier; IEEE division is
    correctly rounded, so the table is the same on every CPU)."""
    return w.astype(np.float64) / q.reshape((-1,) + (1,) * (w.ndim - 1)).astype(np.float64)


def centred(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Residues ``(..., L, N)`` as int32 in ``(-q/2, q/2]`` (fixed operands of long sums: half
    the memory of float64, which the kernels stream every sample)."""
    qq = q.astype(np.int64)[:, None]
    xi = x.astype(np.int64)
    return (xi - qq * (xi > qq // 2)).astype(np.int32)


def ntt(a: np.ndarray, psi: np.ndarray, psi_q: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place forward negacyclic NTT (Cooley-Tukey, bit-reversed output) of uint64 residues."""
    fast = _numba()
    if fast is not None and a.shape[1] >= 8:  # its last three stages are unrolled
        return fast.ntt(a, psi, psi_q, q)
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
    """Row ``i``: the first ``n`` of ``words[i] >> 7`` (uint32 words: their top 25 bits) below
    ``q[i]`` (uniform residues, uint32), or None if a row ran short."""
    fast = _numba()
    if fast is not None:
        out, full = fast.reject_uniform(words, q, n)
        return out if full else None
    out = np.empty((words.shape[0], n), dtype=np.uint32)
    for row, ql in enumerate(q):
        top = words[row] >> np.uint32(7)
        kept = top[top < ql]
        if kept.size < n:
            return None
        out[row] = kept[:n]
    return out


def ntt_signed(
    c: np.ndarray, scale: np.ndarray, psi: np.ndarray, psi_q: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """The NTT, ``(L, N)`` uint64, of ``scale c`` modulo each prime: ``c`` signed int64
    coefficients (``|c| < 2^53``), ``scale`` one residue per prime (``(L,)`` uint64)."""
    fast = _numba()
    if fast is not None and c.shape[0] >= 8:
        return fast.ntt_signed(c, scale, psi, psi_q, q)
    residues = (c[None, :] % q.astype(np.int64)[:, None]).astype(np.uint64)
    return ntt(residues * scale[:, None] % q[:, None], psi, psi_q, q)


def cdt_table(thresholds: np.ndarray) -> np.ndarray:
    """For each value of a word's top 16 bits, the count :func:`sample_cdt` returns for every
    word in that bucket, or -1 where a threshold falls inside the bucket (int8, 65,536 entries)."""
    starts = np.arange(2**16, dtype=np.uint64) << np.uint64(48)
    first = np.searchsorted(thresholds, starts, side="right")
    last = np.searchsorted(thresholds, starts + np.uint64(2**48 - 1), side="right")
    return np.where(first == last, first, -1).astype(np.int8)


def sample_cdt(uniform: np.ndarray, thresholds: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int64 count of ``thresholds`` (sorted uint64) at or below each uniform uint64 word
    (``table``: :func:`cdt_table`, a shortcut the numba form takes for all but about 0.06 % of
    words; the count is the same either way)."""
    fast = _numba()
    if fast is not None:
        return fast.sample_cdt(uniform, thresholds, table)
    return np.searchsorted(thresholds, uniform, side="right").astype(np.int64)


def intt(a: np.ndarray, psi_inv: np.ndarray, psi_inv_q: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place inverse of :func:`ntt`, without the final factor ``N^-1``."""
    fast = _numba()
    if fast is not None:
        return fast.intt(a, psi_inv, psi_inv_q, q)
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


def zero(
    a: np.ndarray, s: np.ndarray, s_q: np.ndarray, te: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 = t e - a s mod q`` (uint32), the part of an encryption that does not depend on the
    message (``a`` uint32; ``te`` is ``NTT(t e)``; ``s`` float64 residues, ``s_q = s / q``)."""
    fast = _numba()
    if fast is not None:
        return fast.zero(a, s, s_q, te, q)
    qq = q[:, None]
    b0 = (te + qq - (a.astype(np.uint64) * s.astype(np.uint64)) % qq) % qq
    return b0.astype(np.uint32)


def add_sparse(
    b0: np.ndarray, monomials: np.ndarray, values: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 + sum_c values[c] X^(p_c) mod q`` as uint32 residues ``(L, N)``; ``monomials``
    (``(count, L, N)``, int32, :func:`centred`) and ``values`` (``(count, L)``, float64)
    centred."""
    fast = _numba()
    if fast is not None:
        return fast.add_sparse(b0, monomials, values, q)
    total = b0.astype(np.int64) + (
        monomials.astype(np.int64) * values.astype(np.int64)[:, :, None]
    ).sum(axis=0)
    return (total % q.astype(np.int64)[:, None]).astype(np.uint32)


def products(
    theta_b: np.ndarray,
    theta_a: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    window: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> np.ndarray:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)`` as a degree-2 ciphertext in the wire's
    uint32 words: ``c0`` read at the readers' coefficients (``(positions, L)``), then ``c1`` and
    ``c2`` in NTT form (``(L, N)`` each).

    ``theta_*``: ``(W + 1, L, N)`` centred int32 (:func:`centred`); the input's ``b`` and ``a``
    (uint32): ``(L, N)`` (term 0); ``window``: ``(W, 2, L, N)`` uint32, the past inputs'
    ``(b, a)`` (terms 1..W); ``readers``: int32 ``(positions, L, N)``. At most ``2^12`` terms.
    """
    if theta_b.shape[0] > 2**12:
        raise ValueError("at most 4096 products are summed")
    fast = _numba()
    if fast is not None:
        return fast.products(theta_b, theta_a, b, a, window, readers, q)
    qq = q.astype(np.int64)[:, None]
    t_b, t_a = theta_b.astype(np.int64), theta_a.astype(np.int64)
    v_b = np.concatenate([b[None].astype(np.int64), window[:, 0].astype(np.int64)])
    v_a = np.concatenate([a[None].astype(np.int64), window[:, 1].astype(np.int64)])
    c0 = np.zeros(b.shape, dtype=np.int64)
    c1 = np.zeros(b.shape, dtype=np.int64)
    c2 = np.zeros(b.shape, dtype=np.int64)
    for j in range(t_b.shape[0]):  # each term reduced: sums of products below 2^50 stay exact
        c0 = (c0 + t_b[j] * v_b[j]) % qq
        c1 = (c1 + t_b[j] * v_a[j] % qq + t_a[j] * v_b[j]) % qq
        c2 = (c2 + t_a[j] * v_a[j]) % qq
    c0_read = read(c0.astype(np.uint64), readers.astype(np.uint64), q)
    return np.concatenate([c0_read.reshape(-1), c1.reshape(-1), c2.reshape(-1)]).astype(np.uint32)


def read(a: np.ndarray, readers: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Coefficients ``(positions, L)`` of ``a`` (NTT form) where ``readers`` point
    (:meth:`~immersion.lwe.rns.RnsRing.readers`); ``N <= 2^13`` products per sum."""
    return (readers * a[None]).sum(axis=-1, dtype=np.uint64) % q


def decrypt_read(
    c1: np.ndarray,
    c2: np.ndarray,
    s: np.ndarray,
    s2: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """Coefficients ``(positions, L)`` of ``c1 s + c2 s^2`` (``c1``, ``c2``: uint32 words;
    ``s``, ``s2``: float64 residues; ``readers``: int32), and whether every word of ``c1`` and
    ``c2`` was a residue."""
    fast = _numba()
    if fast is not None:
        return fast.decrypt_read(c1, c2, s, s2, readers, q)
    qq = q[:, None]
    valid = bool((c1 < qq).all() and (c2 < qq).all())
    d = c1.astype(np.uint64) * s.astype(np.uint64) + c2.astype(np.uint64) * s2.astype(np.uint64)
    return read(d % qq, readers.astype(np.uint64), q), valid
