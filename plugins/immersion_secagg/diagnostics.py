"""Checks of seed 001's assumptions and the exact Renyi divergence of two Gaussians (notes 6(d), 8).

``G`` is always the paper's ``(K, D)`` matrix of clipped per-example gradients, one per column.

* :func:`lemma2_holds`: Lemma 2, ``lambda_max(G G^T / D) <= C^2``;
* :func:`covariance_is_singular`: the over-parameterisation check, ``rank(G) < K``, i.e.
  Assumption 3 fails and Theorem 2 does not apply (always so when ``D < K``);
* :func:`min_eigenvalue_sum`: ``Lambda = sum_i lambda_min(G_i G_i^T / D)``, the input of Theorem 2
  (eq. 19) in the eq. 16 convention;
* :func:`in_span`: Theorem 1's necessary condition, is a replacement gradient in the span of all
  users' gradients? **Test-only**: it needs every user's individual gradients, which secure
  aggregation exists to hide; running it at the server breaks secure aggregation (Remark 2);
* :func:`gaussian_renyi_divergence`: ``D_alpha(N(mu1, cov1) || N(mu2, cov2))`` in closed form (eq.
  22, Gil et al. 2013), to check eqs. 19 and 35 against the exact divergence of neighbouring
  aggregates.

Note that ``lambda_min`` of a user's covariance is data-dependent (notes 9.9): these functions are
for analysis and tests, not for release.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from immersion import InvalidArgumentError

from .updates import _gradients, _nonnegative

#: Relative slack of :func:`lemma2_holds` for rounding in ``||G||_2^2``.
LEMMA2_RTOL = 1e-12


def lemma2_holds(G: np.ndarray, clip: float) -> bool:
    """Lemma 2: ``lambda_max(Sigma_i) <= C^2``, ``Sigma_i = G G^T / D`` (eq. 16), up to 1 + 1e-12.

    True whenever every column has norm ``<= C`` (``x^T Sigma_i x = (1/D) sum_j (g_j^T x)^2``).

    Examples
    --------
    >>> lemma2_holds(np.array([[0.6, 1.0], [0.8, 0.0]]), 1.0)
    True
    >>> lemma2_holds(np.array([[3.0], [4.0]]), 1.0)
    False
    """
    g = _gradients(G)
    c = _nonnegative(clip, "clip")
    if c == 0:
        raise InvalidArgumentError("clip", "expected > 0, got 0")
    lam_max = float(np.linalg.norm(g, 2)) ** 2 / g.shape[1]
    return lam_max <= c**2 * (1 + LEMMA2_RTOL)


def covariance_is_singular(G: np.ndarray) -> bool:
    """Over-parameterisation check (notes 6(d)): ``rank(G) < K``, so ``G G^T / D`` is singular.

    Then Assumption 3 fails and Theorem 2 is inapplicable; ``rank <= D``, so this is always true
    when ``D < K``. The rank uses NumPy's default SVD tolerance.

    Examples
    --------
    >>> covariance_is_singular(np.ones((3, 2))), covariance_is_singular(np.eye(3))
    (True, False)
    """
    g = _gradients(G)
    return int(np.linalg.matrix_rank(g)) < g.shape[0]


def min_eigenvalue_sum(Gs: Sequence[np.ndarray]) -> float:
    """``Lambda = sum_i lambda_min(G_i G_i^T / D_i)`` over users (Theorem 2, eq. 19; eq. 16).

    Computed from the smallest singular value of each ``G_i`` (``0`` when ``D_i < K``), which is
    more accurate than an eigensolver on ``G_i G_i^T`` for small eigenvalues.

    Examples
    --------
    >>> min_eigenvalue_sum([np.eye(2), 2 * np.eye(2)])         # 1/2 + 4/2
    2.5
    """
    if isinstance(Gs, np.ndarray) and Gs.ndim == 2:
        raise InvalidArgumentError(
            "Gs", "expected a sequence of (K, D) arrays, one per user, got one 2-D array"
        )
    try:
        mats = [_gradients(g, "Gs") for g in Gs]
    except TypeError:
        raise InvalidArgumentError(
            "Gs", "expected a sequence of (K, D) arrays, one per user"
        ) from None
    if not mats:
        raise InvalidArgumentError("Gs", "expected at least one user")
    if len({m.shape[0] for m in mats}) != 1:
        raise InvalidArgumentError("Gs", "expected the same model dimension K for every user")
    total = 0.0
    for m in mats:
        k, d = m.shape
        if d >= k:
            total += float(np.linalg.svd(m, compute_uv=False)[-1]) ** 2 / d
    return total


def in_span(g_new: np.ndarray, G_all: np.ndarray | Sequence[np.ndarray], tol: float = 1e-9) -> bool:
    """Theorem 1's necessary condition: is ``g_new`` in the span of all users' example gradients?

    ``||g_new - P g_new|| <= tol * max(||g_new||, 1e-300)`` with ``P`` the orthogonal projector on
    ``span(G_all)`` (rank by NumPy's default SVD tolerance). If it fails, the aggregate under the
    neighbouring dataset leaves the support of the original one with probability
    ``Pr[w_ij != 0]`` (1 under Gaussian sampling): no DP without added noise.

    **Test-only.** It needs every individual gradient, which secure aggregation hides; computing it
    at the server breaks secure aggregation (Remark 2).

    Parameters
    ----------
    g_new:
        The replacement gradient, shape ``(K,)``.
    G_all:
        All users' gradients as columns, ``(K, M)``, or a sequence of per-user ``(K, D_i)`` arrays.
    tol:
        Relative tolerance on the residual, ``>= 0``.

    Examples
    --------
    >>> G = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> in_span(np.array([2.0, -1.0, 0.0]), G), in_span(np.array([0.0, 0.0, 1.0]), [G])
    (True, False)
    """
    if isinstance(G_all, np.ndarray):
        mat = _gradients(G_all, "G_all")
    else:
        try:
            parts = [_gradients(g, "G_all") for g in G_all]
        except TypeError:
            raise InvalidArgumentError(
                "G_all", "expected a (K, M) array or a sequence of (K, D_i) arrays"
            ) from None
        if not parts or len({p.shape[0] for p in parts}) != 1:
            raise InvalidArgumentError(
                "G_all", "expected one or more arrays with the same number of rows K"
            )
        mat = np.hstack(parts)
    try:
        g = np.asarray(g_new, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError("g_new", "expected a real (K,) vector") from None
    if g.shape != (mat.shape[0],) or not np.all(np.isfinite(g)):
        raise InvalidArgumentError(
            "g_new", f"expected a finite vector of shape ({mat.shape[0]},), got {g.shape}"
        )
    tol = _nonnegative(tol, "tol")
    u, s, _ = np.linalg.svd(mat, full_matrices=False)
    rank = int(np.sum(s > s.max(initial=0.0) * max(mat.shape) * np.finfo(np.float64).eps))
    basis = u[:, :rank]
    residual = g - basis @ (basis.T @ g)
    return float(np.linalg.norm(residual)) <= tol * max(float(np.linalg.norm(g)), 1e-300)


def _mean(mu: object, name: str, k: int | None) -> np.ndarray:
    try:
        arr = np.asarray(mu, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, "expected a real vector") from None
    if (
        arr.ndim != 1
        or arr.size == 0
        or (k is not None and arr.size != k)
        or not np.all(np.isfinite(arr))
    ):
        raise InvalidArgumentError(
            name, f"expected a finite vector of length {k or 'K >= 1'}, got shape {arr.shape}"
        )
    return arr


def _covariance(cov: object, name: str, k: int) -> tuple[np.ndarray, float]:
    """Symmetric positive definite ``(K, K)`` matrix and its log-determinant."""
    try:
        arr = np.asarray(cov, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidArgumentError(name, "expected a real (K, K) matrix") from None
    if arr.shape != (k, k) or not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(
            name, f"expected a finite ({k}, {k}) matrix, got shape {arr.shape}"
        )
    if not np.allclose(arr, arr.T, rtol=1e-10, atol=1e-14 * max(float(np.abs(arr).max()), 1.0)):
        raise InvalidArgumentError(name, "expected a symmetric matrix")
    arr = (arr + arr.T) / 2
    try:
        chol = np.linalg.cholesky(arr)
    except np.linalg.LinAlgError:
        raise InvalidArgumentError(name, "expected a positive definite matrix") from None
    return arr, 2.0 * float(np.sum(np.log(np.diag(chol))))


def gaussian_renyi_divergence(
    alpha: float, mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray, cov2: np.ndarray
) -> float:
    """Exact ``D_alpha(N(mu1, cov1) || N(mu2, cov2))`` (eq. 22, Gil et al. 2013, Table 2).

    With ``Sigma_alpha = (1 - alpha) cov1 + alpha cov2`` and ``dmu = mu1 - mu2``::

        D_alpha = (alpha/2) dmu^T Sigma_alpha^{-1} dmu
                  - 1/(2 (alpha - 1)) log(|Sigma_alpha| / (|cov1|^(1 - alpha) |cov2|^alpha))

    Returns ``inf`` when ``Sigma_alpha`` is not positive definite (possible for ``alpha > 1``: the
    integral defining ``D_alpha`` diverges).

    Parameters
    ----------
    alpha:
        The order, ``alpha > 0`` and ``alpha != 1``.
    mu1, cov1:
        Mean ``(K,)`` and positive definite covariance ``(K, K)`` of the first law ``P``.
    mu2, cov2:
        The same for the second law ``Q``.

    Examples
    --------
    >>> one = np.eye(1)                            # equal variances: alpha dmu^2 / (2 sigma^2)
    >>> round(gaussian_renyi_divergence(2.0, np.zeros(1), one, np.ones(1), one), 12)
    1.0
    >>> gaussian_renyi_divergence(2.0, np.zeros(1), one, np.zeros(1), 0.4 * one)
    inf
    """
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise InvalidArgumentError("alpha", f"expected a real number, got {alpha!r}") from None
    if not (a > 0 and math.isfinite(a) and a != 1):
        raise InvalidArgumentError("alpha", f"expected a finite alpha > 0, alpha != 1, got {alpha}")
    m1 = _mean(mu1, "mu1", None)
    k = m1.size
    m2 = _mean(mu2, "mu2", k)
    c1, logdet1 = _covariance(cov1, "cov1", k)
    c2, logdet2 = _covariance(cov2, "cov2", k)
    mixed = (1 - a) * c1 + a * c2
    try:
        chol = np.linalg.cholesky(mixed)
    except np.linalg.LinAlgError:
        return math.inf
    logdet_mixed = 2.0 * float(np.sum(np.log(np.diag(chol))))
    dmu = m1 - m2
    white = np.linalg.solve(chol, dmu)  # chol^{-1} dmu: dmu^T Sigma_alpha^{-1} dmu = ||white||^2
    quad = float(white @ white)
    log_ratio = logdet_mixed - (1 - a) * logdet1 - a * logdet2
    return max(a / 2 * quad - log_ratio / (2 * (a - 1)), 0.0)
