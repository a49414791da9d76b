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


MODULAR_GUARANTEE = (
    "Element-wise, per step and composed over any number of steps: every single entry of an "
    "encoded input y~_k = Pi1 q(y_k) + N1 s_k (mod 2^64) and of an encoded output u~_k is uniform "
    "modulo 2^64 whatever the data (each row of N1 and of Pi4 N1 has an odd entry and s_k is fresh "
    "and uniform), so its law carries no information: per-element epsilon 0 for any two inputs "
    "within the fixed-point range. Decoding is exact: outputs equal the fixed-point twin bit for "
    "bit (values rounded to the grid 2^-f), with no precision traded for privacy. NOT protected: "
    "the vector y~_k is not uniform (it lies in Pi1 q(y_k) + range(N1)); the cloud that runs the "
    "target holds Pi1_left and Pi2_left and sees every input and state; n_input + extra_input "
    "known (y, y~) pairs give Pi1_left by elimination modulo 2^64, and a stream of encodings of "
    "small fixed-point values can be attacked by lattice reduction (THREAT_MODEL.md, immersion "
    "audit)."
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
    decode_error_estimate : float
        Estimated max abs error of a decoded output (and of one state step) for ``dtype``,
        including ``input_gain``, the amplification of input errors by ``f`` and ``g`` measured
        around the probe point: a calibrated model, not a bound (a closed loop can exceed it; the
        rigorous per-decode bound is ``Immersion.decode_output_with_bound``). 0 for modular
        arithmetic (exact against the fixed-point twin).
    max_encoded_input_entry, max_encoded_output_entry : float
        Largest expected entry of ``y~`` and ``u~`` (the precision model's estimate).
    input_gain : float
        The amplification of input errors by ``f`` and ``g`` used in ``decode_error_estimate``.
    guarantee : str
        What the epsilons mean and against whom (the threat model in one paragraph).
    epsilon_input_elements, epsilon_output_elements : np.ndarray
        The epsilon of every element of ``y~`` and ``u~`` (their maxima are the epsilons above).
    arithmetic, fraction_bits, quantisation_step, largest_magnitude:
        ``"float"`` (the last three None) or ``"modular"``: values are rounded to the grid
        ``quantisation_step = 2^-fraction_bits`` (by at most half a step each time they cross the
        link) and must stay below ``largest_magnitude = 2^(63 - fraction_bits)``. For modular
        reports ``noise_scale`` is the width ``2^64`` of the uniform law, ``noise_mean`` is 0
        (unused) and the sensitivities are the whole fixed-point range ``2 largest_magnitude``.

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
    decode_error_estimate: float
    max_encoded_input_entry: float
    max_encoded_output_entry: float
    input_gain: float = 1.0
    guarantee: str = GUARANTEE
    epsilon_input_elements: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    epsilon_output_elements: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    arithmetic: str = "float"
    fraction_bits: int | None = None
    quantisation_step: float | None = None
    largest_magnitude: float | None = None

    def epsilon_note(self, *, input_name: str = "input", output_name: str = "output") -> str:
        """Why ``epsilon_*_proven`` exceeds ``epsilon_*`` (the designed, requested figure), with
        this report's numbers; ``""`` where they agree (Gaussian noise, modular arithmetic).

        Seed 002 Theorem 1 treats element ``i``'s noise ``N1^i s``, a sum of several Laplace
        variables, as one Laplace variable of scale ``||N1^i||_2 sigma``: the noise is designed
        to meet the request under that reading, which is not exact. The proven bound keeps only
        the largest term (``||N1^i||_inf sigma``, a Laplace mechanism; the other terms are
        independent post-processing), so it holds for any mix and exceeds the theorem's number
        by the row's ``||N1^i||_2 / ||N1^i||_inf`` (between 1 and the square root of the extra
        dimensions). Ask for ``epsilon / ratio`` for a proven figure at most the target.

        Parameters
        ----------
        input_name, output_name:
            What the summary calls the input and output figures (``data``, ``model`` in SIML).

        Examples
        --------
        >>> from immersion import immerse
        >>> imm = immerse(lambda x, y: x + y, lambda x, y: x, 1, 1, 1, extra_input=8, rng=0)
        >>> "Theorem 1" in imm.report().epsilon_note()
        True
        """
        parts = []
        for name, theorem, proven in (
            (input_name, self.epsilon_input, self.epsilon_input_proven),
            (output_name, self.epsilon_output, self.epsilon_output_proven),
        ):
            if proven > theorem * (1 + 1e-9):
                parts.append(f"epsilon_{name} {theorem:.3g} -> proven {proven:.3g}")
        if not parts:
            return ""
        return (
            f"{'; '.join(parts)}: the designed figure is seed 002 Theorem 1, which reads each "
            "element's noise (a sum of several Laplace variables) as one Laplace variable of "
            "scale ||N1^i||_2 sigma, not an exact step; the proven bound keeps the largest term "
            "alone (||N1^i||_inf sigma; the rest is post-processing) and holds for any mix. The "
            "ratio is ||N1^i||_2 / ||N1^i||_inf, larger with more extra dimensions: request "
            "epsilon / ratio for a proven figure at most the target"
        )

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
        if self.arithmetic == "modular":  # i.i.d. uniform at every step, whatever the data
            return {
                "epsilon_input": self.epsilon_input,
                "epsilon_output": self.epsilon_output,
                "delta": delta,
            }
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
        decode_error_estimate=precision.decode_error_estimate,
        max_encoded_input_entry=precision.max_input_entry,
        max_encoded_output_entry=precision.max_output_entry,
        input_gain=input_gain,
        epsilon_input_elements=e_in,
        epsilon_output_elements=e_out,
        _multiplier_in=m_in,
        _multiplier_out=m_out,
    )


def modular_privacy_report(keys: Any, fraction_bits: int) -> PrivacyReport:
    """The report of a modular immersion, recomputed from its integer keys.

    Element ``i`` of ``y~`` is uniform modulo ``2^64`` (epsilon 0) when row ``i`` of ``N1`` has an
    odd entry (proof in :mod:`immersion.keys.modular`); element ``j`` of ``u~ = Pi3 q(u) + Pi4 y~``
    when its mask weight is odd (``Pi4 Pi1 = 0``, ``(Pi4 y~)_j = weight_j s[source_j]``). An element
    without that property gets epsilon ``inf`` (no guarantee is claimed); drawn keys have none.
    As every step draws fresh uniform noise, the sequence of values of one element over any
    number of steps is i.i.d. uniform: composition leaves epsilon 0.

    Examples
    --------
    >>> from immersion import draw_keys
    >>> r = modular_privacy_report(draw_keys(2, 1, 1, arithmetic="modular", rng=0), 24)
    >>> r.epsilon_input, r.epsilon_output, r.quantisation_step == 2.0**-24, r.decode_error_estimate
    (0.0, 0.0, True, 0.0)
    >>> r.composed(10**6)["epsilon_input"]
    0.0
    """
    from ..integer import MODULUS_BITS, largest_magnitude, quantisation_step

    e_in = np.where(keys.input_code.odd_noise_rows(), 0.0, math.inf)
    e_out = np.where(keys.mask.odd_rows(), 0.0, math.inf)
    biggest = largest_magnitude(fraction_bits)
    return PrivacyReport(
        noise="uniform-mod-2^64",
        noise_scale=float(2**MODULUS_BITS),
        noise_mean=0.0,
        epsilon_input=float(e_in.max()),
        epsilon_output=float(e_out.max()),
        epsilon_input_proven=float(e_in.max()),
        epsilon_output_proven=float(e_out.max()),
        delta_input=0.0,
        delta_output=0.0,
        sensitivity_input=2.0 * biggest,
        sensitivity_output=2.0 * biggest,
        dtype="uint64",
        decode_error_estimate=0.0,
        max_encoded_input_entry=float(2**MODULUS_BITS - 1),
        max_encoded_output_entry=float(2**MODULUS_BITS - 1),
        guarantee=MODULAR_GUARANTEE,
        epsilon_input_elements=e_in,
        epsilon_output_elements=e_out,
        arithmetic="modular",
        fraction_bits=fraction_bits,
        quantisation_step=quantisation_step(fraction_bits),
        largest_magnitude=biggest,
    )
