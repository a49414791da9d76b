"""Per-row norms of the key matrices, the inputs of the DP theorems."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowStats:
    """Row norms of one code ``(Pi, N)``; row i is element i of the encoded vector.

    Attributes
    ----------
    l1_signal: ``||Pi^i||_1`` (seed 002 Theorem 1, Laplace).
    l2_signal: ``||Pi^i||_2`` (seed 000 Theorem 2, Gaussian).
    l2_noise: ``||N^i||_2``.
    linf_noise: a lower bound on ``||N^i||_inf`` (exact for dense keys), used by the
        post-processing bound that holds for any linear mix of Laplace variables.
    """

    l1_signal: np.ndarray
    l2_signal: np.ndarray
    l2_noise: np.ndarray
    linf_noise: np.ndarray


def dense_row_stats(pi: np.ndarray, noise_basis: np.ndarray) -> RowStats:
    """Row statistics of explicit matrices ``Pi`` and ``N``."""
    return RowStats(
        l1_signal=np.abs(pi).sum(axis=1),
        l2_signal=np.linalg.norm(pi, axis=1),
        l2_noise=np.linalg.norm(noise_basis, axis=1)
        if noise_basis.shape[1]
        else np.zeros(pi.shape[0]),
        linf_noise=np.abs(noise_basis).max(axis=1)
        if noise_basis.shape[1]
        else np.zeros(pi.shape[0]),
    )
