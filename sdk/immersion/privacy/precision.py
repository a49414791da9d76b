"""Predicted decoding error: why epsilon and exactness trade off (../notes/seed002.md section 5).

Decoding cancels noise of size about ``||N^i|| sigma`` to recover a signal of unit scale; in
floating point the rounding error of that cancellation is about
``unit_roundoff * sqrt(n~) * (largest noise entry)``. The decoded input's error then passes
through ``f`` and ``g``; ``input_gain`` (estimated by :func:`immerse` from random probes of
``f`` and ``g`` around the probe point) scales it. The model is calibrated on random keys and
systems (tests/test_privacy.py checks measured errors stay below it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..keys import Keys

#: Tail factor: a Laplace/Gaussian element exceeds this many standard deviations with
#: probability below about 1e-6 per draw.
TAIL = 10.0
#: Safety constant of the rounding model (calibrated, see module docstring).
ROUNDING_CONSTANT = 4.0


@dataclass(frozen=True)
class PrecisionPrediction:
    """Largest expected entry of y~ and u~ and the predicted max abs decode error."""

    max_input_entry: float
    max_output_entry: float
    decode_error_bound: float


def _largest_entry(noise_l2: np.ndarray, *, sigma: float, mean: float, n_noise: int, noise: str) -> float:
    std = (math.sqrt(2.0) if noise == "laplace" else 1.0) * sigma
    return float(np.max(noise_l2 * (abs(mean) * math.sqrt(n_noise) + TAIL * std))) + 1.0


def predict_decode_error(keys: Keys, unit_roundoff: float, *, input_gain: float = 1.0) -> PrecisionPrediction:
    """Predicted max abs error of one decoded output (and one state step) for keys with a noise law.

    ``input_gain``: how much ``f`` and ``g`` amplify a small random error in their input ``y``
    (max-norm ratio; 1 for unit-gain maps).

    Examples
    --------
    >>> from immersion import immerse
    >>> imm = immerse(lambda x, y: x, lambda x, y: y, n_state=1, n_input=1, n_output=1, rng=0)
    >>> bound = predict_decode_error(imm.keys, 2.0 ** -53).decode_error_bound
    >>> 1e-13 < bound < 1e-9          # float64, epsilon = 1e-3
    True
    """
    assert keys.noise_scale is not None, "keys need a designed noise law"
    common = dict(sigma=keys.noise_scale, mean=keys.noise_mean, n_noise=keys.input_code.n_noise,
                  noise=keys.noise_kind)
    m_in = _largest_entry(keys.input_stats.l2_noise, **common)     # type: ignore[arg-type]
    m_out = _largest_entry(keys.mask_noise_row_norms, **common)    # type: ignore[arg-type]
    bound = ROUNDING_CONSTANT * unit_roundoff * (
        math.sqrt(keys.input_code.n_total) * m_in * max(1.0, input_gain) + math.sqrt(keys.output_code.n_total) * m_out)
    return PrecisionPrediction(m_in, m_out, bound)
