"""Per-element DP conditions of the seeds, as plain functions of key row norms.

* Laplace, seed 002 Theorem 1 (eqs. 27-37): element i of ``Pi y + N s`` is eps-DP when
  ``||Pi^i||_1 Delta_1 / (||N^i||_2 sigma) <= eps``. The proof treats ``N^i s`` (a sum of several
  Laplace variables) as Laplace with scale ``||N^i||_2 sigma``; that step is not exact.
* Laplace, provable variant: ``N^i s`` contains the single term ``N^i_k s_k``, and adding the
  other independent terms is post-processing, so ``||Pi^i||_1 Delta_1 / (||N^i||_inf sigma)``
  is a valid bound for any mix (it is larger, i.e. weaker, than Theorem 1's number).
* Gaussian, seed 000 Theorem 2 (eq. 44, proof eqs. 45-53) with the closed form of
  ../notes/seed000.md section 8: with ``s = ||Pi^i||_2 Delta_2`` the condition is
  ``sigma_bar >= s/(2 eps) (Q^-1(delta) + sqrt(Q^-1(delta)^2 + 2 eps))``; exact, because a
  linear mix of Gaussians is Gaussian.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm


def laplace_epsilon(
    signal_sensitivity: np.ndarray, noise_norm: np.ndarray, scale: float
) -> np.ndarray:
    """Per-element epsilon ``sens_i / (noise_norm_i * scale)`` (seed 002 Theorem 1).

    Examples
    --------
    >>> float(laplace_epsilon(np.array([1e-4]), np.array([1e4]), 1e4)[0])  # the paper's setting
    1e-12
    """
    return signal_sensitivity / (noise_norm * scale)


def laplace_scale_for(
    signal_sensitivity: np.ndarray, noise_norm: np.ndarray, epsilon: float
) -> float:
    """Smallest Laplace scale meeting ``epsilon`` at every element (Theorem 1 solved for sigma)."""
    return float(np.max(signal_sensitivity / (noise_norm * epsilon)))


def gaussian_min_sigma_bar(
    signal_sensitivity: np.ndarray, epsilon: float, delta: float
) -> np.ndarray:
    """Smallest element noise std meeting (epsilon, delta), seed 000 eq. 44 in closed form.

    Examples
    --------
    >>> round(float(gaussian_min_sigma_bar(np.array([1e-3 * 0.33]), 1e-11, 1e-5)[0]) / 1e8, 2)
    1.41
    """
    q = norm.isf(delta)
    return signal_sensitivity / (2.0 * epsilon) * (q + np.sqrt(q * q + 2.0 * epsilon))


def gaussian_epsilon(
    signal_sensitivity: np.ndarray, sigma_bar: np.ndarray, delta: float
) -> np.ndarray:
    """Smallest epsilon meeting eq. 44 at element noise std ``sigma_bar`` (the inverse of above)."""
    q = norm.isf(delta)
    return signal_sensitivity * q / sigma_bar + signal_sensitivity**2 / (2.0 * sigma_bar**2)
