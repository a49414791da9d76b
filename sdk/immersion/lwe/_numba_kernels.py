"""numba forms of :mod:`.kernels` (imported only when numba is installed; see there).

Two reductions keep the hot loops free of 64-bit divisions: Shoup's (a fixed multiplier ``w``
with ``w' = floor(w 2^32 / q)``: ``x w - floor(x w' / 2^32) q`` lies in ``[0, 2q)`` for
``x < 2^32``), and a float quotient estimate for sums below ``2^63`` corrected to the exact
remainder (``_reduce``). Corrections are branch-free (``r += (r >> 63) & q`` on int64): a data-
dependent branch mispredicts half the time and cost more than the arithmetic.
"""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)


@njit
def _fix(r: np.int64, q: np.int64) -> np.int64:
    """``r`` from ``[-q, q)`` to ``[0, q)`` without a branch."""
    return r + ((r >> 63) & q)


@njit
def _reduce(x: np.int64, q: np.int64, qf: np.float64) -> np.int64:
    """``x mod q`` for ``0 <= x < 2^63`` (the float quotient is off by one at most)."""
    r = _fix(x - np.int64(np.float64(x) * qf) * q, q)  # [0, 2q)
    return _fix(r - q, q)


@njit
def _shoup(x: np.int64, w: np.int64, ws: np.int64, q: np.int64) -> np.int64:
    """``x w mod q`` for ``x, w < q < 2^25`` and ``ws = floor(w 2^32 / q)``."""
    return _fix(x * w - ((x * ws) >> 32) * q - q, q)


@njit
def ntt(a: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.int64(q[row])
        x = a[row].view(np.int64)
        w_all, ws_all = psi[row].view(np.int64), psi_s[row].view(np.int64)
        m, t = 1, n
        while m < n:
            t >>= 1
            for i in range(m):
                w, ws = w_all[m + i], ws_all[m + i]
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = _shoup(x[j + t], w, ws, ql)
                    x[j] = _fix(u + v - ql, ql)
                    x[j + t] = _fix(u - v, ql)
            m <<= 1
    return a


@njit
def ntt_signed(c: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The NTT of signed int64 coefficients, reduced modulo each prime on the way in."""
    L, n = psi.shape[0], c.shape[0]
    a = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.int64(q[row])
        x = a[row].view(np.int64)
        for k in range(n):
            r = c[k] % ql
            x[k] = r + ((r >> 63) & ql)
    return ntt(a, psi, psi_s, q)


@njit
def intt(a: np.ndarray, psi: np.ndarray, psi_s: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.int64(q[row])
        x = a[row].view(np.int64)
        w_all, ws_all = psi[row].view(np.int64), psi_s[row].view(np.int64)
        m, t = n, 1
        while m > 1:
            h = m >> 1
            for i in range(h):
                w, ws = w_all[h + i], ws_all[h + i]
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = x[j + t]
                    x[j] = _fix(u + v - ql, ql)
                    x[j + t] = _shoup(_fix(u - v, ql), w, ws, ql)
            t <<= 1
            m = h
    return a


@njit
def mul_fixed(x: np.ndarray, w: np.ndarray, ws: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``x w mod q`` elementwise, ``w`` fixed (a key) with its Shoup companion ``ws``."""
    L, n = x.shape
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.int64(q[row])
        xr, wr, wsr = x[row].view(np.int64), w[row].view(np.int64), ws[row].view(np.int64)
        o = out[row].view(np.int64)
        for k in range(n):
            o[k] = _shoup(xr[k], wr[k], wsr[k], ql)
    return out


@njit
def zero(
    a: np.ndarray, s: np.ndarray, s_s: np.ndarray, te: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 = t e - a s mod q`` (``te`` already ``t NTT(e) mod q``)."""
    L, n = a.shape
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.int64(q[row])
        ar, sr, ssr = a[row].view(np.int64), s[row].view(np.int64), s_s[row].view(np.int64)
        ter, o = te[row].view(np.int64), out[row].view(np.int64)
        for k in range(n):
            o[k] = _fix(ter[k] - _shoup(ar[k], sr[k], ssr[k], ql), ql)
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
        br, o = b0[row].view(np.int64), out[row].view(np.int64)
        for k in range(n):
            acc = br[k]
            for c in range(count):
                acc += np.int64(values[c, row]) * np.int64(monomials[c, row, k])
            o[k] = _reduce(acc, ql, qf)
    return out


@njit
def products(
    theta_b: np.ndarray,
    theta_a: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    window: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)`` over the input ``(b, a)`` and the window's
    ``(W, 2, L, N)`` past inputs: ``c0`` read at the readers' coefficients ``(positions, L)``,
    ``c1`` and ``c2`` in NTT form."""
    terms, L, n = theta_b.shape
    positions = readers.shape[0]
    c0 = np.zeros((positions, L), dtype=np.int64)
    c1 = np.empty((L, n), dtype=np.uint64)
    c2 = np.empty((L, n), dtype=np.uint64)
    tb_all, ta_all = theta_b.view(np.int64), theta_a.view(np.int64)
    b_now, a_now = b.view(np.int64), a.view(np.int64)
    rd = readers.view(np.int64)
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        o1, o2 = c1[row].view(np.int64), c2[row].view(np.int64)
        acc = np.zeros(positions, dtype=np.int64)
        for k in range(n):
            tb, ta = tb_all[0, row, k], ta_all[0, row, k]
            vb, va = b_now[row, k], a_now[row, k]
            s0 = tb * vb
            s1 = tb * va + ta * vb
            s2 = ta * va
            for j in range(1, terms):
                tb, ta = tb_all[j, row, k], ta_all[j, row, k]
                vb, va = np.int64(window[j - 1, 0, row, k]), np.int64(window[j - 1, 1, row, k])
                s0 += tb * vb
                s1 += tb * va + ta * vb
                s2 += ta * va
            r0 = _reduce(s0, ql, qf)
            o1[k] = _reduce(s1, ql, qf)
            o2[k] = _reduce(s2, ql, qf)
            for p in range(positions):
                acc[p] += r0 * rd[p, row, k]
            if (k & 4095) == 4095:  # keep the sums of products below 2^63
                for p in range(positions):
                    acc[p] = _reduce(acc[p], ql, qf)
        for p in range(positions):
            c0[p, row] = _reduce(acc[p], ql, qf)
    return c0.view(np.uint64), c1, c2


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
    out = np.empty((positions, L), dtype=np.int64)
    rd = readers.view(np.int64)
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        c1r, c2r = c1[row].view(np.int64), c2[row].view(np.int64)
        sr, ssr = s[row].view(np.int64), s_s[row].view(np.int64)
        s2r, s2sr = s2[row].view(np.int64), s2_s[row].view(np.int64)
        acc = np.zeros(positions, dtype=np.int64)
        for k in range(n):
            d = _shoup(c1r[k], sr[k], ssr[k], ql) + _shoup(c2r[k], s2r[k], s2sr[k], ql)
            d = _fix(d - ql, ql)
            for p in range(positions):
                acc[p] += d * rd[p, row, k]
            if (k & 4095) == 4095:
                for p in range(positions):
                    acc[p] = _reduce(acc[p], ql, qf)
        for p in range(positions):
            out[p, row] = _reduce(acc[p], ql, qf)
    return out.view(np.uint64)


@njit
def reject_uniform(words: np.ndarray, q: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """Row ``i``: the first ``n`` values ``w >> 39`` of ``words[i]`` below ``q[i]``; False if a
    row ran short (then the caller draws more)."""
    L = words.shape[0]
    out = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = q[row]
        k = 0
        for w in words[row]:
            v = w >> np.uint64(39)
            if v < ql:
                out[row, k] = v
                k += 1
                if k == n:
                    break
        if k < n:
            return out, False
    return out, True
