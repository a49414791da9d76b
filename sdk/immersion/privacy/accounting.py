"""Composition of the per-element guarantee over steps, through dp-accounting.

Meaningful for one element of the encoded input (or output) observed at several steps with
fresh noise each step and the same sensitivity: the steps compose. It does NOT turn the
element-wise guarantee into a guarantee for the whole vector (elements share noise).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
from dp_accounting import pld, rdp

#: Above this many steps the Laplace composition uses the advanced composition theorem (Kairouz et
#: al. 2015, valid and a little looser) instead of the PLD accountant, whose cost grows with the
#: number of steps.
PLD_MAX_STEPS = 100_000


def compose_laplace(epsilon_step: float, steps: int, delta: float) -> float:
    """Epsilon after ``steps`` Laplace steps of per-step ``epsilon_step`` (PLD accountant).

    Examples
    --------
    >>> round(compose_laplace(1e-3, 100, 1e-6), 4)
    0.0334
    """
    if steps == 1 and delta == 0:
        return epsilon_step
    k = float(steps) if steps < 2**1000 else math.inf
    basic = k * epsilon_step  # pure-DP composition: always valid
    if (
        delta == 0 or epsilon_step > 10.0 or epsilon_step <= 0.0
    ):  # the PLD grid cannot represent huge per-step epsilons
        return basic
    if (
        steps > PLD_MAX_STEPS
    ):  # the PLD grows with steps (1e5: ~5 s; 1e7 would take hours): advanced composition
        advanced = epsilon_step * math.sqrt(
            2.0 * k * math.log(1.0 / delta)
        ) + k * epsilon_step * math.expm1(epsilon_step)
        return float(min(advanced, basic))
    event = dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(noise_multiplier=1.0 / epsilon_step), steps)
    accountant = pld.PLDAccountant(value_discretization_interval=min(1e-4, epsilon_step / 100.0))
    accountant.compose(event)
    return float(min(accountant.get_epsilon(delta), basic))


def compose_gaussian(noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon after ``steps`` Gaussian steps of std/sensitivity ``noise_multiplier`` (RDP)."""
    if steps >= 2**1000:  # beyond float64: no guarantee left
        return math.inf
    accountant = rdp.RdpAccountant()
    accountant.compose(
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(noise_multiplier=noise_multiplier), steps)
    )
    return float(accountant.get_epsilon(delta))
