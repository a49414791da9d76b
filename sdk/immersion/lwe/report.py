"""What an LWE-coded controller promises: parameters, bits budget, precision, traffic."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .fixed_point import FixedPointDesign
from .params import LweParameters


@dataclass(frozen=True)
class LweReport:
    """The report of :meth:`immersion.lwe.LweImmersion.report`.

    Parameters
    ----------
    parameters:
        LWE dimension, modulus, error law, security level and the table row they come from.
    window:
        ``N``: samples of encrypted history the cloud keeps (the controller's observable order).
    frac_input, frac_output, frac_gain:
        Fixed-point fractional bits of ``y``, ``u`` and of the coefficients.
    noise_scale_bits:
        ``l`` with ``L = 2^l``: plaintexts are multiplied by ``L``. The user subtracts the noise
        exactly (it drew every error), so ``L`` is not sized by the noise; a decrypted value that
        is not a multiple of ``L`` reveals an altered reply.
    noise_bound:
        Proven bound on the output ciphertext's LWE noise (``sum |M| * error_bound``): what
        decryption with the key alone would have to round away; the user removes it exactly.
    accumulator_bits:
        Bits of the largest accumulator for inputs and outputs within the declared ranges.
    headroom_bits:
        ``log2(q / 2) - log2(L acc_max)``: positive, or the setting is refused.
    predicted_step_error, predicted_step_error_relative:
        One sample's rounding bound on ``|u_twin - u_float|`` (absolute; over ``output_range``).
    conversion_residual:
        ``||H F_R^N|| / ||H||``: what the history form neglects (floating-point level).
    uplink_bytes, downlink_bytes, state_bytes:
        Encoded input, encoded output and cloud state per sample (header included).
    n_input, n_output:
        Sizes of ``y`` and ``u``.
    input_range, output_range:
        The declared bounds on ``|y|`` and ``|u|``, per component: the signal ranges the budget
        is proven for (values outside are refused at run time). There is no separate state
        range: the cloud's state is the window of past ``y`` and ``u``, bounded by these two.
    prg:
        Expander of the public vectors.
    """

    parameters: LweParameters
    window: int
    n_input: int
    n_output: int
    input_range: tuple[float, ...]
    output_range: tuple[float, ...]
    frac_input: int
    frac_output: int
    frac_gain: int
    noise_scale_bits: int
    noise_bound: int
    accumulator_bits: int
    headroom_bits: float
    predicted_step_error: float
    predicted_step_error_relative: float
    conversion_residual: float
    uplink_bytes: int
    downlink_bytes: int
    state_bytes: int
    prg: str

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["coding"] = "lwe"
        return out


def lwe_report(
    params: LweParameters,
    fp: FixedPointDesign,
    *,
    input_range: np.ndarray,
    output_range: np.ndarray,
    residual: float,
    sizes: tuple[int, int, int],
    prg: str,
) -> LweReport:
    noise_bits = fp.noise_bits
    noise_bound = fp.noise_gain * params.error_bound
    total = fp.acc_bound << noise_bits  # the noise is subtracted, not rounded: no bits of q
    return LweReport(
        parameters=params,
        window=fp.window,
        n_input=fp.n_input,
        n_output=fp.n_output,
        input_range=tuple(float(v) for v in input_range),
        output_range=tuple(float(v) for v in output_range),
        frac_input=fp.frac_input,
        frac_output=fp.frac_output,
        frac_gain=fp.frac_gain,
        noise_scale_bits=noise_bits,
        noise_bound=noise_bound,
        accumulator_bits=max(fp.acc_bound, 1).bit_length(),
        headroom_bits=params.modulus_bits - 1 - math.log2(max(total, 1)),
        predicted_step_error=fp.predicted_step_error,
        predicted_step_error_relative=fp.predicted_step_error / float(np.max(output_range)),
        conversion_residual=residual,
        uplink_bytes=8 * sizes[0],
        downlink_bytes=8 * sizes[1],
        state_bytes=8 * sizes[2],
        prg=prg,
    )
