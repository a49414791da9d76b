"""Hot integer loops of the RLWE controller: the negacyclic NTT and the sums of products.

Each function has a numpy form (always there) and a numba form (extra ``lwe``; compiled at first
use and cached on disk). Both compute the same integers: residues below ``2^25``, products below
``2^50``, reductions exact (numba's quotient estimate through a float64 is corrected to the exact
remainder). Set ``IMMERSION_NO_NUMBA=1`` to force the numpy forms.
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
        import numba
    except ImportError:
        return None
    return numba


def available() -> bool:
    """Whether the numba kernels are in use."""
    return _numba() is not None


# ---------------------------------------------------------------------- numpy forms
def _ntt_numpy(a: np.ndarray, psi_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    qq = q[:, None, None]
    m, t = 1, n
    while m < n:
        t //= 2
        view = a.reshape(L, m, 2, t)
        u = view[:, :, 0, :].copy()
        v = (view[:, :, 1, :] * psi_rev[:, m : 2 * m, None]) % qq
        view[:, :, 0, :] = (u + v) % qq
        view[:, :, 1, :] = (u + qq - v) % qq
        m *= 2
    return a


def _intt_numpy(a: np.ndarray, psi_inv_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    L, n = a.shape
    qq = q[:, None, None]
    m, t = n, 1
    while m > 1:
        h = m // 2
        view = a.reshape(L, h, 2, t)
        u = view[:, :, 0, :].copy()
        v = view[:, :, 1, :].copy()
        view[:, :, 0, :] = (u + v) % qq
        view[:, :, 1, :] = ((u + qq - v) % qq * psi_inv_rev[:, h:m, None]) % qq
        t *= 2
        m = h
    return a


def _products_numpy(
    theta_b: np.ndarray, theta_a: np.ndarray, v_b: np.ndarray, v_a: np.ndarray, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    qq = q[:, None]
    c0 = (theta_b * v_b).sum(axis=0, dtype=np.uint64) % qq
    c1 = (
        (theta_b * v_a).sum(axis=0, dtype=np.uint64) % qq
        + (theta_a * v_b).sum(axis=0, dtype=np.uint64) % qq
    ) % qq
    c2 = (theta_a * v_a).sum(axis=0, dtype=np.uint64) % qq
    return c0, c1, c2


@functools.lru_cache(maxsize=1)
def _compiled() -> Any:
    from . import _numba_kernels  # compiled at first call, cached on disk (numba's cache)

    return _numba_kernels


# ---------------------------------------------------------------------- dispatch
def ntt(a: np.ndarray, psi_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place forward negacyclic NTT of ``(L, N)`` uint64 residues (bit-reversed output)."""
    if available():
        return _compiled().ntt(a, psi_rev, q)
    return _ntt_numpy(a, psi_rev, q)


def intt(a: np.ndarray, psi_inv_rev: np.ndarray, q: np.ndarray) -> np.ndarray:
    """In-place inverse of :func:`ntt`, without the final factor ``N^-1``."""
    if available():
        return _compiled().intt(a, psi_inv_rev, q)
    return _intt_numpy(a, psi_inv_rev, q)


def products(
    theta_b: np.ndarray, theta_a: np.ndarray, v_b: np.ndarray, v_a: np.ndarray, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``sum_j (theta_b + theta_a s)(v_b + v_a s)`` as a degree-2 ciphertext ``(c0, c1, c2)``.

    Inputs ``(terms, L, N)`` uint64 NTT residues; ``terms`` up to ``2^12`` (the uint64 sums of
    products below ``2^50`` cannot wrap).
    """
    if theta_b.shape[0] > 2**12:
        raise ValueError("at most 4096 products are summed before one reduction")
    if available():
        return _compiled().products(theta_b, theta_a, v_b, v_a, q)
    return _products_numpy(theta_b, theta_a, v_b, v_a, q)
