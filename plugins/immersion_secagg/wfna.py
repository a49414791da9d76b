"""Water-filling noise addition, WF-NA (seed 001 section 5.1), sampled exactly.

With the WF-NA covariance convention ``Sigma_i = G G^T / (B D)`` (``G`` of shape ``(K, D)``, clipped
per-example gradients as columns; this already includes the ``1/B`` of eq. 18) and its
eigendecomposition ``Sigma_i = U diag(lambda) U^T``, WF-NA floors every eigenvalue at ``sigma2``:
``Sigma_{i,+} = U diag(max(lambda, sigma2)) U^T``, and adds

    ``n ~ N(0, Delta Sigma)``,
    ``Delta Sigma = Sigma_{i,+} - Sigma_i = U diag((sigma2 - lambda)_+) U^T``

(step 4). Combined with Gaussian sampling
(:func:`immersion_secagg.updates.gaussian_sampling_update`, independent of ``n``) the user's update
has covariance ``Sigma_{i,+} >= sigma2 I``: the GSGD-DP mechanism of Theorem 4 (eq. 35). Noise goes
only along eigen-directions with ``lambda < sigma2``, ``sigma2`` exactly along the null space of
``G^T``, and ``tr(Delta Sigma) <= K sigma2``.

Two exact samplers:

* :func:`wfna_noise_full`: ``eigh`` of the ``K x K`` matrix, ``O(K^2 D + K^3)``;
* :func:`wfna_noise_lowrank` (notes 6(b)): the thin SVD ``G = U_r S V_r^T`` gives
  ``lambda = s^2/(B D)`` on ``span(U_r)`` and ``0`` on its complement, so with ``z ~ N(0, I_K)``
  ``n = sigma (z - U_r U_r^T z) + U_r (sqrt((sigma2 - lambda)_+) * U_r^T z)``, of covariance
  ``sigma2 (I - U_r U_r^T) + U_r diag((sigma2 - lambda)_+) U_r^T = Delta Sigma`` exactly, in
  ``O(K D^2)``: the over-parameterised case ``D < K`` never forms a ``K x K`` matrix.

:func:`wfna_noise` picks the low-rank sampler when ``D < K``.

Not implemented, on purpose: the paper's blockwise approximation (split the coordinates into ``k``
blocks and floor each block's covariance separately). It ignores the cross-block covariance and does
*not* keep the guarantee (notes 9.7): for ``Sigma = [[1, 1], [1, 1]]``, ``sigma2 = 1`` and two 1 x 1
blocks, each block already has variance ``1 >= sigma2`` so no noise is added, yet the total
covariance has ``lambda_min = 0``; exact WF-NA adds variance 1 along ``(1, -1)/sqrt(2)``.
"""

from __future__ import annotations

import math

import numpy as np
from immersion import InvalidArgumentError

from .updates import _batch, _generator, _gradients, _nonnegative

METHODS = ("auto", "full", "lowrank")


def _eig(G: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (``>= 0``, ascending) and eigenvectors of ``G G^T / (B D)``."""
    g = _gradients(G)
    b = _batch(batch, g.shape[1])
    lam, u = np.linalg.eigh(g @ g.T / (b * g.shape[1]))
    return np.maximum(lam, 0.0), u


def _thin(G: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``U_r`` (``K x min(K, D)``, orthonormal) and ``lambda = s^2 / (B D)``: thin SVD of ``G``."""
    g = _gradients(G)
    b = _batch(batch, g.shape[1])
    u, s, _ = np.linalg.svd(g, full_matrices=False)
    return u, s**2 / (b * g.shape[1])


def wfna_covariance(G: np.ndarray, batch: int, sigma2: float) -> np.ndarray:
    """The exact ``K x K`` WF-NA covariance ``Delta Sigma = U diag((sigma2 - lambda)_+) U^T``.

    Section 5.1, step 4.

    For tests and diagnostics; the samplers do not need it.

    Parameters
    ----------
    G : np.ndarray
        Clipped per-example gradients as columns, shape ``(K, D)``.
    batch : int
        ``B``; the floored covariance is ``Sigma_i = G G^T / (B D)``.
    sigma2 : float
        The eigenvalue floor ``sigma2 >= 0``.

    Examples
    --------
    >>> G = np.array([[2.0, 0.0], [0.0, 0.0]])           # Sigma_i = diag(2, 0) with B = 1, D = 2
    >>> wfna_covariance(G, 1, 1.0).tolist()
    [[0.0, 0.0], [0.0, 1.0]]
    """
    s2 = _nonnegative(sigma2, "sigma2")
    lam, u = _eig(G, batch)
    cov = (u * np.maximum(s2 - lam, 0.0)) @ u.T
    return (cov + cov.T) / 2


def wfna_noise_full(
    G: np.ndarray, batch: int, sigma2: float, rng: np.random.Generator
) -> np.ndarray:
    """WF-NA noise ``n ~ N(0, Delta Sigma)`` by a full eigendecomposition of ``G G^T / (B D)``.

    Section 5.1.

    ``n = U (sqrt((sigma2 - lambda)_+) * z)`` with ``z ~ N(0, I_K)`` (one ``standard_normal(K)``
    draw). ``O(K^2 D + K^3)`` time and ``O(K^2)`` memory.

    Examples
    --------
    >>> G = np.array([[2.0, 0.0], [0.0, 0.0]])    # lambda = (2, 0): noise only on the 2nd axis
    >>> n = wfna_noise_full(G, 1, 1.0, np.random.default_rng(0))
    >>> float(n[0]) == 0.0, n.shape
    (True, (2,))
    """
    s2 = _nonnegative(sigma2, "sigma2")
    lam, u = _eig(G, batch)
    z = _generator(rng).standard_normal(lam.size)
    return u @ (np.sqrt(np.maximum(s2 - lam, 0.0)) * z)


def wfna_noise_lowrank(
    G: np.ndarray, batch: int, sigma2: float, rng: np.random.Generator
) -> np.ndarray:
    """WF-NA noise ``n ~ N(0, Delta Sigma)`` from the thin SVD of ``G`` (notes 6(b)), ``O(K D^2)``.

    With ``G = U_r S V_r^T``, ``lambda = s^2 / (B D)`` and ``z ~ N(0, I_K)`` (one
    ``standard_normal(K)`` draw):
    ``n = sigma (z - U_r U_r^T z) + U_r (sqrt((sigma2 - lambda)_+) * U_r^T z)``, whose covariance
    ``sigma2 (I - U_r U_r^T) + U_r diag((sigma2 - lambda)_+) U_r^T`` equals :func:`wfna_covariance`.

    Examples
    --------
    >>> G = np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])   # K = 3, D = 2: lambda = 2 on axis 1
    >>> n = wfna_noise_lowrank(G, 1, 1.0, np.random.default_rng(0))
    >>> abs(float(n[0])) < 1e-15, n.shape
    (True, (3,))
    """
    s2 = _nonnegative(sigma2, "sigma2")
    u, lam = _thin(G, batch)
    z = _generator(rng).standard_normal(u.shape[0])
    coef = u.T @ z
    return math.sqrt(s2) * (z - u @ coef) + u @ (np.sqrt(np.maximum(s2 - lam, 0.0)) * coef)


def wfna_noise(
    G: np.ndarray, batch: int, sigma2: float, rng: np.random.Generator, method: str = "auto"
) -> np.ndarray:
    """WF-NA noise ``n ~ N(0, Delta Sigma)`` (section 5.1), by the exact sampler ``method`` picks.

    Both samplers are exact; they consume the generator alike (one ``standard_normal(K)`` draw)
    but map it differently.

    Parameters
    ----------
    G : np.ndarray
        Clipped per-example gradients as columns, shape ``(K, D)``.
    batch : int
        ``B``; the floored covariance is ``Sigma_i = G G^T / (B D)``.
    sigma2 : float
        The eigenvalue floor ``sigma2 >= 0``.
    rng : np.random.Generator
        Source of the noise.
    method : {"auto", "full", "lowrank"}
        ``"auto"``: :func:`wfna_noise_lowrank` when ``D < K`` (over-parameterised: ``Sigma_i`` is
        singular), :func:`wfna_noise_full` otherwise.

    Returns
    -------
    np.ndarray
        The noise, shape ``(K,)``.

    Examples
    --------
    >>> G = np.ones((4, 2))
    >>> a = wfna_noise(G, 1, 0.5, np.random.default_rng(1))
    >>> bool(np.array_equal(a, wfna_noise_lowrank(G, 1, 0.5, np.random.default_rng(1))))
    True
    """
    if method not in METHODS:
        raise InvalidArgumentError("method", f"expected one of {METHODS}, got {method!r}")
    if method == "auto":
        k, d = _gradients(G).shape
        method = "lowrank" if d < k else "full"
    sampler = wfna_noise_lowrank if method == "lowrank" else wfna_noise_full
    return sampler(G, batch, sigma2, rng)
