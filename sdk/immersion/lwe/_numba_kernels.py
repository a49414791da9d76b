"""numba forms of :mod:`.kernels` (imported only when numba is installed; see there)."""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True)


@njit
def mulmod(x: int, y: int, q: int, qf: float) -> int:  # x, y < q < 2^25
    p = x * y
    r = p - np.int64(np.float64(p) * qf) * q
    if r < 0:
        r += q
    elif r >= q:
        r -= q
    return r


@njit
def ntt(a: np.ndarray, psi_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        x = a[row].astype(np.int64)
        m, t = 1, n
        while m < n:
            t //= 2
            for i in range(m):
                s = np.int64(psi_rev[row, m + i])
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = mulmod(x[j + t], s, ql, qf)
                    w = u + v
                    x[j] = w - ql if w >= ql else w
                    w = u - v
                    x[j + t] = w + ql if w < 0 else w
            m *= 2
        a[row] = x.astype(np.uint64)
    return a


@njit
def intt(a: np.ndarray, psi_inv_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    for row in range(L):
        ql = np.int64(q[row])
        qf = 1.0 / np.float64(ql)
        x = a[row].astype(np.int64)
        m, t = n, 1
        while m > 1:
            h = m // 2
            for i in range(h):
                s = np.int64(psi_inv_rev[row, h + i])
                j1 = 2 * i * t
                for j in range(j1, j1 + t):
                    u = x[j]
                    v = x[j + t]
                    w = u + v
                    x[j] = w - ql if w >= ql else w
                    w = u - v
                    x[j + t] = mulmod(w + ql if w < 0 else w, s, ql, qf)
            t *= 2
            m = h
        a[row] = x.astype(np.uint64)
    return a


@njit
def products(
    theta_b: np.ndarray, theta_a: np.ndarray, v_b: np.ndarray, v_a: np.ndarray, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    terms, L, n = theta_b.shape
    c0 = np.empty((L, n), dtype=np.uint64)
    c1 = np.empty((L, n), dtype=np.uint64)
    c2 = np.empty((L, n), dtype=np.uint64)
    for row in range(L):
        ql = np.uint64(q[row])
        for k in range(n):
            s0 = np.uint64(0)
            s1 = np.uint64(0)
            s2 = np.uint64(0)
            for j in range(terms):
                tb = theta_b[j, row, k]
                ta = theta_a[j, row, k]
                vb = v_b[j, row, k]
                va = v_a[j, row, k]
                s0 += tb * vb
                s1 += tb * va + ta * vb
                s2 += ta * va
            c0[row, k] = s0 % ql
            c1[row, k] = s1 % ql
            c2[row, k] = s2 % ql
    return c0, c1, c2
