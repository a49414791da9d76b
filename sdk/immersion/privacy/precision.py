"""Estimated decoding error: why epsilon and exactness trade off (../notes/seed002.md section 5).

Decoding cancels noise of size about ``||N^i|| sigma`` to recover a signal of unit scale; in
floating point the rounding error of that cancellation is about
``unit_roundoff * sqrt(n~) * (largest noise entry)``. The decoded input's error then passes
through ``f`` and ``g``; ``input_gain`` (estimated by :func:`immerse` from random probes of
``f`` and ``g`` around the probe point) scales it. The model is calibrated on random keys and
systems (tests/test_privacy.py checks measured errors stay below it at the probe point).

It is an estimate (``decode_error_estimate``), not a bound: over a closed-loop trajectory ``f``
and ``g`` can amplify more than at the probe point and the state carries rounding forward
(``immersion demo reactor``, seeds 0-9: up to 4.46 times the estimate,
``benchmarks/reactor_bounds.py``). What holds in every run is the a posteriori bound of each
decode, :mod:`immersion.privacy.bounds`. The tolerance check (:func:`refuse_infeasible_precision`)
runs before any data exists, so it uses this estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..backends import ArrayBackend
from ..errors import PrecisionError
from ..keys import Keys

if TYPE_CHECKING:
    from ..coding.design import NoiseTargets

#: Tail factor: a Laplace/Gaussian element exceeds this many standard deviations with
#: probability below about 1e-6 per draw.
TAIL = 10.0
#: Safety constant of the rounding model (calibrated, see module docstring).
ROUNDING_CONSTANT = 4.0


@dataclass(frozen=True)
class PrecisionPrediction:
    """Largest expected entry of y~ and u~ and the estimated max abs decode error (not a bound)."""

    max_input_entry: float
    max_output_entry: float
    decode_error_estimate: float


def _largest_entry(
    noise_l2: np.ndarray, *, sigma: float, mean: float, n_noise: int, noise: str
) -> float:
    std = (math.sqrt(2.0) if noise == "laplace" else 1.0) * sigma
    return float(np.max(noise_l2 * (abs(mean) * math.sqrt(n_noise) + TAIL * std))) + 1.0


def predict_decode_error(
    keys: Keys, unit_roundoff: float, *, input_gain: float = 1.0
) -> PrecisionPrediction:
    """Estimated max abs error of one decoded output (and one state step) for keys with a noise law.

    ``input_gain``: how much ``f`` and ``g`` amplify a small random error in their input ``y``
    (max-norm ratio; 1 for unit-gain maps).

    Examples
    --------
    >>> from immersion import immerse
    >>> imm = immerse(lambda x, y: x, lambda x, y: y, n_state=1, n_input=1, n_output=1, rng=0)
    >>> estimate = predict_decode_error(imm.keys, 2.0 ** -53).decode_error_estimate
    >>> 1e-13 < estimate < 1e-9          # float64, epsilon = 1e-3
    True
    """
    law = keys.noise
    assert law is not None, "keys need a designed noise law"
    common = dict(sigma=law.scale, mean=law.mean, n_noise=keys.input_code.n_noise, noise=law.kind)
    m_in = _largest_entry(keys.input_stats.l2_noise, **common)  # type: ignore[arg-type]
    m_out = _largest_entry(keys.mask_noise_row_norms, **common)  # type: ignore[arg-type]
    # Pi4 y~ keeps the rounding error of y~ (about unit_roundoff * m_in per entry) times the mask:
    # negligible unless the mask is huge (epsilon_input >> epsilon_output), where it swamps u~
    # (measured, see tests).
    y_entry = m_in + float(
        np.max(keys.input_stats.l1_signal)
    )  # noise and data parts of an entry of y~
    mask_rounding = (
        float(np.max(keys.mask_row_norms))
        * unit_roundoff
        * math.sqrt(keys.input_code.n_total)
        * y_entry
    )
    bound = (
        ROUNDING_CONSTANT
        * unit_roundoff
        * (
            math.sqrt(keys.input_code.n_total)
            * m_in
            * max(1.0, input_gain)
            * keys.input_code.inverse_gain
            + math.sqrt(keys.output_code.n_total)
            * (m_out + mask_rounding)
            * keys.output_code.inverse_gain
        )
    )
    return PrecisionPrediction(m_in, m_out, bound)


# ---------------------------------------------------------------- refusing infeasible settings
#: The suggested epsilons aim at tolerance / SUGGESTION_MARGIN, so that they still work for a
#: fresh key draw (the worst row of new keys differs a little from this draw's).
SUGGESTION_MARGIN = 2.0


def refuse_infeasible_precision(
    keys: Keys,
    be: ArrayBackend,
    tolerance: float,
    targets: NoiseTargets | None,
    input_gain: float,
) -> None:
    """Refuse settings whose estimated decode error exceeds ``tolerance`` (seed002 notes section 5).

    The check runs when the keys are drawn, before any data: it uses the probe-point estimate
    (:func:`predict_decode_error`), not the per-decode bound, and the message says so.

    ``targets`` (a :class:`immersion.coding.design.NoiseTargets`, or None for keys that came with
    their own noise law) lets the message name the smallest feasible epsilons, with a margin of
    ``SUGGESTION_MARGIN`` so that they also work for a fresh key draw.
    """
    unit_roundoff, dtype = be.unit_roundoff, be.dtype_name
    predicted = predict_decode_error(
        keys, unit_roundoff, input_gain=input_gain
    ).decode_error_estimate
    if predicted <= tolerance:
        return
    if targets is None:
        raise PrecisionError(
            f"tolerance: these keys' noise gives an estimated decode error {predicted:.3g} in "
            f"{dtype} (the probe-point estimate, not a bound), above tolerance {tolerance:.3g}",
            smallest_feasible_epsilon_input=math.nan,
            smallest_feasible_epsilon_output=math.nan,
        )

    def predicted_at(factor: float) -> float:
        return predict_decode_error(
            targets.apply(keys, scale=factor), unit_roundoff, input_gain=input_gain
        ).decode_error_estimate

    goal = tolerance / SUGGESTION_MARGIN
    floor = predicted_at(1e15)  # noise negligible: what rounding alone costs
    if floor >= goal:
        raise PrecisionError(
            "tolerance: no epsilon at this epsilon_input/epsilon_output ratio can meet tolerance "
            f"{tolerance:.3g} in {dtype}: even negligible noise leaves an estimated rounding error "
            f"of {floor:.3g} (the probe-point estimate, not a bound). "
            f"Raise tolerance{' or use float64' if dtype != 'float64' else ''}.",
            smallest_feasible_epsilon_input=math.nan,
            smallest_feasible_epsilon_output=math.nan,
        )
    factor = predicted / goal
    for _ in range(60):  # the error is (noise term)/factor + floor: converges geometrically
        error = predicted_at(factor)
        if error <= goal:
            break
        factor *= (error - floor) / (goal - floor) * 1.01
    eps_in, eps_out = targets.epsilon_input, targets.epsilon_output
    raise PrecisionError(
        f"tolerance: epsilon_input={eps_in:.3g}, epsilon_output={eps_out:.3g} need noise so large "
        f"that the estimated decode error in {dtype} (the probe-point estimate, not a bound) is "
        f"{predicted:.3g} > tolerance "
        f"{tolerance:.3g}. The smallest feasible epsilons at this ratio are about "
        f"epsilon_input={eps_in * factor:.3g}, epsilon_output={eps_out * factor:.3g} (with a "
        f"{SUGGESTION_MARGIN:g}x margin for a fresh key draw), or raise "
        f"tolerance{', or use float64' if dtype != 'float64' else ''}.",
        smallest_feasible_epsilon_input=eps_in * factor,
        smallest_feasible_epsilon_output=eps_out * factor,
    )
