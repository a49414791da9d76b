"""Noise design: the smallest noise (and mask) scale meeting per-element epsilon targets."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import InvalidArgumentError
from ..keys import Keys, NoiseLaw
from .elements import input_elements, output_elements
from .theorems import gaussian_min_sigma_bar, laplace_scale_for


def _unit_scale_needed(
    elements_sens: np.ndarray,
    noise_l2: np.ndarray,
    *,
    noise: str,
    epsilon: float,
    delta: float | None,
) -> float:
    """Noise scale needed at unit mask scale: Laplace by Theorem 1, Gaussian by eq. 44."""
    if noise == "laplace":
        return laplace_scale_for(elements_sens, noise_l2, epsilon)
    assert delta is not None
    return float(np.max(gaussian_min_sigma_bar(elements_sens, epsilon, delta) / noise_l2))


def design_noise(
    keys: Keys,
    *,
    noise: str,
    epsilon_input: float,
    epsilon_output: float,
    delta_input: float | None,
    delta_output: float | None,
    sensitivity_input: float,
    sensitivity_output: float,
    noise_mean: float,
) -> Keys:
    """Return ``keys`` with the noise scale sigma and the mask scale chosen to meet both targets.

    sigma meets ``epsilon_input`` exactly at the worst element of y~. For generated keys the
    mask ``Pi4`` is then rescaled so the worst element of u~ meets ``epsilon_output`` exactly;
    a user's ``Pi4`` is kept as given and sigma is raised if the output needs more noise.

    Examples
    --------
    >>> from immersion import Keys
    >>> from immersion.privacy import privacy_report
    >>> keys = design_noise(Keys.draw(n_state=2, n_input=1, n_output=1, rng=0), noise="laplace",
    ...                     epsilon_input=0.01, epsilon_output=0.02, delta_input=None,
    ...                     delta_output=None, sensitivity_input=1.0, sensitivity_output=1.0,
    ...                     noise_mean=0.0)
    >>> r = privacy_report(keys, unit_roundoff=2.0 ** -53, dtype="float64")
    >>> round(r.epsilon_input, 12), round(r.epsilon_output, 12)
    (0.01, 0.02)
    """
    law = NoiseLaw(
        noise,  # type: ignore[arg-type]
        1.0,
        noise_mean,
        sensitivity_input,
        sensitivity_output,
        delta_input or 0.0,
        delta_output or 0.0,
    )
    el_in, el_out = input_elements(keys, law), output_elements(keys, law)
    sigma = _unit_scale_needed(
        el_in.sensitivity, el_in.noise_l2, noise=noise, epsilon=epsilon_input, delta=delta_input
    )
    out_needed = _unit_scale_needed(
        el_out.sensitivity, el_out.noise_l2, noise=noise, epsilon=epsilon_output, delta=delta_output
    )
    for name, value in (
        ("epsilon_input", sigma),
        ("epsilon_output", out_needed),
        ("epsilon_input", out_needed / sigma if sigma > 0 else np.inf),
    ):
        if not (np.isfinite(value) and 1e-300 < value < 1e300):
            raise InvalidArgumentError(
                name, "is outside the range whose noise scale is representable in float64"
            )
    if not keys.mask_is_generated:
        return keys.with_noise(dataclasses.replace(law, scale=max(sigma, out_needed)))
    return keys.with_noise(dataclasses.replace(law, scale=sigma), mask_scale=out_needed / sigma)
