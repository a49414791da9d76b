"""numba forms of :mod:`.kernels` (imported only when numba is installed; see there).

**Exact integers in float64 lanes.** Residues lie below ``q < 2^25``, so a product of two is
below ``2^50`` and exact in a double; so is ``floor(x w / q) q``. With the fixed quotient
``w / q`` (correctly rounded, the same on every CPU) the estimate ``floor(x (w / q))`` is off by
one at most, and ``x w - floor(x (w / q)) q`` is the exact remainder give or take ``q``: two
branch-free corrections make it exact. Doubles, unlike 64-bit integer products, fill AVX2's four
lanes, and no step depends on how a CPU rounds (every intermediate is an exact integer).

Sums of many products use centred residues (``|x| <= q / 2``, products below ``2^48``): up to 32
of them stay exact before one reduction. Reading a coefficient (a dot product of length ``N``)
multiplies int32 residues into int64 sums (``N <= 2^13`` terms below ``2^50``).
"""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)

#: Products of centred residues summed before one reduction (``32 * 2^48 <= 2^53``).
SUM_TERMS = 32


@njit
def _reduce(x: float, q: float, q_inv: float) -> float:
    """``x mod q`` in ``[0, q)`` for an integer-valued ``|x| < 2^53``."""
    r = x - np.floor(x * q_inv) * q
    r = r + q if r < 0.0 else r  # selects, not branches: these loops vectorise
    return r - q if r >= q else r


@njit
def _mulmod(x: float, w: float, w_q: float, q: float) -> float:
    """``x w mod q`` for ``0 <= x, w < q``, ``w_q = w / q``."""
    r = x * w - np.floor(x * w_q) * q
    r = r + q if r < 0.0 else r
    return r - q if r >= q else r


@njit
def _butterfly(x: np.ndarray, lo: int, hi: int, w: float, w_q: float, q: float) -> None:
    """Cooley-Tukey: ``(x_lo, x_hi) <- (x_lo + w x_hi, x_lo - w x_hi) mod q``."""
    u = x[lo]
    v = _mulmod(x[hi], w, w_q, q)
    s, d = u + v, u - v
    x[lo] = s - q if s >= q else s
    x[hi] = d + q if d < 0.0 else d


@njit
def _ntt_row(x: np.ndarray, w: np.ndarray, w_q: np.ndarray, q: float) -> None:
    """In-place forward negacyclic NTT of one row of float residues (bit-reversed output).

    Stages whose blocks hold at least eight butterflies run on the block's two halves as
    contiguous (vectorised) loops; the last three are unrolled over their blocks, so no stage
    pays a loop set-up per block of one, two or four butterflies.
    """
    n = x.shape[0]
    m, t = 1, n
    while t > 8:
        t >>= 1
        for i in range(m):
            base = 2 * i * t
            lo, hi = x[base : base + t], x[base + t : base + 2 * t]
            wi, wqi = w[m + i], w_q[m + i]
            for k in range(t):
                u = lo[k]
                v = _mulmod(hi[k], wi, wqi, q)
                s, d = u + v, u - v
                lo[k] = s - q if s >= q else s
                hi[k] = d + q if d < 0.0 else d
        m <<= 1
    for i in range(m):  # t = 4
        j = 8 * i
        wi, wqi = w[m + i], w_q[m + i]
        for k in range(4):
            _butterfly(x, j + k, j + k + 4, wi, wqi, q)
    m <<= 1
    for i in range(m):  # t = 2
        j = 4 * i
        wi, wqi = w[m + i], w_q[m + i]
        _butterfly(x, j, j + 2, wi, wqi, q)
        _butterfly(x, j + 1, j + 3, wi, wqi, q)
    m <<= 1
    for i in range(m):  # t = 1
        j = 2 * i
        _butterfly(x, j, j + 1, w[m + i], w_q[m + i], q)


@njit
def _to_uint64(x: np.ndarray, out: np.ndarray) -> None:
    for k in range(x.shape[0]):
        out[k] = np.uint64(np.int32(x[k]))


@njit
def ntt(a: np.ndarray, psi: np.ndarray, psi_q: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    x = np.empty(n, dtype=np.float64)
    for row in range(L):
        for k in range(n):
            x[k] = np.float64(np.int64(a[row, k]))
        _ntt_row(x, psi[row], psi_q[row], np.float64(q[row]))
        _to_uint64(x, a[row])
    return a


@njit
def ntt_signed(
    c: np.ndarray, scale: np.ndarray, psi: np.ndarray, psi_q: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """The NTT of ``scale[row] c`` (signed int64 coefficients, ``|c| < 2^53``) modulo each prime."""
    L, n = psi.shape[0], c.shape[0]
    out = np.empty((L, n), dtype=np.uint64)
    x = np.empty(n, dtype=np.float64)
    for row in range(L):
        ql = np.float64(q[row])
        q_inv = 1.0 / ql
        sc = np.float64(scale[row])
        for k in range(n):
            x[k] = _reduce(_reduce(np.float64(c[k]), ql, q_inv) * sc, ql, q_inv)
        _ntt_row(x, psi[row], psi_q[row], ql)
        _to_uint64(x, out[row])
    return out


@njit
def sample_cdt(uniform: np.ndarray, thresholds: np.ndarray, table: np.ndarray) -> np.ndarray:
    """How many thresholds lie at or below each uniform 64-bit word (a table sampler): the
    word's top 16 bits index ``table``; a bucket that a threshold splits (-1) counts in full."""
    n = uniform.shape[0]
    count = np.empty(n, dtype=np.int64)
    for k in range(n):
        u = uniform[k]
        c = np.int64(table[u >> np.uint64(48)])
        if c < 0:
            c = 0
            for t in thresholds:
                c += u >= t
        count[k] = c
    return count


@njit
def zero(
    a: np.ndarray, s: np.ndarray, s_q: np.ndarray, te: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 = t e - a s mod q`` as uint32 (``a`` uint32, ``te`` already ``NTT(t e)``;
    ``s_q = s / q``)."""
    L, n = a.shape
    out = np.empty((L, n), dtype=np.uint32)
    for row in range(L):
        ql = np.float64(q[row])
        ar, o = a[row].view(np.int32), out[row].view(np.int32)
        for k in range(n):
            r = np.float64(np.int64(te[row, k])) - _mulmod(
                np.float64(ar[k]), s[row, k], s_q[row, k], ql
            )
            o[k] = np.int32(r + ql if r < 0.0 else r)
    return out


@njit
def add_sparse(
    b0: np.ndarray, monomials: np.ndarray, values: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """``b0 + sum_c values[c, row] X^(p_c) mod q`` as uint32 residues; ``monomials`` and
    ``values`` centred (int32 and float64)."""
    L, n = b0.shape
    count = monomials.shape[0]
    out = np.empty((L, n), dtype=np.uint32)
    acc = np.empty(n, dtype=np.float64)
    for row in range(L):
        ql = np.float64(q[row])
        q_inv = 1.0 / ql
        b0r = b0[row].view(np.int32)
        for k in range(n):
            acc[k] = np.float64(b0r[k])
        for c in range(count):
            v = values[c, row]
            mono = monomials[c, row]
            for k in range(n):
                acc[k] += v * np.float64(mono[k])
            if c % (SUM_TERMS - 1) == SUM_TERMS - 2:  # keep the sum exact
                for k in range(n):
                    acc[k] = _reduce(acc[k], ql, q_inv)
        o = out[row].view(np.int32)
        for k in range(n):
            o[k] = np.int32(_reduce(acc[k], ql, q_inv))
    return out


@njit
def _centre(x: float, q: float) -> float:
    return x - q if x > 0.5 * q else x


@njit
def _read_row(r: np.ndarray, readers: np.ndarray, row: int, q: np.int64, out: np.ndarray) -> None:
    """``out[p, row] = sum_k r[k] readers[p, row, k] mod q`` (int32 factors, int64 sums)."""
    n = r.shape[0]
    for p in range(readers.shape[0]):
        rd = readers[p, row]
        acc = np.int64(0)
        for k in range(n):
            acc += np.int64(r[k]) * np.int64(rd[k])
        out[p, row] = acc % q


@njit
def products(
    theta_b: np.ndarray,
    theta_a: np.ndarray,
    b: np.ndarray,
    a: np.ndarray,
    window: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> np.ndarray:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)`` over the input ``(b, a)`` and the window's
    past inputs, as the wire's uint32 words: ``c0`` read at the readers' coefficients
    (``(positions, L)``), then ``c1`` and ``c2`` in NTT form (``(L, N)`` each).

    ``theta_*``: centred int32 ``(W + 1, L, N)``; ``b``, ``a``: uint32 ``(L, N)``; ``window``:
    uint32 ``(W, 2, L, N)``; ``readers``: int32 ``(positions, L, N)``.
    """
    terms, L, n = theta_b.shape
    positions = readers.shape[0]
    out = np.empty(positions * L + 2 * L * n, dtype=np.uint32)
    words = out.view(np.int32)
    c0 = np.empty((positions, L), dtype=np.int64)
    s0 = np.empty(n, dtype=np.float64)
    s1 = np.empty(n, dtype=np.float64)
    s2 = np.empty(n, dtype=np.float64)
    vb = np.empty(n, dtype=np.float64)
    va = np.empty(n, dtype=np.float64)
    r0 = np.empty(n, dtype=np.int32)
    for row in range(L):
        ql = np.float64(q[row])
        q_inv = 1.0 / ql
        s0[:] = 0.0
        s1[:] = 0.0
        s2[:] = 0.0
        for j in range(terms):
            if j == 0:
                br, ar = b[row].view(np.int32), a[row].view(np.int32)
                for k in range(n):
                    vb[k] = _centre(np.float64(br[k]), ql)
                    va[k] = _centre(np.float64(ar[k]), ql)
            else:
                wb, wa = window[j - 1, 0, row].view(np.int32), window[j - 1, 1, row].view(np.int32)
                for k in range(n):
                    vb[k] = _centre(np.float64(wb[k]), ql)
                    va[k] = _centre(np.float64(wa[k]), ql)
            tb, ta = theta_b[j, row], theta_a[j, row]
            for k in range(n):
                b_k, a_k = np.float64(tb[k]), np.float64(ta[k])
                s0[k] += b_k * vb[k]
                s1[k] += b_k * va[k] + a_k * vb[k]
                s2[k] += a_k * va[k]
            if j % (SUM_TERMS // 2) == SUM_TERMS // 2 - 1:  # s1 gains two products a term
                for k in range(n):
                    s0[k] = _reduce(s0[k], ql, q_inv)
                    s1[k] = _reduce(s1[k], ql, q_inv)
                    s2[k] = _reduce(s2[k], ql, q_inv)
        w1 = words[positions * L + row * n : positions * L + (row + 1) * n]
        w2 = words[positions * L + (L + row) * n : positions * L + (L + row + 1) * n]
        for k in range(n):
            r0[k] = np.int32(_reduce(s0[k], ql, q_inv))
            w1[k] = np.int32(_reduce(s1[k], ql, q_inv))
            w2[k] = np.int32(_reduce(s2[k], ql, q_inv))
        _read_row(r0, readers, row, np.int64(q[row]), c0)
    for p in range(positions):
        for row in range(L):
            words[p * L + row] = np.int32(c0[p, row])
    return out


@njit
def decrypt_read(
    c1: np.ndarray,
    c2: np.ndarray,
    s: np.ndarray,
    s2: np.ndarray,
    readers: np.ndarray,
    q: np.ndarray,
) -> tuple[np.ndarray, bool]:
    """Coefficients ``(positions, L)`` of ``c1 s + c2 s^2`` at the readers' positions, and
    whether every word of ``c1``, ``c2`` (uint32) was a residue."""
    L, n = c1.shape
    positions = readers.shape[0]
    out = np.empty((positions, L), dtype=np.int64)
    d = np.empty(n, dtype=np.int32)
    valid = True
    for row in range(L):
        ql = np.float64(q[row])
        q_inv = 1.0 / ql
        w1, w2 = c1[row].view(np.int32), c2[row].view(np.int32)
        sr, s2r = s[row], s2[row]
        bad = 0
        for k in range(n):
            x1, x2 = np.float64(w1[k]), np.float64(w2[k])
            bad += (x1 < 0.0) | (x1 >= ql) | (x2 < 0.0) | (x2 >= ql)
            d[k] = np.int32(_reduce(x1 * sr[k] + x2 * s2r[k], ql, q_inv))
        if bad:
            valid = False
        _read_row(d, readers, row, np.int64(q[row]), out)
    return out.view(np.uint64), valid


@njit
def reject_uniform(words: np.ndarray, q: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """Row ``i``: the first ``n`` values ``w >> 7`` of the uint32 ``words[i]`` below ``q[i]``;
    False if a row ran short (then the caller draws more)."""
    L, width = words.shape
    out = np.empty((L, n), dtype=np.uint32)
    for row in range(L):
        ql = np.uint32(q[row])
        wr, o = words[row], out[row]
        k = 0
        for i in range(width):
            v = wr[i] >> np.uint32(7)
            o[k] = v  # written always, kept only if below q: no branch to mispredict
            k += v < ql
            if k == n:
                break
        if k < n:
            return out, False
    return out, True


@njit
def intt(a: np.ndarray, psi: np.ndarray, psi_q: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place inverse NTT (Gentleman-Sande), without the final factor ``N^-1``."""
    L, n = a.shape
    x = np.empty(n, dtype=np.float64)
    for row in range(L):
        ql = np.float64(q[row])
        for k in range(n):
            x[k] = np.float64(np.int64(a[row, k]))
        m, t = n, 1
        while m > 1:
            h = m >> 1
            for i in range(h):
                w, w_q = psi[row, h + i], psi_q[row, h + i]
                base = np.uint64(2 * i * t)
                tt = np.uint64(t)
                for k in range(t):
                    j = base + np.uint64(k)
                    u, v = x[j], x[j + tt]
                    s, d = u + v, u - v
                    x[j] = s - ql if s >= ql else s
                    x[j + tt] = _mulmod(d + ql if d < 0.0 else d, w, w_q, ql)
            t <<= 1
            m = h
        _to_uint64(x, a[row])
    return a
