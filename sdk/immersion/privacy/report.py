"""The privacy and precision report of one immersion, recomputed from the keys actually drawn."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..keys import Keys
from .accounting import compose_gaussian, compose_laplace
from .elements import ElementNoise, input_elements, output_elements
from .precision import predict_decode_error
from .theorems import gaussian_epsilon, laplace_epsilon

GUARANTEE = (
    "Element-wise and per step: each single entry of one encoded input y~_k (and of one encoded "
    "output u~_k) is differentially private with respect to a change of the data within the "
    "stated L1 (Laplace) or L2 (Gaussian) sensitivity. This is not a guarantee for the whole "
    "vector (its entries share the same noise draw) nor, unless composed, across steps. It "
    "protects against a party that sees encoded vectors without the keys; the cloud that runs the "
    "target algorithm holds Pi1_left and Pi2_left and can decode inputs and states (see "
    "THREAT_MODEL.md)."
)


@dataclass(frozen=True)
class PrivacyReport:
    """Per-element privacy of y~ and u~ and the predicted decoding error.

    Built by :meth:`immersion.Immersion.report` from the keys actually drawn.

    Parameters
    ----------
    noise : str
        The noise law, ``"laplace"`` or ``"gaussian"``.
    noise_scale, noise_mean : float
        Scale and mean of the noise ``s_k`` (Laplace scale or Gaussian standard deviation).
    epsilon_input, epsilon_output : float
        Worst element, by the seed's theorem (Laplace: seed 002 Theorem 1; Gaussian: seed 000
        Theorem 2), recomputed from the drawn keys and noise scale.
    epsilon_input_proven, epsilon_output_proven : float
        Laplace: a bound valid for any linear mix of Laplace variables (post-processing, uses
        ``||N^i||_inf``); it is >= Theorem 1's number. Gaussian: equal to the above (exact).
    delta_input, delta_output : float
        The deltas of the Gaussian mechanism (the key's noise law; 0 by default for Laplace).
    sensitivity_input, sensitivity_output : float
        The sensitivities the epsilons are for (L1 for Laplace, L2 for Gaussian).
    dtype : str
        The backend's dtype the decoding error is predicted for.
    decode_error_bound : float
        Predicted max abs error of a decoded output (and of one state step) for ``dtype``,
        including ``input_gain``, the estimated amplification of input errors by ``f`` and ``g``.
    max_encoded_input_entry, max_encoded_output_entry : float
        Largest expected entry of ``y~`` and ``u~`` (the precision model's estimate).
    input_gain : float
        The amplification of input errors by ``f`` and ``g`` used in ``decode_error_bound``.
    guarantee : str
        What the epsilons mean and against whom (the threat model in one paragraph).
    epsilon_input_elements, epsilon_output_elements : np.ndarray
        The epsilon of every element of ``y~`` and ``u~`` (their maxima are the epsilons above).

    Examples
    --------
    >>> from immersion import immerse
    >>> imm = immerse(lambda x, y: 0.5 * x + y, lambda x, y: x, n_state=1, n_input=1,
    ...               n_output=1, rng=0)
    >>> report = imm.report()
    >>> report.noise, bool(report.epsilon_input_elements.max() == report.epsilon_input)
    ('laplace', True)
    """

    noise: str
    noise_scale: float
    noise_mean: float
    epsilon_input: float
    epsilon_output: float
    epsilon_input_proven: float
    epsilon_output_proven: float
    delta_input: float
    delta_output: float
    sensitivity_input: float
    sensitivity_output: float
    dtype: str
    decode_error_bound: float
    max_encoded_input_entry: float
    max_encoded_output_entry: float
    input_gain: float = 1.0
    guarantee: str = GUARANTEE
    epsilon_input_elements: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    epsilon_output_elements: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def composed(self, steps: int, *, delta: float = 1e-6) -> dict[str, float]:
        """Per-element epsilon after ``steps`` encodings of the same element (dp-accounting).

        Laplace: PLD accountant on the Theorem-1 per-step epsilon (pure DP per step, so
        ``steps * epsilon`` is the delta = 0 value). Gaussian: RDP accountant.

        Parameters
        ----------
        steps : int
            Number of encodings of the same element (>= 1).
        delta : float
            Target delta of the composition (> 0 for Gaussian noise).

        Returns
        -------
        dict
            ``epsilon_input``, ``epsilon_output`` and ``delta``.

        Examples
        --------
        >>> from immersion import immerse
        >>> imm = immerse(lambda x, y: 0.5 * x + y, lambda x, y: x, n_state=1, n_input=1,
        ...               n_output=1, rng=0)
        >>> c = imm.report().composed(100, delta=1e-6)
        >>> c["epsilon_input"] < 100 * imm.report().epsilon_input
        True
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidArgumentError("steps", f"expected an integer >= 1, got {steps!r}")
        if not 0 <= delta < 1 or (self.noise == "gaussian" and delta == 0):
            raise InvalidArgumentError(
                "delta", f"expected 0 <= delta < 1 (> 0 for Gaussian noise), got {delta!r}"
            )
        if self.noise == "laplace":
            return {
                "epsilon_input": compose_laplace(self.epsilon_input, steps, delta),
                "epsilon_output": compose_laplace(self.epsilon_output, steps, delta),
                "delta": delta,
            }
        return {
            "epsilon_input": compose_gaussian(self._multiplier_in, steps, delta),
            "epsilon_output": compose_gaussian(self._multiplier_out, steps, delta),
            "delta": delta,
        }

    _multiplier_in: float = field(default=math.inf, repr=False)
    _multiplier_out: float = field(default=math.inf, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (scalars only)."""
        return {
            k: v
            for k, v in self.__dict__.items()
            if not k.startswith("_") and not isinstance(v, np.ndarray)
        }


def _epsilons(
    el: ElementNoise, *, noise: str, sigma: float, delta: float
) -> tuple[np.ndarray, np.ndarray, float]:
    if noise == "laplace":
        theorem = laplace_epsilon(el.sensitivity, el.noise_l2, sigma)
        proven = laplace_epsilon(el.sensitivity, el.noise_linf, sigma)
        return theorem, proven, math.inf
    sigma_bar = el.noise_l2 * sigma
    eps = gaussian_epsilon(el.sensitivity, sigma_bar, delta)
    ratio = sigma_bar / np.maximum(el.sensitivity, 1e-300)
    return eps, eps, float(np.min(ratio))


def privacy_report(
    keys: Keys, *, unit_roundoff: float, dtype: str, input_gain: float = 1.0
) -> PrivacyReport:
    """Build the report for ``keys`` from their noise law (kind, scale, sensitivities, deltas)."""
    law = keys.noise
    assert law is not None, "keys need a designed noise law"
    noise, sigma = law.kind, law.scale
    el_in, el_out = input_elements(keys, law), output_elements(keys, law)
    e_in, p_in, m_in = _epsilons(el_in, noise=noise, sigma=sigma, delta=law.delta_input)
    e_out, p_out, m_out = _epsilons(el_out, noise=noise, sigma=sigma, delta=law.delta_output)
    precision = predict_decode_error(keys, unit_roundoff, input_gain=input_gain)
    return PrivacyReport(
        noise=noise,
        noise_scale=sigma,
        noise_mean=law.mean,
        epsilon_input=float(e_in.max()),
        epsilon_output=float(e_out.max()),
        epsilon_input_proven=float(p_in.max()),
        epsilon_output_proven=float(p_out.max()),
        delta_input=law.delta_input,
        delta_output=law.delta_output,
        sensitivity_input=law.sensitivity_input,
        sensitivity_output=law.sensitivity_output,
        dtype=dtype,
        decode_error_bound=precision.decode_error_bound,
        max_encoded_input_entry=precision.max_input_entry,
        max_encoded_output_entry=precision.max_output_entry,
        input_gain=input_gain,
        epsilon_input_elements=e_in,
        epsilon_output_elements=e_out,
        _multiplier_in=m_in,
        _multiplier_out=m_out,
    )
