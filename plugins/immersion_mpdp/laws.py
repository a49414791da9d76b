"""The key and noise laws of MP-DP (seed 004 Theorem 3, Eqs. 13, 16 and 19).

Theorem 3 splits a Gaussian into a product: ``Z = X_1...X_m * Y_1...Y_n`` with ``X ~ DN*(m)`` and
``Y ~ DN(sigma, n)``. The scheme uses ``m = 1, 2`` and ``n = 1``, for which closed forms exist
(seed 004 notes section 4.1, each checked here by a KS test in ``tests/test_mpdp.py``):

* ``DN(sigma, 1) = Uniform(-sqrt(2) sigma, sqrt(2) sigma)`` (the clients' noise);
* ``|DN*(1)| = sqrt(Gamma(3/2, 1))``, so ``|DN*(1)| * DN(sigma, 1) ~ N(0, sigma^2)``;
* ``DN*(2)``: two ways. ``"pair"`` (the default, exact) draws the two factors of a product
  ``r_i s_j`` from *different* laws, ``2^(1/4) Gamma(3/4)^(1/4)`` and ``2^(1/4) Gamma(5/4)^(1/4)``,
  whose product is exactly ``sqrt(Gamma(3/2))`` by Legendre's duplication formula. It meets
  Theorems 5 and 6 exactly, not the paper's literal "i.i.d. DN*(2)". ``"series"`` samples the
  paper's i.i.d. law from the series of Theorem 3 truncated after ``SERIES_TERMS`` terms; the
  left-out tail has a standard deviation of about ``1 / (2 sqrt(2 SERIES_TERMS)) = 0.008`` in
  ``log |X|`` (and passed a KS test at 10^5 samples).

Server keys must be strictly positive (ReLU commutes only with positive scaling): they use
``|DN*|``; the sign of the product comes from the clients' noise, whose law is symmetric.
"""

from __future__ import annotations

import numpy as np
from immersion import InvalidArgumentError

#: Terms kept in the series of Theorem 3 for ``DN*(2)`` with ``law="series"``.
SERIES_TERMS = 4000
DN2_LAWS = ("pair", "series")


def uniform_dn(sigma: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``DN(sigma, 1)`` draws: ``Uniform(-sqrt(2) sigma, sqrt(2) sigma)`` (Eqs. 16 and 19).

    Examples
    --------
    >>> x = uniform_dn(1.0, (100_000,), np.random.default_rng(0))
    >>> bool(np.abs(x).max() <= np.sqrt(2)), round(float(x.var()), 2)   # variance 2 sigma^2 / 3
    (True, 0.67)
    """
    if not sigma >= 0:
        raise InvalidArgumentError("sigma", f"expected >= 0, got {sigma}")
    bound = np.sqrt(2.0) * sigma
    return rng.uniform(-bound, bound, size=shape)


def abs_dn_star_1(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``|DN*(1)| = sqrt(Gamma(3/2, 1))``: strictly positive, ``E[X^2] = 3/2``."""
    return np.sqrt(rng.gamma(1.5, 1.0, size=shape))


def abs_dn_star_2(
    shape: tuple[int, ...], rng: np.random.Generator, *, law: str = "pair", factor: str = "left"
) -> np.ndarray:
    """``|DN*(2)|`` draws. With ``law="pair"`` the ``left`` factor (``r``) and the ``right`` one
    (``s``) have different laws whose product is exactly ``|DN*(1)|``; see the module docstring."""
    if law == "pair":
        if factor not in ("left", "right"):
            raise InvalidArgumentError("factor", f"expected 'left' or 'right', got {factor!r}")
        shape_param = 0.75 if factor == "left" else 1.25
        return 2.0**0.25 * rng.gamma(shape_param, 1.0, size=shape) ** 0.25
    if law == "series":
        return _dn_star_series(2, shape, rng)
    raise InvalidArgumentError("law", f"expected one of {DN2_LAWS}, got {law!r}")


def _dn_star_series(m: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """``|DN*(m)|`` from Theorem 3's series, truncated after ``SERIES_TERMS`` terms."""
    ell = np.arange(1, SERIES_TERMS + 1, dtype=np.float64)
    drift = float(np.sum(np.log1p(1.0 / ell))) / (2 * m)
    size = int(np.prod(shape))
    log_x = np.full(size, drift)
    chunk = max(1, 2_000_000 // SERIES_TERMS)
    for start in range(0, size, chunk):
        stop = min(size, start + chunk)
        gammas = rng.gamma(1.0 / m, 1.0, size=(stop - start, SERIES_TERMS))
        log_x[start:stop] -= gammas @ (1.0 / (2 * ell + 1))
    return np.exp(log_x).reshape(shape)
