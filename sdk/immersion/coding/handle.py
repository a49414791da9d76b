"""The user-side handle of seed 002's affine immersion (Proposition 1, eqs. 16 and 18).

:class:`Immersion` holds the secret keys, encodes ``x0`` and ``y_k`` (eq. 16), decodes ``u~`` and
``x~`` (eq. 18) and reports privacy and precision. It is the float64 (or torch) handle; the
modular handle (:class:`~immersion.coding.modular.ModularImmersion`) subclasses it. Both are built
by :func:`immersion.immerse` (:mod:`immersion.coding.factory`), the one place that picks between
them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import validation as v
from ..backends import ArrayBackend
from ..keys import Keys
from ..keys.codes import DenseNoisyEncoder, DenseUserSample
from ..privacy import PrivacyReport, privacy_report
from ..privacy.bounds import DecodeBounds, Decoded
from .noise_blocks import NoiseBlocks, block_rows
from .target import TargetAlgorithm

if TYPE_CHECKING:
    from .factory import FloatDesign

_FLOAT64 = np.dtype(np.float64)
_ndarray = np.ndarray
_isfinite = math.isfinite


class Immersion:
    """User-side handle: secret keys, encoder, decoder and the privacy/precision report.

    Created by :func:`immerse`; ``imm.target`` is what goes to the cloud.

    Parameters
    ----------
    keys:
        The secret keys (their noise law draws the input noise).
    target:
        The cloud-side algorithm built on the same keys.
    backend:
        The array backend of encoding and decoding.
    noise_rng:
        The generator of the input noise ``s_k``.
    input_gain:
        How much ``f`` and ``g`` amplify a small error in ``y`` (>= 1; estimated by
        :func:`immerse`), for the report's decode-error estimate.
    """

    keys: Any  # Keys (float arithmetic) or ModularKeys
    #: ``(A, B, C, D)`` when :func:`~immersion.immerse_system` made the handle from a linear
    #: controller (remote mode then serves it without a registered algorithm); else None
    controller_matrices: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    #: small dense keys on numpy float64: the matrices of the short paths (None: general paths)
    _dense_user: DenseUserSample | None = None
    #: how :func:`immerse` designed these keys (None: modular arithmetic)
    _design: "FloatDesign | None" = None
    _input_enc: Callable[[Any, Any], Any]
    _state_enc: Callable[[Any], Any]
    _state_dec: Callable[[Any], Any]
    _output_dec: Callable[[Any], Any]

    def __init__(
        self,
        *,
        keys: Keys,
        target: TargetAlgorithm,
        backend: ArrayBackend,
        noise_rng: np.random.Generator,
        input_gain: float = 1.0,
    ) -> None:
        self.keys, self.target, self.backend = keys, target, backend
        self.n_state, self.n_input, self.n_output = (
            keys.state_code.n_signal,
            keys.input_code.n_signal,
            keys.output_code.n_signal,
        )
        self._noise = backend.noise_stream(noise_rng)
        self._noise_blocks: NoiseBlocks | None = None
        self._input_enc = keys.input_code.noisy_encoder(backend)
        self._state_enc = keys.state_code.encoder(backend)
        self._state_dec = keys.state_code.decoder(backend)
        self._output_dec = keys.output_code.decoder(backend)
        self._mask = keys.mask.operator(
            keys.input_code,  # type: ignore[arg-type]
            keys.output_code,  # type: ignore[arg-type]
            backend,
        )
        # small dense codes: the noise is encoded a block of samples ahead
        self._signal_enc: Callable[[Any], Any] | None = (
            self._input_enc.signal
            if isinstance(self._input_enc, DenseNoisyEncoder)
            and block_rows(keys.input_code.n_total) > 1
            else None
        )
        self._dense_user = DenseUserSample.of(
            self._signal_enc, self._mask, self._output_dec, self._state_dec
        )
        self._report_args = dict(
            unit_roundoff=backend.unit_roundoff, dtype=backend.dtype_name, input_gain=input_gain
        )
        self._report: PrivacyReport | None = None
        self._bounds: DecodeBounds | None = None

    def _array(self, name: str, value: Any, last_dim: int) -> Any:
        return v.backend_array(self.backend, name, value, last_dim=last_dim)

    def encode_state(self, state: Any) -> Any:
        """``x~0 = Pi2 x0`` (seed 002: the state starts on the manifold, without noise).

        Parameters
        ----------
        state:
            ``x0``, of size ``n_state``.
        """
        return v.finite_result(
            self.backend,
            "state",
            self._state_enc(self._array("state", state, self.n_state)),
            "encoding it",
        )

    def encode_input(self, y: Any) -> Any:
        """``y~ = Pi1 y + N1 s`` with fresh noise ``s`` on every call (eq. 16).

        Parameters
        ----------
        y:
            The input, of size ``n_input`` in its last dimension (may be batched).
        """
        d = self._dense_user
        if (  # small dense keys, one float64 sample: one gemv, one finiteness test of y~
            d is not None
            and d.input is not None
            and type(y) is _ndarray
            and y.dtype is _FLOAT64
            and y.shape == d.y_shape
            and _isfinite(sum(y.tolist()))  # NaN or inf (or a sum that overflows): general path
        ):
            encoded = y.dot(d.input) + (self._noise_blocks or self._start_noise_blocks()).next()
            if _isfinite(sum(encoded.tolist())):
                return encoded
            return v.finite_result(self.backend, "y", encoded, "encoding it")
        arr = self._array("y", y, self.n_input)
        blocks = self._noise_blocks or self._start_noise_blocks()
        lead = tuple(arr.shape[:-1])
        if self._signal_enc is not None:  # small dense code: N1 s came encoded with its block
            encoded = self._signal_enc(arr) + blocks.take(lead)
        else:
            encoded = self._input_enc(arr, blocks.take(lead))
        return v.finite_result(self.backend, "y", encoded, "encoding it")

    def _start_noise_blocks(self) -> NoiseBlocks:
        """The noise ``s_k`` drawn a block of samples ahead (``N1 s_k`` for a small dense code)."""
        law = self.keys.noise
        assert law is not None
        sample = self._noise.laplace if law.kind == "laplace" else self._noise.normal

        def draw(shape: tuple[int, ...]) -> Any:
            return sample(shape, law.mean, law.scale)

        code = self.keys.input_code
        if self._signal_enc is not None:
            project = self._input_enc.noise  # type: ignore[attr-defined]
            blocks = NoiseBlocks(draw, code.n_noise, rows=block_rows(code.n_total), project=project)
        else:
            blocks = NoiseBlocks(draw, code.n_noise, rows=block_rows(code.n_noise))
        self._noise_blocks = blocks
        return blocks

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> Any:
        """``u = Pi3_left (u~ - Pi4 y~)`` (eq. 18).

        Parameters
        ----------
        encoded_output:
            ``u~`` as the cloud returned it.
        encoded_input:
            The ``y~`` it was computed from.
        """
        d = self._dense_user
        if (  # small dense keys, one float64 sample: the products of the dense decoders
            d is not None
            and type(encoded_output) is _ndarray
            and type(encoded_input) is _ndarray
            and encoded_output.dtype is _FLOAT64
            and encoded_input.dtype is _FLOAT64
            and encoded_output.shape == d.ut_shape
            and encoded_input.shape == d.yt_shape
            and _isfinite(sum(encoded_output.tolist() + encoded_input.tolist()))
        ):
            u = (encoded_output - encoded_input.dot(d.mask)).dot(d.output_left)
            if _isfinite(sum(u.tolist())):
                return u  # else the checks below name the overflow
        ut = self._array("encoded_output", encoded_output, self.target.n_output_encoded)
        yt = self._array("encoded_input", encoded_input, self.target.n_input_encoded)
        return v.finite_result(
            self.backend, "encoded_output", self._output_dec(ut - self._mask(yt)), "decoding it"
        )

    def decode_state(self, encoded_state: Any) -> Any:
        """``x = Pi2_left x~``.

        Parameters
        ----------
        encoded_state:
            ``x~``.
        """
        d = self._dense_user
        if (
            d is not None
            and type(encoded_state) is _ndarray
            and encoded_state.dtype is _FLOAT64
            and encoded_state.shape == d.xt_shape
            and _isfinite(sum(encoded_state.tolist()))
        ):
            x = encoded_state.dot(d.state_left)
            if _isfinite(sum(x.tolist())):
                return x
        decoded = self._state_dec(
            self._array("encoded_state", encoded_state, self.target.n_state_encoded)
        )
        return v.finite_result(self.backend, "encoded_state", decoded, "decoding it")

    def decode_output_with_bound(self, encoded_output: Any, encoded_input: Any) -> Decoded:
        """:meth:`decode_output` and a rigorous elementwise bound on its rounding error.

        The bound holds for every call: ``|value - Pi3_left (u~ - Pi4 y~)|`` (exact arithmetic,
        the same vectors and stored keys) is at most ``error_bound``
        (:mod:`immersion.privacy.bounds`). It costs about one more decode.

        Parameters
        ----------
        encoded_output : array
            ``u~`` as the cloud returned it.
        encoded_input : array
            The ``y~`` it was computed from.

        Returns
        -------
        Decoded
            ``(value, error_bound)``.
        """
        ut = self._array("encoded_output", encoded_output, self.target.n_output_encoded)
        yt = self._array("encoded_input", encoded_input, self.target.n_input_encoded)
        return Decoded(self.decode_output(ut, yt), self._decode_bounds().output(ut, yt))

    def decode_state_with_bound(self, encoded_state: Any) -> Decoded:
        """:meth:`decode_state` and a rigorous elementwise bound on its rounding error.

        Parameters
        ----------
        encoded_state : array
            ``x~``.

        Returns
        -------
        Decoded
            ``(value, error_bound)``: ``|value - Pi2_left x~|`` is at most ``error_bound``.
        """
        xt = self._array("encoded_state", encoded_state, self.target.n_state_encoded)
        return Decoded(self.decode_state(xt), self._decode_bounds().state(xt))

    def _decode_bounds(self) -> DecodeBounds:
        if self._bounds is None:
            self._bounds = DecodeBounds(self.keys, self.backend)
        return self._bounds

    def report(self) -> PrivacyReport:
        """Per-element epsilon from the drawn keys, and the estimated decode error (not a bound)."""
        if self._report is None:
            self._report = privacy_report(self.keys, **self._report_args)  # type: ignore[arg-type]
        return self._report

    def __repr__(self) -> str:
        return f"Immersion({self.keys!r}, backend={self.backend.name}/{self.backend.dtype_name})"
