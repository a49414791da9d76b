"""The cloud's five codes of seed 002 eq. 17, built once from the keys and shared by every target.

A target algorithm (:class:`~immersion.coding.target.TargetAlgorithm`, its modular form
:class:`~immersion.coding.modular.ModularTarget`) and SIML's target optimizer (eq. 44) need the same
runtime pieces: decode the state (``Pi2_left``), re-encode it (``Pi2``), decode the input
(``Pi1_left``), encode the output (``Pi3``) and the mask (``Pi4 y~``), with the encoded sizes.
:class:`TargetCodes` holds exactly these (no ``N1``, no ``Pi3_left``, no noise generator) and is
built by one of three factories: float keys on a backend, the five public dense matrices (what a
remote cloud receives), or integer keys with a fixed-point format (modulo 2^64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..integer import FixedPointDecoder, FixedPointEncoder
from ..keys.codes import DenseDecoder, DenseEncoder, DenseMaskOp

Map = Callable[[Any], Any]


@dataclass(frozen=True)
class TargetCodes:
    """What a cloud-side target holds: the runtime codes of eq. 17 and the encoded sizes.

    Parameters
    ----------
    n_state_encoded, n_input_encoded, n_output_encoded:
        Sizes of ``x~``, ``y~`` and ``u~``.
    state_in:
        ``x~ -> Pi2_left x~`` (modular: ``2^-f Pi2_left x~``).
    state_out:
        ``x -> Pi2 x`` (modular: ``Pi2 q(x)``, refusing values that would wrap).
    input_in:
        ``y~ -> Pi1_left y~`` (modular: ``2^-f Pi1_left y~``).
    output_out:
        ``u -> Pi3 u`` (modular: ``Pi3 q(u)``).
    mask:
        ``y~ -> Pi4 y~``.

    Examples
    --------
    >>> from immersion import Keys
    >>> from immersion.backends import make_backend
    >>> keys = Keys.draw(n_state=2, n_input=1, n_output=1, rng=0)
    >>> codes = TargetCodes.from_keys(keys, make_backend("numpy"))
    >>> x = np.array([0.5, -1.0])
    >>> codes.n_state_encoded, bool(np.allclose(codes.state_in(codes.state_out(x)), x))
    (3, True)
    """

    n_state_encoded: int
    n_input_encoded: int
    n_output_encoded: int
    state_in: Map
    state_out: Map
    input_in: Map
    output_out: Map
    mask: Map

    @classmethod
    def from_keys(cls, keys: Any, backend: Any) -> "TargetCodes":
        """The codes of float :class:`~immersion.Keys` on ``backend``.

        Parameters
        ----------
        keys:
            The user's keys (only their public geometry is used).
        backend:
            An ``immersion`` array backend.
        """
        return cls(
            keys.state_code.n_total,
            keys.input_code.n_total,
            keys.output_code.n_total,
            state_in=keys.state_code.decoder(backend),
            state_out=keys.state_code.encoder(backend),
            input_in=keys.input_code.decoder(backend),
            output_out=keys.output_code.encoder(backend),
            mask=keys.mask.operator(keys.input_code, keys.output_code, backend),
        )

    @classmethod
    def from_matrices(
        cls,
        backend: Any,
        *,
        Pi1_left: np.ndarray,
        Pi2: np.ndarray,
        Pi2_left: np.ndarray,
        Pi3: np.ndarray,
        Pi4: np.ndarray,
    ) -> "TargetCodes":
        """The codes of the five public dense matrices of eq. 17 (checked by the caller).

        Parameters
        ----------
        backend:
            An ``immersion`` array backend.
        Pi1_left, Pi2, Pi2_left, Pi3, Pi4:
            The dense matrices.
        """
        return cls(
            Pi2.shape[0],
            Pi4.shape[1],
            Pi4.shape[0],
            state_in=DenseDecoder(Pi2_left, backend),
            state_out=DenseEncoder(Pi2, backend),
            input_in=DenseDecoder(Pi1_left, backend),
            output_out=DenseEncoder(Pi3, backend),
            mask=DenseMaskOp(Pi4, backend),
        )

    @classmethod
    def fixed_point(
        cls, keys: Any, fraction_bits: int, *, state_name: str = "f", output_name: str = "g"
    ) -> "TargetCodes":
        """The codes of integer :class:`~immersion.keys.ModularKeys` modulo ``2^64`` (numpy).

        Decoders return the fixed-point values ``2^-f Pi_left v~`` in float64; encoders take
        float values and refuse (naming ``state_name`` or ``output_name``) any whose fixed-point
        form would wrap.

        Parameters
        ----------
        keys:
            The user's integer keys (only their public geometry is used).
        fraction_bits:
            ``f`` of ``q(v) = round(v 2^f)``.
        state_name, output_name:
            The signals named by a range refusal of :attr:`state_out` and :attr:`output_out`.
        """
        return cls(
            keys.state_code.n_total,
            keys.input_code.n_total,
            keys.output_code.n_total,
            state_in=FixedPointDecoder(keys.state_code.decoder(), fraction_bits),
            state_out=FixedPointEncoder(keys.state_code.encoder(), fraction_bits, state_name),
            input_in=FixedPointDecoder(keys.input_code.decoder(), fraction_bits),
            output_out=FixedPointEncoder(keys.output_code.encoder(), fraction_bits, output_name),
            mask=keys.mask.operator(keys.input_code),
        )

    @classmethod
    def from_transposed(cls, dense: Any) -> "TargetCodes":
        """The codes of the transposed matrices of keys this library drew (held as they are).

        Parameters
        ----------
        dense:
            A :class:`~immersion.keys.codes.DenseTargetSample` (C-contiguous float64 ``Pi^T``).
        """
        return cls(
            dense.state_left.shape[0],
            dense.input_left.shape[0],
            dense.mask.shape[1],
            state_in=DenseDecoder.of_transposed(dense.state_left),
            state_out=DenseEncoder.of_transposed(dense.state),
            input_in=DenseDecoder.of_transposed(dense.input_left),
            output_out=DenseEncoder.of_transposed(dense.output),
            mask=DenseMaskOp.of_transposed(dense.mask),
        )
