"""The modular immersion: seed 002's affine coding (Proposition 1) over the integers modulo 2^64.

``immerse(f, g, ..., arithmetic="modular", fraction_bits=f)`` returns a :class:`ModularImmersion`:
values cross the user-cloud link as fixed-point integers ``q(v) = round(v 2^f)`` encoded with
integer keys invertible modulo ``2^64`` (:mod:`immersion.keys.modular`) and noise uniform modulo
``2^64`` (eq. 16 with ``Pi1 q(y) + N1 s mod 2^64``). The cloud's :class:`ModularTarget` decodes
``x = 2^-f Pi2_left x~`` and ``y = 2^-f Pi1_left y~`` exactly, runs ``f`` and ``g`` in float64 on
these fixed-point values and re-encodes their results (eq. 17 modulo ``2^64``); the user's
decode (eq. 18) returns ``q(u)`` bit for bit. Every computation on the link is exact integer
arithmetic, so the decoded trajectory equals the :class:`FixedPointTwin` (the plain algorithm
with every value that crosses the link rounded to the grid ``2^-f Z``) bit for bit at every
step, whatever the noise: there is no precision/privacy trade-off (seed 002 section 5 has one in
float64).

What it does not change (THREAT_MODEL.md): the cloud running the target holds ``Pi1_left`` and
``Pi2_left`` and sees every input and state in the clear; ``y~`` lies in ``Pi1 q(y) + range(N1)``,
so known plaintext pairs give ``Pi1_left`` (by elimination modulo ``2^64``) and a stream of small
fixed-point values can be attacked by lattice reduction (``immersion audit``).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..backends.numpy_backend import NumpyBackend
from ..errors import InvalidArgumentError
from ..integer import (
    DEFAULT_FRACTION_BITS,
    FixedPointDecoder,
    FixedPointEncoder,
    as_uint64,
    check_fraction_bits,
    decode_fixed,
    encode_fixed,
    quantise,
    uniform_noise,
)
from ..keys.modular import ModularKeys
from ..privacy import PrivacyReport
from .handle import Immersion
from .target import CheckedFunction, TargetAlgorithm
from .target_codes import TargetCodes

# DEFAULT_FRACTION_BITS and the fixed-point codes live in :mod:`immersion.integer` (shared by
# every integer coding); they stay importable from here.
__all__ = [
    "DEFAULT_FRACTION_BITS",
    "FixedPointDecoder",
    "FixedPointEncoder",
    "FixedPointTwin",
    "ModularImmersion",
    "ModularTarget",
]


class ModularTarget(TargetAlgorithm):
    """The cloud side of the modular immersion: eq. 17 modulo ``2^64`` with ``f``, ``g`` in float.

    ``step``: ``x~+ = Pi2 q(f(2^-f Pi2_left x~, 2^-f Pi1_left y~, w))``;
    ``output``: ``u~ = Pi3 q(g(...)) + Pi4 y~``. Encoded vectors are ``uint64`` arrays.
    Holds no ``N1``, no ``Pi3_left`` and no noise generator.
    """

    def __init__(
        self,
        *,
        f: CheckedFunction,
        g: CheckedFunction,
        keys: ModularKeys,
        fraction_bits: int,
    ) -> None:
        self._f, self._g, self.backend = f, g, NumpyBackend()
        self.fraction_bits = fraction_bits
        self._use_codes(TargetCodes.fixed_point(keys, fraction_bits))

    @classmethod
    def from_codes(
        cls, *, f: CheckedFunction, g: CheckedFunction, codes: TargetCodes, fraction_bits: int
    ) -> "ModularTarget":
        """A modular target on given fixed-point codes (remote mode builds them from the
        shipped integer matrices, :mod:`immersion.remote.linear`).

        Parameters
        ----------
        f, g:
            The checked state update and output.
        codes:
            The fixed-point codes of eq. 17 (:meth:`TargetCodes.fixed_point` or equivalent).
        fraction_bits:
            ``f`` of ``q(v) = round(v 2^f)``.
        """
        self = cls.__new__(cls)
        self._f, self._g, self.backend = f, g, NumpyBackend()
        self.fraction_bits = fraction_bits
        self._use_codes(codes)
        return self

    @classmethod
    def from_matrices(cls, **_: Any) -> "TargetAlgorithm":  # type: ignore[override]
        """Not available: a modular target is built by :func:`immersion.immerse`."""
        raise InvalidArgumentError(
            "arithmetic", "TargetAlgorithm.from_matrices builds float targets only"
        )

    def _vector(self, name: str, value: Any, size: int) -> Any:
        arr = as_uint64(name, value, last_dim=size)
        if arr.ndim != 1:
            raise InvalidArgumentError(name, f"expected shape ({size},), got {arr.shape}")
        return arr


class ModularImmersion(Immersion):
    """User-side handle of the modular arithmetic: integer keys, exact encoder and decoder, report.

    Same loop as :class:`Immersion` (``encode_state``, ``encode_input``, ``target.output``,
    ``decode_output``, ``target.step``); encoded vectors are ``uint64`` arrays and decoded values
    are the fixed-point values ``q(v) 2^-f`` (``decode_*_fixed`` give the integers ``q(v)``).
    """

    def __init__(
        self,
        *,
        keys: ModularKeys,
        target: ModularTarget,
        noise_rng: np.random.Generator,
        fraction_bits: int,
    ) -> None:
        self.keys, self.target, self.backend = keys, target, target.backend
        self.fraction_bits = fraction_bits
        self.n_state, self.n_input, self.n_output = (
            keys.state_code.n_signal,
            keys.input_code.n_signal,
            keys.output_code.n_signal,
        )
        self._rng = noise_rng
        self._n_noise = keys.input_code.n_noise
        self._input_enc = keys.input_code.noisy_encoder()
        self._state_enc = keys.state_code.encoder()
        self._state_dec = keys.state_code.decoder()
        self._output_dec = keys.output_code.decoder()
        self._mask_op = keys.mask.operator(keys.input_code)
        self._report: PrivacyReport | None = None

    def encode_state(self, state: Any) -> Any:
        """``x~0 = Pi2 q(x0) mod 2^64`` (no noise, as in the float arithmetic)."""
        arr = v.finite_array("state", state, last_dim=self.n_state)
        return self._state_enc(encode_fixed(arr, self.fraction_bits, name="state"))

    def encode_input(self, y: Any) -> Any:
        """``y~ = Pi1 q(y) + N1 s mod 2^64``, fresh ``s`` uniform modulo 2^64; may be batched."""
        arr = v.finite_array("y", y, last_dim=self.n_input)
        q = encode_fixed(arr, self.fraction_bits, name="y")
        return self._input_enc(q, uniform_noise(self._rng, q.shape[:-1] + (self._n_noise,)))

    def decode_output_fixed(self, encoded_output: Any, encoded_input: Any) -> np.ndarray:
        """``q(u) = Pi3_left (u~ - Pi4 y~) mod 2^64`` as ``uint64`` (eq. 18, exact)."""
        ut = as_uint64("encoded_output", encoded_output, last_dim=self.target.n_output_encoded)
        yt = as_uint64("encoded_input", encoded_input, last_dim=self.target.n_input_encoded)
        return self._output_dec(ut - self._mask_op(yt))

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> Any:
        """``u = 2^-f q(u)``: bit-identical to the :class:`FixedPointTwin`'s output."""
        return decode_fixed(
            self.decode_output_fixed(encoded_output, encoded_input), self.fraction_bits
        )

    def decode_state_fixed(self, encoded_state: Any) -> np.ndarray:
        """``q(x) = Pi2_left x~ mod 2^64`` as ``uint64``."""
        xt = as_uint64("encoded_state", encoded_state, last_dim=self.target.n_state_encoded)
        return self._state_dec(xt)

    def decode_state(self, encoded_state: Any) -> Any:
        """``x = 2^-f Pi2_left x~``."""
        return decode_fixed(self.decode_state_fixed(encoded_state), self.fraction_bits)

    def report(self) -> PrivacyReport:
        """Per-element epsilon 0 (uniform elements, checked on the keys), the grid step ``2^-f``."""
        if self._report is None:
            from ..privacy.report import modular_privacy_report

            self._report = modular_privacy_report(self.keys, self.fraction_bits)
        return self._report

    def __repr__(self) -> str:
        return f"ModularImmersion({self.keys!r}, fraction_bits={self.fraction_bits})"


class FixedPointTwin:
    """The plain algorithm as the modular immersion computes it: the reference for exactness.

    Every value that crosses the link is rounded to the grid ``2^-f Z`` (:func:`quantise`):
    ``output(x, y) = q(g(q(x), q(y)))``, ``step(x, y) = q(f(q(x), q(y)))`` (``q`` here returns the
    grid value). A modular immersion's decoded outputs and states equal these bit for bit.

    Examples
    --------
    >>> import numpy as np
    >>> from immersion import immerse
    >>> f, g = (lambda x, y: np.tanh(0.5 * x + y)), (lambda x, y: 3.0 * x - y)
    >>> imm = immerse(f, g, n_state=1, n_input=1, n_output=1, arithmetic="modular",
    ...               fraction_bits=20, rng=0)
    >>> twin = FixedPointTwin(f, g, fraction_bits=20)
    >>> x, xt = np.array([0.3]), imm.encode_state(np.array([0.3]))
    >>> for y in np.linspace(-1, 1, 50)[:, None]:
    ...     yt = imm.encode_input(y)
    ...     u = imm.decode_output(imm.target.output(xt, yt), yt)
    ...     assert u.tobytes() == twin.output(x, y).tobytes()
    ...     xt, x = imm.target.step(xt, yt), twin.step(x, y)
    >>> imm.decode_state(xt).tobytes() == x.tobytes()
    True
    """

    def __init__(self, f: Callable[..., Any], g: Callable[..., Any], *, fraction_bits: int) -> None:
        self._f, self._g = f, g
        self.fraction_bits = check_fraction_bits(fraction_bits)

    def _args(self, x: Any, y: Any, w: tuple[Any, ...]) -> tuple[Any, ...]:
        fb = self.fraction_bits
        return (quantise(x, fb, name="state"), quantise(y, fb, name="y"), *w)

    def output(self, x: Any, y: Any, *w: Any) -> np.ndarray:
        """``q(g(q(x), q(y)[, w]))`` as float64 grid values."""
        return quantise(self._g(*self._args(x, y, w)), self.fraction_bits, name="g").reshape(-1)

    def step(self, x: Any, y: Any, *w: Any) -> np.ndarray:
        """``q(f(q(x), q(y)[, w]))`` as float64 grid values."""
        return quantise(self._f(*self._args(x, y, w)), self.fraction_bits, name="f").reshape(-1)
