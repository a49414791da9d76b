"""Per-element sensitivity and noise of y~ and u~, read off the keys (seed 002, eqs. 27-37)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..keys import Keys, NoiseLaw


@dataclass(frozen=True)
class ElementNoise:
    """For each element of an encoded vector: data sensitivity and noise row norms at unit scale.

    The element's noise is ``row . s`` with ``s`` i.i.d. of scale ``sigma``; ``noise_l2`` and
    ``noise_linf`` are the norms of that row (times the mask scale for outputs).
    """

    sensitivity: np.ndarray
    noise_l2: np.ndarray
    noise_linf: np.ndarray


def input_elements(keys: Keys, law: NoiseLaw) -> ElementNoise:
    """Elements of ``y~ = Pi1 y + N1 s``: sensitivity ``||Pi1^i|| Delta``.

    The norm is the 1-norm for Laplace noise, the 2-norm for Gaussian noise.
    """
    st = keys.input_stats
    rows = st.l1_signal if law.kind == "laplace" else st.l2_signal
    return ElementNoise(rows * law.sensitivity_input, st.l2_noise, st.linf_noise)


def output_elements(keys: Keys, law: NoiseLaw) -> ElementNoise:
    """Elements of ``u~ = Pi3 u + Pi4 Pi1 y + Pi4 N1 s``.

    Theorem 1 counts only ``||Pi3^j|| Delta_u``; when a user's ``Pi4`` lets input data into the
    mask (``Pi4 Pi1 != 0``) we add ``||(Pi4 Pi1)^j||_1 Delta_y``, which the paper omits. Generated
    keys have ``Pi4 Pi1 = 0``, so for them the two agree.
    """
    st = keys.output_stats
    rows = st.l1_signal if law.kind == "laplace" else st.l2_signal
    sens = rows * law.sensitivity_output + keys.mask_data_row_l1 * law.sensitivity_input
    l2 = keys.mask_noise_row_norms
    return ElementNoise(sens, l2, keys.mask_noise_row_linf)
