"""How much DP the secure-aggregation sum gives, and with how much added noise (seed 001).

Per-round Renyi DP of the aggregate ``x = sum_i x_i`` for one record of one user, under
replacement of that record (|D_i| = D for every user), with per-example gradients clipped to C:

* :func:`rdp_theorem2`, eq. 19 (Gaussian-sampling updates, no added noise):
  ``(2 a B C^2 / D^2 + a C^2 / ((a - 1) D)) / (Lambda - a C^2 / D)`` for ``1 < a < D Lambda / C^2``,
  where ``Lambda = sum_i lambda_min(G_i G_i^T / D)`` (the covariance convention of eq. 16);
* :func:`rdp_theorem4`, eq. 35 (Gaussian sampling + WF-NA with eigenvalue floor ``sigma2`` on
  ``G G^T / (B D)``): ``(2 a C^2 / D^2 + 2 a C^2 / ((a - 1) B D)) / (N sigma2 - 2 a C^2 / (B D))``.
  Valid while the denominator is positive, ``a < N B D sigma2 / (2 C^2)`` (our re-derivation, seed
  001 notes section 9.4); ``strict_range=True`` uses the paper's stated, B times narrower range
  ``a < N D sigma2 / (2 C^2)``, which can be empty. Eq. 38, a step of its proof, is false in
  general (notes 8.7); the bound held on every instance we tested (``tests/test_secagg.py``), but
  it is the paper's claim, not a proven one;
* Table 1's isotropic rows: GD ``2 a C^2 / (D^2 N sigma2)``; SGD with IID sampling
  ``2 a C^2 / (B^2 N sigma2)`` before amplification by sampling; Gaussian sampling + isotropic noise
  ``(2 a C^2 / D^2 + a C^2 / ((a - 1) B D)) / (N sigma2 - a C^2 / (B D))``.

RDP adds over rounds; :func:`epsilon_from_rdp` converts with Lemma 1 (Mironov:
``eps = rdp(a) + log(1/delta) / (a - 1)``), minimised over the valid range of ``a`` (the function is
convex there, so a bounded 1-D search finds the minimum; it may sit at the open boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from immersion import InvalidArgumentError
from scipy.optimize import minimize_scalar


@dataclass(frozen=True)
class Setting:
    """The public parameters of one round: users N, samples per user D, batch B, clip C.

    Parameters
    ----------
    users : int
        ``N``, the users whose updates are summed (the contributors, not the number invited).
    samples : int
        ``D``, records per user (the same for every user).
    batch : int
        ``B <= D``, the batch size of the sampling.
    clip : float
        ``C``, the per-example gradient clip.

    Examples
    --------
    >>> Setting(users=50, samples=1200, batch=32, clip=10.0).batch
    32
    """

    users: int
    samples: int
    batch: int
    clip: float

    def __post_init__(self) -> None:
        for name in ("users", "samples", "batch"):
            if int(getattr(self, name)) < 1:
                raise InvalidArgumentError(name, f"expected >= 1, got {getattr(self, name)}")
        if self.batch > self.samples:
            raise InvalidArgumentError(
                "batch", f"expected <= samples ({self.samples}), got {self.batch}"
            )
        if not (self.clip > 0 and 0 < self.clip * self.clip < math.inf):  # every bound uses C^2
            raise InvalidArgumentError(
                "clip", f"expected > 0 with a finite, non-zero square, got {self.clip}"
            )


@dataclass(frozen=True)
class Guarantee:
    """``(epsilon, delta)`` after ``rounds`` rounds, the order ``alpha`` that gave it, the bound.

    Parameters
    ----------
    epsilon, delta : float
        The DP guarantee (``epsilon`` is ``inf`` when the order's range is empty).
    alpha : float
        The Renyi order that gave ``epsilon`` (NaN if none).
    rounds : int
        Rounds composed.
    alpha_max : float
        End of the valid range of orders.
    mechanism : str
        The theorem or Table 1 row, in words.
    """

    epsilon: float
    delta: float
    alpha: float
    rounds: int
    alpha_max: float
    mechanism: str


def _positive(value: float, name: str) -> float:
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgumentError(name, f"expected a finite value > 0, got {value}")
    return float(value)


def theorem2_alpha_max(s: Setting, min_eig_sum: float) -> float:
    """End of eq. 19's range: ``D Lambda / C^2`` (empty if ``C^2 / D >= Lambda``)."""
    return s.samples * _positive(min_eig_sum, "min_eig_sum") / s.clip**2


def rdp_theorem2(alpha: float, s: Setting, min_eig_sum: float) -> float:
    """Eq. 19; ``inf`` outside ``1 < alpha < D Lambda / C^2``.

    Parameters
    ----------
    alpha : float
        Renyi order.
    s : Setting
        The round's public parameters.
    min_eig_sum : float
        ``Lambda = sum_i lambda_min(G_i G_i^T / D)`` over the users (data dependent).

    Examples
    --------
    >>> round(rdp_theorem2(2.0, Setting(50, 1200, 32, 10.0), 1.0), 7)
    0.2106667
    """
    c2, d, b = s.clip**2, s.samples, s.batch
    if not 1 < alpha < theorem2_alpha_max(s, min_eig_sum):
        return math.inf
    return (2 * alpha * b * c2 / d**2 + alpha * c2 / ((alpha - 1) * d)) / (
        min_eig_sum - alpha * c2 / d
    )


def theorem4_alpha_max(s: Setting, sigma2: float, *, strict_range: bool = False) -> float:
    """End of eq. 35's range: ``N B D sigma2 / (2 C^2)``, or the paper's ``N D sigma2 / (2 C^2)``.

    The first keeps the denominator positive; ``strict_range`` gives the second.
    """
    span = s.users * s.samples * _positive(sigma2, "sigma2") / (2 * s.clip**2)
    return span if strict_range else span * s.batch


def rdp_theorem4(alpha: float, s: Setting, sigma2: float, *, strict_range: bool = False) -> float:
    """Eq. 35; ``inf`` outside its range (see :func:`theorem4_alpha_max`).

    Parameters
    ----------
    alpha : float
        Renyi order.
    s : Setting
        The round's public parameters.
    sigma2 : float
        The WF-NA eigenvalue floor on ``G G^T / (B D)``.
    strict_range : bool
        Use the paper's stated range ``a < N D sigma2 / (2 C^2)`` (B times narrower).

    Examples
    --------
    >>> round(rdp_theorem4(2.0, Setting(50, 1200, 32, 10.0), 1e-3), 6)
    0.270175
    """
    c2, d, b, n = s.clip**2, s.samples, s.batch, s.users
    if not 1 < alpha < theorem4_alpha_max(s, sigma2, strict_range=strict_range):
        return math.inf
    return (2 * alpha * c2 / d**2 + 2 * alpha * c2 / ((alpha - 1) * b * d)) / (
        n * sigma2 - 2 * alpha * c2 / (b * d)
    )


def rdp_gd_isotropic(alpha: float, s: Setting, sigma2: float) -> float:
    """Table 1, GD + isotropic noise ``sigma2`` per user: Gaussian mechanism, sensitivity 2C/D."""
    return (
        2 * alpha * s.clip**2 / (s.samples**2 * s.users * _positive(sigma2, "sigma2"))
        if alpha > 1
        else math.inf
    )


def rdp_sgd_isotropic(alpha: float, s: Setting, sigma2: float) -> float:
    """Table 1, SGD + IID sampling + isotropic noise, before amplification: sensitivity 2C/B."""
    return (
        2 * alpha * s.clip**2 / (s.batch**2 * s.users * _positive(sigma2, "sigma2"))
        if alpha > 1
        else math.inf
    )


def rdp_gaussian_sampling_isotropic(alpha: float, s: Setting, sigma2: float) -> float:
    """Table 1, Gaussian sampling + isotropic noise ``sigma2`` per user (data-independent noise)."""
    c2, d, b, n = s.clip**2, s.samples, s.batch, s.users
    if not 1 < alpha < n * b * d * _positive(sigma2, "sigma2") / c2:
        return math.inf
    return (2 * alpha * c2 / d**2 + alpha * c2 / ((alpha - 1) * b * d)) / (
        n * sigma2 - alpha * c2 / (b * d)
    )


def epsilon_from_rdp(
    rdp: Callable[[float], float],
    delta: float,
    *,
    alpha_max: float = math.inf,
    rounds: int = 1,
    mechanism: str = "",
) -> Guarantee:
    """Lemma 1 minimised over ``1 < alpha < alpha_max``, with the RDP of ``rounds`` rounds added up.

    Parameters
    ----------
    rdp : callable
        ``rdp(alpha)``: one round's Renyi DP at order ``alpha`` (``inf`` outside its range).
    delta : float
        Target delta, in ``(0, 1)``.
    alpha_max : float
        End of the valid range of orders.
    rounds : int
        Rounds composed (RDP adds up).
    mechanism : str
        Label stored in the result.

    Returns
    -------
    Guarantee
        The smallest epsilon found and its order.

    Examples
    --------
    >>> g = epsilon_from_rdp(lambda a: 0.01 * a, 1e-4)   # closed form: a + 2 sqrt(a log(1/delta))
    >>> round(g.epsilon, 6) == round(0.01 + 2 * math.sqrt(0.01 * math.log(1e4)), 6)
    True
    """
    if not 0 < delta < 1:
        raise InvalidArgumentError("delta", f"expected in (0, 1), got {delta}")
    if int(rounds) < 1:
        raise InvalidArgumentError("rounds", f"expected >= 1, got {rounds}")
    if not alpha_max > 1:
        return Guarantee(math.inf, delta, math.nan, rounds, alpha_max, mechanism)
    log_term = math.log(1 / delta)

    def total(alpha: float) -> float:
        value = rounds * rdp(alpha)
        return value + log_term / (alpha - 1) if math.isfinite(value) else math.inf

    hi = alpha_max if math.isfinite(alpha_max) else 1e7
    grid = 1 + np.geomspace(1e-6, hi - 1, 400) * (1 - 1e-12)
    values = np.array([total(a) for a in grid])
    best = int(np.argmin(values))
    lo_a, hi_a = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    refined = minimize_scalar(
        total, bounds=(lo_a, hi_a), method="bounded", options={"xatol": 1e-10}
    )
    alpha, eps = (
        (float(refined.x), float(refined.fun))
        if refined.fun <= values[best]
        else (float(grid[best]), float(values[best]))
    )
    return Guarantee(eps, delta, alpha, rounds, alpha_max, mechanism)


THEOREMS = ("2", "4")


def guarantee(
    theorem: str,
    s: Setting,
    delta: float,
    *,
    rounds: int = 1,
    min_eig_sum: float | None = None,
    sigma2: float | None = None,
    strict_range: bool = False,
) -> Guarantee:
    """``(epsilon, delta)`` of Theorem 2 or Theorem 4 over ``rounds`` rounds.

    Parameters
    ----------
    theorem : {"2", "4"}
        Theorem 2 (eq. 19, Gaussian sampling, no added noise) or Theorem 4 (eq. 35, Gaussian
        sampling plus WF-NA noise).
    s : Setting
        The round's public parameters.
    delta : float
        Target delta, in ``(0, 1)``.
    rounds : int
        Rounds composed.
    min_eig_sum : float, optional
        ``Lambda`` (Theorem 2 only, required there).
    sigma2 : float, optional
        The WF-NA eigenvalue floor (Theorem 4 only, required there).
    strict_range : bool
        Theorem 4 on the paper's stated, narrower range of orders.

    Returns
    -------
    Guarantee
        Epsilon, the order that gave it and the range.

    Examples
    --------
    >>> s = Setting(users=50, samples=1200, batch=32, clip=10.0)
    >>> round(guarantee("2", s, 1e-4, min_eig_sum=1.0).epsilon, 5)
    1.67912
    >>> round(guarantee("4", s, 1e-4, sigma2=1e-2).epsilon, 5)
    0.22878
    """
    if theorem == "2":
        if min_eig_sum is None or sigma2 is not None:
            raise InvalidArgumentError(
                "min_eig_sum", "Theorem 2 needs min_eig_sum (Lambda) and no sigma2"
            )
        return epsilon_from_rdp(
            lambda a: rdp_theorem2(a, s, min_eig_sum),
            delta,
            rounds=rounds,
            alpha_max=theorem2_alpha_max(s, min_eig_sum),
            mechanism="Theorem 2 (eq. 19)",
        )
    if theorem == "4":
        if sigma2 is None or min_eig_sum is not None:
            raise InvalidArgumentError("sigma2", "Theorem 4 needs sigma2 and no min_eig_sum")
        return epsilon_from_rdp(
            lambda a: rdp_theorem4(a, s, sigma2, strict_range=strict_range),
            delta,
            rounds=rounds,
            alpha_max=theorem4_alpha_max(s, sigma2, strict_range=strict_range),
            mechanism="Theorem 4 (eq. 35)" + (", stated range" if strict_range else ""),
        )
    raise InvalidArgumentError("theorem", f"expected one of {THEOREMS}, got {theorem!r}")


def gd_guarantee(s: Setting, sigma2: float, delta: float, *, rounds: int = 1) -> Guarantee:
    """GD + isotropic noise (Table 1 row 3), RDP added over rounds, Lemma 1.

    Parameters
    ----------
    s : Setting
        The round's public parameters.
    sigma2 : float
        Variance of each user's isotropic noise.
    delta : float
        Target delta, in ``(0, 1)``.
    rounds : int
        Rounds composed.

    Returns
    -------
    Guarantee
        Epsilon and the order that gave it.
    """
    return epsilon_from_rdp(
        lambda a: rdp_gd_isotropic(a, s, sigma2),
        delta,
        rounds=rounds,
        mechanism="GD + isotropic Gaussian (Table 1)",
    )


def table1_sgd_epsilon(s: Setting, sigma2: float, delta: float) -> float:
    """Table 1 row 1 for one round: ``log(1 + (B/D)(e^eps' - 1))`` with eps' from Lemma 1.

    The paper's form; its delta is not amplified.
    """
    inner = epsilon_from_rdp(lambda a: rdp_sgd_isotropic(a, s, sigma2), delta).epsilon
    return math.log1p(s.batch / s.samples * math.expm1(inner))


def sgd_guarantee(s: Setting, sigma2: float, delta: float, *, rounds: int = 1) -> Guarantee:
    """SGD + IID sampling (B of D without replacement) + isotropic noise over ``rounds`` rounds.

    By dp-accounting's RDP accountant for sampling without replacement under replace-one
    neighbours (noise multiplier ``sqrt(N sigma2) / (2C / B)``) and its RDP-to-DP conversion.

    Parameters
    ----------
    s : Setting
        The round's public parameters.
    sigma2 : float
        Variance of each user's isotropic noise.
    delta : float
        Target delta, in ``(0, 1)``.
    rounds : int
        Rounds composed.

    Returns
    -------
    Guarantee
        Epsilon and the optimal order (``alpha_max`` is ``inf``).
    """
    import dp_accounting as dpa
    from dp_accounting import rdp

    if not 0 < delta < 1:
        raise InvalidArgumentError("delta", f"expected in (0, 1), got {delta}")
    multiplier = math.sqrt(s.users * _positive(sigma2, "sigma2")) * s.batch / (2 * s.clip)
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    event = dpa.SampledWithoutReplacementDpEvent(
        s.samples, s.batch, dpa.GaussianDpEvent(multiplier)
    )
    try:
        accountant.compose(dpa.SelfComposedDpEvent(event, rounds))
        eps, order = accountant.get_epsilon_and_optimal_order(delta)
    except (
        ArithmeticError,
        ValueError,
    ) as exc:  # dp-accounting's float math fails at extreme multipliers
        raise InvalidArgumentError(
            "sigma2",
            f"noise multiplier sqrt(N sigma2) B / (2 C) = {multiplier:.3g} is outside "
            f"the range dp-accounting can evaluate ({exc}); check sigma2 and the clip",
        ) from None
    return Guarantee(
        float(eps),
        delta,
        float(order),
        rounds,
        math.inf,
        "SGD + IID sampling + isotropic Gaussian (dp-accounting, sampling without replacement)",
    )
