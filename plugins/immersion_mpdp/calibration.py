"""Calibrating ``(sigma_eta, sigma_Delta)`` for a per-round ``(epsilon, delta)`` (seed 004 Eq. 23,
Theorems 10 and 11, imported by the paper from GOPA).

Eq. 23: ``epsilon >= theta / 2 + sqrt(theta)`` and ``(epsilon - theta / 2)^2 >= c theta`` with
``c = 2 log(2 / (delta sqrt(2 pi)))``, which is equivalent to ``theta <= theta_max`` with
``theta_max = min(sqrt(c + 2 eps) - sqrt(c), sqrt(1 + 2 eps) - 1)^2``.

* Theorem 10 (complete graph): ``theta = 1 / (sigma_eta^2 K) + 1 / (sigma_Delta^2 K)``. The paper
  prints it without the squares; Theorem 11 and the units (theta must not change when noise and
  sensitivity are scaled together) call for them, so ``reading="squared"`` is the default and
  ``reading="literal"`` reproduces the printed formula.
* Theorem 11 (random n-out graph): ``theta = 1 / (sigma_eta^2 K) + (1 / (floor((n - 1) / 3) - 1)
  + (12 + 6 log K) / K) / sigma_Delta^2`` gives ``(epsilon, 3 delta)``-DP, and only if ``K >= 81``,
  ``n >= 4 log(2K / (3 delta))``, ``n >= 6 log(K / 3)``, ``n >= 3/2 + 9/4 log(2e / delta)`` and
  ``floor((n - 1) / 3) > 1``. Outside these it is refused (the paper's own experiments, K = 5 or
  100 with n = 5, are outside them). Here ``delta`` is the total: the theorem is applied at
  ``delta / 3``, so ``sigma_eta`` is a few percent larger than Theorem 10's at the same
  ``(epsilon, delta)`` (4.4% at ``epsilon = 1``, ``delta = 1e-5``).
* ``graph="auto"`` (the default) is Theorem 11 with the smallest ``n`` it allows where that ``n``
  is at most ``(K - 1) / 4`` (from 289 clients at ``delta = 1e-5``, where the n-out graph has
  about 44% of the complete graph's edges), Theorem 10 below
  (:func:`resolve_noise_graph`).

Both theorems assume a sensitivity of 1 (the paper's ``S_f = B = 1``); a client cannot clip the
true gradient (it does not know it), so the bound is an assumption: noise is scaled by
``sensitivity`` and the engine measures the real per-record sensitivity of every run.
A fraction ``eta_share`` of ``theta_max`` goes to the ``sigma_eta`` term: only ``sigma_eta``
reaches the aggregate (variance ``sigma_eta^2 / K``), so a larger share means a better model and a
larger ``sigma_Delta``. Over ``T`` rounds, basic composition gives ``(T epsilon, T delta)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from immersion import InvalidArgumentError

from .agreement import parse_graph

READINGS = ("squared", "literal")


@dataclass(frozen=True)
class Calibration:
    """Noise scales for one round and the theorem behind them.

    Parameters
    ----------
    sigma_eta, sigma_delta : float
        Scales of the clients' own noise ``eta`` and of the pairwise noise ``Delta``, already
        multiplied by the assumed sensitivity.
    epsilon, delta : float
        The per-round target.
    theorem : str
        The theorem applied (10, complete graph; 11, n-out graph at ``delta / 3``).
    reading : {"squared", "literal"}
        How Theorem 10's ``theta`` was read (module docstring).
    theta : float
        The ``theta`` of these scales.
    theta_max : float
        The budget ``theta`` had to stay under: Eq. 23's largest ``theta``, shrunk by a relative
        ``1e-9`` against rounding.
    graph : str
        The noise graph the theorem was applied to (``"auto"`` resolved).
    """

    sigma_eta: float
    sigma_delta: float
    epsilon: float
    delta: float
    theorem: str
    reading: str
    theta: float
    theta_max: float
    graph: str = "complete"


def _eq23_c(delta: float) -> float:
    """``c = 2 log(2 / (delta sqrt(2 pi)))`` of Eq. 23."""
    return 2.0 * math.log(2.0 / (delta * math.sqrt(2.0 * math.pi)))


def theta_max(epsilon: float, delta: float) -> float:
    """Largest ``theta`` meeting Eq. 23.

    Examples
    --------
    >>> round(theta_max(1.0, 1e-5), 4)
    0.0424
    """
    if not epsilon > 0:
        raise InvalidArgumentError("epsilon", f"expected > 0, got {epsilon}")
    if not 0 < delta <= 0.5:
        raise InvalidArgumentError("delta", f"expected in (0, 0.5], got {delta}")
    c = _eq23_c(delta)
    return min(math.sqrt(c + 2 * epsilon) - math.sqrt(c), math.sqrt(1 + 2 * epsilon) - 1) ** 2


def meets_eq23(epsilon: float, delta: float, theta: float) -> bool:
    """Eq. 23 as printed (for checking a calibration independently of :func:`theta_max`)."""
    c = _eq23_c(delta)
    return epsilon >= theta / 2 + math.sqrt(theta) and (epsilon - theta / 2) ** 2 >= c * theta


def nout_preconditions(n_clients: int, n: int, delta: float) -> list[str]:
    """The preconditions of Theorem 11 that fail (empty if it applies)."""
    k = n_clients
    checks = [
        (k >= 81, f"K >= 81 (K = {k})"),
        (
            n >= 4 * math.log(2 * k / (3 * delta)),
            f"n >= 4 log(2K/(3 delta)) = {4 * math.log(2 * k / (3 * delta)):.1f}",
        ),
        (n >= 6 * math.log(k / 3), f"n >= 6 log(K/3) = {6 * math.log(k / 3):.1f}"),
        (
            n >= 1.5 + 2.25 * math.log(2 * math.e / delta),
            f"n >= 3/2 + 9/4 log(2e/delta) = {1.5 + 2.25 * math.log(2 * math.e / delta):.1f}",
        ),
        ((n - 1) // 3 > 1, "floor((n-1)/3) > 1, i.e. n >= 7"),
        (n < k, f"n < K (n = {n})"),
    ]
    return [text for ok, text in checks if not ok]


#: ``graph="auto"`` takes Theorem 11's n-out graph only where its ``n`` is at most ``(K - 1) /
#: AUTO_NOISE_SPARSITY`` (about 44% of the complete graph's edges, or fewer).
AUTO_NOISE_SPARSITY = 4


def smallest_nout(n_clients: int, delta: float) -> int | None:
    """The smallest ``n`` for which Theorem 11 applies to ``n_clients`` at ``delta`` (None if
    none does).

    Parameters
    ----------
    n_clients : int
        ``K``.
    delta : float
        The ``delta`` the theorem is applied at (the total divided by 3).
    """
    if n_clients < 81:
        return None
    for n in range(7, n_clients):
        if not nout_preconditions(n_clients, n, delta):
            return n
    return None


def resolve_noise_graph(spec: str, n_clients: int, delta: float) -> str:
    """The graph of the noise ``Delta`` that ``spec`` means for ``n_clients``.

    ``"auto"``: Theorem 11's n-out graph with the smallest ``n`` its preconditions allow at
    ``delta / 3``, where that ``n`` is at most ``(K - 1) / 4`` (from 289 clients at ``delta =
    1e-5``); the complete graph (Theorem 10) otherwise. Other specs are returned as they are.

    Parameters
    ----------
    spec : str
        ``"auto"``, ``"complete"`` or ``"nout:N"``.
    n_clients : int
        ``K``.
    delta : float
        The run's per-round ``delta``.

    Examples
    --------
    >>> resolve_noise_graph("auto", 100, 1e-5), resolve_noise_graph("auto", 1000, 1e-5)
    ('complete', 'nout:77')
    """
    if parse_graph(spec)[0] != "auto":
        return spec
    n = smallest_nout(n_clients, delta / 3)
    if n is not None and AUTO_NOISE_SPARSITY * n <= n_clients - 1:
        return f"nout:{n}"
    return "complete"


def calibrate(
    epsilon: float,
    delta: float,
    n_clients: int,
    graph: str = "complete",
    *,
    sensitivity: float = 1.0,
    eta_share: float = 0.9,
    reading: str = "squared",
) -> Calibration:
    """``(sigma_eta, sigma_Delta)`` meeting Theorem 10 or 11 at per-round ``(epsilon, delta)``.

    Parameters
    ----------
    epsilon : float
        Per-round epsilon (> 0).
    delta : float
        Per-round delta, in ``(0, 0.5]``; with an n-out graph the total (Theorem 11 is applied
        at ``delta / 3``).
    n_clients : int
        Clients in the round, ``K >= 2``.
    graph : str
        ``"complete"`` (Theorem 10), ``"nout:N"`` (Theorem 11, refused outside its
        preconditions) or ``"auto"`` (module docstring).
    sensitivity : float
        Assumed per-record sensitivity; the theorems assume 1 and the scales grow with it.
    eta_share : float
        Fraction of the ``theta`` budget spent on ``sigma_eta``, in ``(0, 1)``.
    reading : {"squared", "literal"}
        Theorem 10 with the squares the units call for (default) or as printed.

    Returns
    -------
    Calibration
        The scales, the theorem and ``theta`` against its budget.

    Examples
    --------
    >>> cal = calibrate(1.0, 1e-5, 10)
    >>> cal.theorem, round(cal.sigma_eta, 3), meets_eq23(1.0, 1e-5, cal.theta)
    ('Theorem 10 (complete graph)', 1.618, True)
    """
    if n_clients < 2:
        raise InvalidArgumentError(
            "clients", f"distributed noise needs >= 2 clients, got {n_clients}"
        )
    if not 0 < eta_share < 1:
        raise InvalidArgumentError("eta_share", f"expected in (0, 1), got {eta_share}")
    if not sensitivity > 0:
        raise InvalidArgumentError("sensitivity", f"expected > 0, got {sensitivity}")
    if reading not in READINGS:
        raise InvalidArgumentError("reading", f"expected one of {READINGS}, got {reading!r}")
    graph = resolve_noise_graph(graph, n_clients, delta)
    kind, n = parse_graph(graph)
    k = n_clients
    if kind == "nout" and n < k - 1:
        failing = nout_preconditions(k, n, delta / 3)
        if failing:
            raise InvalidArgumentError(
                "graph",
                f"Theorem 11 (n-out graph) does not apply: {'; '.join(failing)}. "
                "Use --graph complete (Theorem 10), or more clients and a larger n",
            )
        if reading == "literal":
            raise InvalidArgumentError(
                "reading", "Theorem 11 is printed with squares; 'literal' is for Theorem 10"
            )
        theorem, delta_theorem = "Theorem 11 (n-out graph, applied at delta/3)", delta / 3
        coef_delta = 1.0 / ((n - 1) // 3 - 1) + (12 + 6 * math.log(k)) / k
    else:
        theorem, delta_theorem, coef_delta = "Theorem 10 (complete graph)", delta, 1.0 / k
    budget = theta_max(epsilon, delta_theorem) * (
        1 - 1e-9
    )  # strictly inside Eq. 23 despite rounding
    power = 2 if reading == "squared" else 1
    # theta = eta_share * budget from 1/(K sigma_eta^p) and the rest from coef_delta / sigma_Delta^p
    sigma_eta = (1.0 / (k * eta_share * budget)) ** (1 / power)
    sigma_delta = (coef_delta / ((1 - eta_share) * budget)) ** (1 / power)
    theta = 1.0 / (k * sigma_eta**power) + coef_delta / sigma_delta**power
    return Calibration(
        sigma_eta * sensitivity,
        sigma_delta * sensitivity,
        epsilon,
        delta,
        theorem,
        reading,
        theta,
        budget,
        "complete" if kind == "complete" or n >= k - 1 else graph,
    )
