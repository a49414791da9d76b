"""numba forms of :mod:`.kernels` (imported only when numba is installed; see there).

Two reductions keep the hot loops free of 64-bit divisions: Shoup's (a fixed multiplier ``w``
with ``w' = floor(w 2^32 / q)``: ``x w - floor(x w' / 2^32) q`` lies in ``[0, 2q)`` for
``x < 2^32``), and a float quotient estimate for sums below ``2^63`` corrected to the exact
remainder (``_reduce``).
"""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)


@njit
def _reduce(x: np.int64, q: np.int64, qf: np.float64) -> np.int64:
    """``x mod q`` for ``0 <= x < 2^63`` (the float quotient is off by a few at most)."""
    r = x - np.int64(np.float64(x) * qf) * q
    while r < 0:
        r += q
    while r >= q:
        r -= q
    return r


@njit
def _shoup(x: np.uint64, w: np.uint64, ws: np.uint64, q: np.uint64) -> np.uint64:
    """``x w mod q`` for ``x, w < q < 2^25`` and ``ws = floor(w 2^32 / q)``."""
    r = x * w - ((x * ws) >> np.uint64(32)) * q
    return r - q if r >= q else r


@njit
def ntt(a: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.uint64(q[row])
        x = a[row]
        m, t = 1, n
        while m < n:
            t //= 2
            for i in range(m):
                w, ws = psi[row, m + i], psi_s[row, m + i]
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = _shoup(x[j + t], w, ws, ql)
                    s = u + v
                    x[j] = s - ql if s >= ql else s
                    x[j + t] = u - v if u >= v else u + ql - v
            m *= 2
    return a


@njit
def intt(a: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.uint64(q[row])
        x = a[row]
        m, t = n, 1
        while m > 1:
            h = m // 2
            for i in range(h):
                w, ws = psi[row, h + i], psi_s[row, h + i]
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = x[j + t]
                    s = u + v
                    x[j] = s - ql if s >= ql else s
                    x[j + t] = _shoup(u - v if u >= v else u + ql - v, w, ws, ql)
            t *= 2
            m = h
    return a


@njit
def mul_fixed(x: np.ndarray, w: np.ndarray, ws: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``x w mod q`` elementwise, ``w`` fixed (a key) with its Shoup companion ``ws``."""
    L, n = x.shape
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.uint64(q[row])
        for k in range(n):
            out[row, k] = _shoup(x[row, k], w[row, k], ws[row, k], ql)
    return out


@njit
def zero(
    a: np.ndarray, s: np.ndarray, s_s: np.ndarray, te: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 = t e - a s mod q`` (``te`` already ``t NTT(e) mod q``)."""
    L, n = a.shape
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.uint64(q[row])
        for k in range(n):
            p = _shoup(a[row, k], s[row, k], s_s[row, k], ql)
            v = te[row, k]
            out[row, k] = v - p if v >= p else v + ql - p
    return out


@njit
def add_sparse(
    b0: np.ndarray, monomials: np.ndarray, values: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 + sum_c values[c, row] X^(p_c) mod q`` (``values`` already reduced modulo each q)."""
    L, n = b0.shape
    count = monomials.shape[0]
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        for k in range(n):
            acc = np.int64(b0[row, k])
            for c in range(count):
                acc += np.int64(values[c, row]) * np.int64(monomials[c, row, k])
            out[row, k] = _reduce(acc, ql, qf)
    return out


@njit
def products(
    theta_b: np.ndarray,
    theta_a: np.ndarray,
    v_b: np.ndarray,
    v_a: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)``: ``c0`` read at the readers' coefficients
    ``(positions, L)``, ``c1`` and ``c2`` in NTT form."""
    terms, L, n = theta_b.shape
    positions = readers.shape[0]
    c0 = np.zeros((positions, L), dtype=np.int64)
    c1 = np.empty((L, n), dtype=np.uint64)
    c2 = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        acc = np.zeros(positions, dtype=np.int64)
        for k in range(n):
            s0 = np.int64(0)
            s1 = np.int64(0)
            s2 = np.int64(0)
            for j in range(terms):
                tb = np.int64(theta_b[j, row, k])
                ta = np.int64(theta_a[j, row, k])
                vb = np.int64(v_b[j, row, k])
                va = np.int64(v_a[j, row, k])
                s0 += tb * vb
                s1 += tb * va + ta * vb
                s2 += ta * va
            r0 = _reduce(s0, ql, qf)
            c1[row, k] = _reduce(s1, ql, qf)
            c2[row, k] = _reduce(s2, ql, qf)
            for p in range(positions):
                acc[p] += r0 * np.int64(readers[p, row, k])
                if (k & 4095) == 4095:  # keep the sums of products below 2^63
                    acc[p] = _reduce(acc[p], ql, qf)
        for p in range(positions):
            c0[p, row] = _reduce(acc[p], ql, qf)
    return c0.astype(np.uint64), c1, c2


@njit
def decrypt_read(
    c1: np.ndarray,
    c2: np.ndarray,
    s: np.ndarray,
    s_s: np.ndarray,
    s2: np.ndarray,
    s2_s: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> np.ndarray:
    """Coefficients ``(positions, L)`` of ``c1 s + c2 s^2`` at the readers' positions."""
    L, n = c1.shape
    positions = readers.shape[0]
    out = np.empty((positions, L), dtype=np.uint64)
    for row in range(L):
        ql = np.uint64(q[row])
        qi = np.int64(ql)
        qf = 1.0 / np.float64(ql)
        acc = np.zeros(positions, dtype=np.int64)
        for k in range(n):
            d = _shoup(c1[row, k], s[row, k], s_s[row, k], ql) + _shoup(
                c2[row, k], s2[row, k], s2_s[row, k], ql
            )
            d = d - ql if d >= ql else d
            for p in range(positions):
                acc[p] += np.int64(d) * np.int64(readers[p, row, k])
                if (k & 4095) == 4095:
                    acc[p] = _reduce(acc[p], qi, qf)
        for p in range(positions):
            out[p, row] = np.uint64(_reduce(acc[p], qi, qf))
    return out
