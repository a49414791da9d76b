"""The cloud side of seed 002 eq. 17: the target algorithm and the checked user functions."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import _validation as v
from .backends import ArrayBackend
from .errors import InvalidArgumentError, NonFiniteError
from .keys import Keys
from .keys.codes import DenseTargetSample
from .target_codes import TargetCodes

_FLOAT64 = np.dtype(np.float64)


class CheckedFunction:
    """Calls a user function and checks its result's shape and finiteness (names the function)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        n_out: int,
        uses_public: bool,
        backend: ArrayBackend,
    ) -> None:
        self.fn, self.name, self.n_out, self.uses_public, self._backend = (
            fn,
            name,
            n_out,
            uses_public,
            backend,
        )

    def __call__(self, x: Any, y: Any, w: Any) -> Any:
        out = self.fn(x, y, w) if self.uses_public else self.fn(x, y)
        if (  # the common case on numpy: a float64 vector of the right length
            type(out) is np.ndarray
            and out.dtype is _FLOAT64
            and out.shape == (self.n_out,)
            and self._backend.name == "numpy"
        ):
            if not v.all_finite(out):
                raise NonFiniteError(self.name, "returned NaN or inf")
            return out
        if not self._backend.is_array(out):
            try:
                out = self._backend.asarray(np.asarray(out, dtype=np.float64))
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidArgumentError(
                    self.name, f"returned {type(out).__name__}, not an array of numbers ({exc})"
                ) from None
        dtype = out.dtype
        if getattr(dtype, "is_complex", False) or getattr(dtype, "kind", "f") not in "biuf":
            raise InvalidArgumentError(
                self.name, f"returned values of dtype {dtype}, expected real numbers"
            )
        shape = tuple(out.shape)
        if shape != (self.n_out,):
            if self.n_out == 1 and shape in ((), (1, 1)):
                out = out.reshape((1,))
            else:
                raise InvalidArgumentError(
                    self.name, f"returned shape {shape}, expected ({self.n_out},)"
                )
        if not self._backend.all_finite(out):
            raise NonFiniteError(self.name, "returned NaN or inf")
        return out

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__


def _finite_public(backend: ArrayBackend, w: Any) -> bool:
    """False only for a numeric ``w`` with NaN or inf (``w`` may be anything the user's f and g
    take)."""
    if backend.is_array(w):
        return bool(backend.all_finite(w))
    try:
        return v.all_finite(np.asarray(w, dtype=np.float64))
    except (TypeError, ValueError, OverflowError):
        return True


class TargetAlgorithm:
    """The cloud-side algorithm of seed 002 eq. 17 (and Corollary 1 for two time scales).

    ``step``: ``x~+ = Pi2 f(Pi2_left x~, Pi1_left y~, w)``;
    ``output``: ``u~ = Pi3 g(Pi2_left x~, Pi1_left y~, w) + Pi4 y~``.
    Holds no ``N1``, no ``Pi3_left`` and no noise generator (it pickles without them).

    Parameters
    ----------
    f, g:
        The checked state update and output of the algorithm.
    keys:
        The keys; only the public parts of eq. 17 are kept.
    backend:
        The array backend it computes with.
    """

    # encoders and decoders of one arithmetic (float here, modulo 2^64 in a ModularTarget)
    _state_in: Callable[[Any], Any]
    _state_out: Callable[[Any], Any]
    _input_in: Callable[[Any], Any]
    _output_out: Callable[[Any], Any]
    _mask: Callable[[Any], Any]
    #: ``advance``'s path for small dense keys (None: the general path)
    _dense: DenseTargetSample | None = None

    def __init__(
        self, *, f: CheckedFunction, g: CheckedFunction, keys: Keys, backend: ArrayBackend
    ) -> None:
        self._f, self._g, self.backend = f, g, backend
        self._use_codes(TargetCodes.from_keys(keys, backend))

    def _use_codes(self, codes: TargetCodes) -> None:
        """Take the encoded sizes and the five codes of eq. 17 from one shared object (and, when
        all five are dense numpy float64 operators, their transposed matrices for the fast path)."""
        self.codes = codes
        self.n_state_encoded = codes.n_state_encoded
        self.n_input_encoded = codes.n_input_encoded
        self.n_output_encoded = codes.n_output_encoded
        self._state_in, self._state_out = codes.state_in, codes.state_out
        self._input_in, self._output_out = codes.input_in, codes.output_out
        self._mask = codes.mask
        self._dense = DenseTargetSample.of(
            self._state_in, self._input_in, self._state_out, self._output_out, self._mask
        )

    @classmethod
    def from_matrices(
        cls,
        *,
        f: CheckedFunction,
        g: CheckedFunction,
        backend: ArrayBackend,
        Pi1_left: np.ndarray,
        Pi2: np.ndarray,
        Pi2_left: np.ndarray,
        Pi3: np.ndarray,
        Pi4: np.ndarray,
    ) -> "TargetAlgorithm":
        """A target from the five public dense matrices of eq. 17 (what a remote cloud receives).

        Parameters
        ----------
        f, g:
            The checked state update and output of the algorithm.
        backend:
            The array backend it computes with.
        Pi1_left, Pi2, Pi2_left, Pi3, Pi4:
            The matrices of eq. 17, finite and 2-D, of matching shapes (each is named if not).
        """
        shapes = {
            "Pi2": (Pi2_left.shape[1], f.n_out),
            "Pi2_left": (f.n_out, Pi2.shape[0]),
            "Pi3": (Pi4.shape[0], g.n_out),
            "Pi1_left": (Pi1_left.shape[0], Pi4.shape[1]),
        }
        for name, arr in (
            ("Pi1_left", Pi1_left),
            ("Pi2", Pi2),
            ("Pi2_left", Pi2_left),
            ("Pi3", Pi3),
            ("Pi4", Pi4),
        ):
            if arr.ndim != 2 or not np.isfinite(arr).all():
                raise InvalidArgumentError(name, "expected a finite 2-D matrix")
            if name in shapes and arr.shape != shapes[name]:
                raise InvalidArgumentError(name, f"expected shape {shapes[name]}, got {arr.shape}")
        self = cls.__new__(cls)
        self._f, self._g, self.backend = f, g, backend
        self._use_codes(
            TargetCodes.from_matrices(
                backend, Pi1_left=Pi1_left, Pi2=Pi2, Pi2_left=Pi2_left, Pi3=Pi3, Pi4=Pi4
            )
        )
        return self

    @property
    def uses_public(self) -> bool:
        """True if ``f`` or ``g`` takes the public signal ``w``."""
        return self._f.uses_public or self._g.uses_public

    def _vector(self, name: str, value: Any, size: int) -> Any:
        if (  # small dense keys on numpy float64: a control loop's every call
            self._dense is not None
            and type(value) is np.ndarray
            and value.dtype is _FLOAT64
            and value.shape == (size,)
            and v.all_finite(value)
        ):
            return value
        return v.backend_array(self.backend, name, value, last_dim=size, ndim=1)

    def _check_public(self, w: Any) -> None:
        if w is None and self.uses_public:
            raise InvalidArgumentError(
                "w", "f or g takes a public signal w; pass it as the third argument"
            )
        if w is not None and not self.uses_public:
            raise InvalidArgumentError(
                "w", "neither f nor g takes a public signal w; drop the third argument"
            )

    def step(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """One step of the target dynamics; call it T times on one ``encoded_input`` for two time
        scales.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~``.
        w:
            The public signal, if ``f`` or ``g`` takes one (else None).
        """
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        x, y = self._state_in(xt), self._input_in(yt)
        return self._encoded_state(self._call(self._f, x, y, w))

    def advance(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> tuple[Any, Any]:
        """``(output, step)`` of one sample in one call, decoding ``x~`` and ``y~`` once.

        Equal to ``(self.output(x~, y~, w), self.step(x~, y~, w))``, bit for bit; a controller
        in the cloud calls this once per sample. Small dense keys on numpy float64 take a short
        path (one ``gemv`` per product, each vector tested for finiteness once); if an encoded
        result overflows, the checked path runs again (``f`` and ``g`` are called a second time)
        to name the culprit.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~``.
        w:
            The public signal, if ``f`` or ``g`` takes one (else None).
        """
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        dense = self._dense
        if dense is None:
            x, y = self._state_in(xt), self._input_in(yt)
        else:
            x, y = xt.dot(dense.state_left), yt.dot(dense.input_left)
            ut = self._call(self._g, x, y, w).dot(dense.output) + yt.dot(dense.mask)
            xt_next = self._call(self._f, x, y, w).dot(dense.state)
            if v.all_finite(ut) and v.all_finite(xt_next):
                return ut, xt_next
        return self._encoded_output(self._call(self._g, x, y, w), yt), self._encoded_state(
            self._call(self._f, x, y, w)
        )

    def reencode_state(self, encoded_state: Any, new_target: "TargetAlgorithm") -> Any:
        """``x~_new = Pi2_new Pi2_left x~`` for a key rotation: the same state under
        ``new_target``'s keys.

        The cloud can apply this itself: it learns nothing new, as it decodes the state every step.
        A huge but finite ``x~`` that overflows on the way raises :class:`NonFiniteError`.

        Parameters
        ----------
        encoded_state:
            ``x~`` under this target's keys.
        new_target:
            The target of the next key period.
        """
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        x = v.finite_result(self.backend, "encoded_state", self._state_in(xt), "decoding it")
        return v.finite_result(
            self.backend, "encoded_state", new_target._state_out(x), "re-encoding it"
        )

    def output(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """The encoded output ``u~`` of the current state and input.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~``.
        w:
            The public signal, if ``f`` or ``g`` takes one (else None).
        """
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        return self._encoded_output(
            self._call(self._g, self._state_in(xt), self._input_in(yt), w), yt
        )

    # Huge but finite encoded vectors or results can overflow once multiplied by the keys: name the
    # culprit (checked only on the way out, or when f/g already failed, so the common path costs
    # one finiteness test).
    def _call(self, fn: CheckedFunction, x: Any, y: Any, w: Any) -> Any:
        try:
            return fn(x, y, w)
        except NonFiniteError:
            for name, decoded in (("encoded_state", x), ("encoded_input", y)):
                v.finite_result(self.backend, name, decoded, "decoding it")
            if w is not None and not _finite_public(self.backend, w):
                raise NonFiniteError("w", "contains NaN or inf") from None
            raise

    def _encoded_state(self, fx: Any) -> Any:
        return v.finite_result(self.backend, "f", self._state_out(fx), "its result, once encoded,")

    def _encoded_output(self, gx: Any, yt: Any) -> Any:
        masked = self._mask(yt)
        out = self._output_out(gx) + masked
        if not self.backend.all_finite(out):
            v.finite_result(self.backend, "encoded_input", masked, "its mask term Pi4 y~")
            v.finite_result(self.backend, "g", out, "its result, once encoded,")
        return out
