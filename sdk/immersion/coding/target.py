"""The cloud side of seed 002 eq. 17: the target algorithm and the checked user functions."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..backends import ArrayBackend
from ..errors import InvalidArgumentError, NonFiniteError
from ..keys import Keys
from ..keys.codes import DenseTargetSample
from .target_codes import TargetCodes

_FLOAT64 = np.dtype(np.float64)
_ndarray = np.ndarray
_isfinite = math.isfinite


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
        return self.check(self.fn(x, y, w) if self.uses_public else self.fn(x, y))

    def check(self, out: Any) -> Any:
        """``out`` (what the function returned) as an array of the backend, shape ``(n_out,)``,
        finite; else an error naming the function.

        Parameters
        ----------
        out : Any
            The function's result.
        """
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
    #: the matrices of small dense keys on numpy float64 (None: the general operators)
    _dense: DenseTargetSample | None = None
    #: ``advance``'s short path when neither ``f`` nor ``g`` takes ``w``: ``_dense``'s matrices
    #: and shapes, and the user's ``g`` and ``f`` (one tuple: one attribute load per sample)
    _fast: tuple[Any, ...] | None = None

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
        self._fast = self._fast_parts(self._dense)

    def _fast_parts(self, d: DenseTargetSample | None) -> tuple[Any, ...] | None:
        if d is None or self.uses_public:
            return None
        matrices = (d.state_left, d.input_left, d.state, d.output, d.mask)
        return matrices + (
            d.state_shape,
            d.input_shape,
            d.f_shape,
            d.g_shape,
            self._g.fn,
            self._f.fn,
        )

    @classmethod
    def from_dense(
        cls,
        *,
        f: CheckedFunction,
        g: CheckedFunction,
        backend: ArrayBackend,
        dense: DenseTargetSample,
    ) -> "TargetAlgorithm":
        """A target from the transposed matrices of keys this library drew (no checks, no copy:
        the key pool of :mod:`immersion.coding.key_pool`; matrices received from elsewhere go
        through :meth:`from_matrices`). The operators of the general path are made on first use.

        Parameters
        ----------
        f, g : CheckedFunction
            The checked user functions.
        backend : ArrayBackend
            The numpy float64 backend.
        dense : DenseTargetSample
            ``Pi2_left^T, Pi1_left^T, Pi2^T, Pi3^T, Pi4^T``, C-contiguous float64.
        """
        self = _DenseTarget.__new__(_DenseTarget)
        self._f, self._g, self.backend, self._dense = f, g, backend, dense
        self.n_state_encoded, self.n_input_encoded = dense.state_shape[0], dense.input_shape[0]
        self.n_output_encoded = dense.mask.shape[1]
        self._fast = self._fast_parts(dense)
        return self

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
        path: one ``gemv`` per product; three finiteness tests, each over two vectors at once
        (``x~`` and ``y~`` before any arithmetic; what ``g`` and ``f`` returned before it is
        encoded; the two encoded results, for overflow). Where a test fails, the checks of the
        general path name the culprit, in its order, from the values already computed (``f``
        and ``g`` are called once).

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~``.
        w:
            The public signal, if ``f`` or ``g`` takes one (else None).
        """
        fast = self._fast
        if fast is not None and w is None:
            state_left, input_left, state, output, mask, xs, ys, fs, gs, g, f = fast
            if (
                type(encoded_state) is _ndarray
                and type(encoded_input) is _ndarray
                and encoded_state.dtype is _FLOAT64
                and encoded_input.dtype is _FLOAT64
                and encoded_state.shape == xs
                and encoded_input.shape == ys
                # the sum is finite unless an entry is NaN or inf (or it overflows: general path)
                and _isfinite(sum(encoded_state.tolist() + encoded_input.tolist()))
            ):
                x, y = encoded_state.dot(state_left), encoded_input.dot(input_left)
                gx, fx = g(x, y), f(x, y)
                if not (type(gx) is _ndarray and gx.dtype is _FLOAT64 and gx.shape == gs):
                    gx = self._checked(self._g, gx, x, y)
                if not (type(fx) is _ndarray and fx.dtype is _FLOAT64 and fx.shape == fs):
                    fx = self._checked(self._f, fx, x, y)
                if not _isfinite(sum(gx.tolist() + fx.tolist())):  # before any product
                    self._name_culprit(x, y, gx, fx)
                masked = encoded_input.dot(mask)
                ut, xt_next = gx.dot(output) + masked, fx.dot(state)
                if not _isfinite(sum(ut.tolist() + xt_next.tolist())):
                    self._name_overflow(masked, ut, xt_next)
                return ut, xt_next
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        dense = self._dense
        if dense is None:
            x, y = self._state_in(xt), self._input_in(yt)
        else:
            x, y = xt.dot(dense.state_left), yt.dot(dense.input_left)
        return self._encoded_output(self._call(self._g, x, y, w), yt), self._encoded_state(
            self._call(self._f, x, y, w)
        )

    def _checked(self, fn: CheckedFunction, out: Any, x: Any, y: Any) -> Any:
        """``fn.check(out)``; a NaN or inf in it is first traced to a decoding overflow, as
        :meth:`_call` does."""
        try:
            return fn.check(out)
        except NonFiniteError:
            self._decoding_overflow(x, y)
            raise

    def _decoding_overflow(self, x: Any, y: Any) -> None:
        for name, decoded in (("encoded_state", x), ("encoded_input", y)):
            v.finite_result(self.backend, name, decoded, "decoding it")

    def _name_culprit(self, x: Any, y: Any, gx: Any, fx: Any) -> None:
        """The general path's check of a NaN or inf that ``g`` or ``f`` returned, in its order
        (``g`` first); nothing when both are finite (a sum that overflowed)."""
        for fn, result in ((self._g, gx), (self._f, fx)):
            if not v.all_finite(result):
                self._decoding_overflow(x, y)
                raise NonFiniteError(fn.name, "returned NaN or inf")

    def _name_overflow(self, masked: Any, ut: Any, xt_next: Any) -> None:
        """The general path's checks of the encoded results, in its order: raise naming
        ``encoded_input``, ``g`` or ``f`` (nothing when every entry is finite)."""
        if not v.all_finite(ut):
            v.finite_result(self.backend, "encoded_input", masked, "its mask term Pi4 y~")
            v.finite_result(self.backend, "g", ut, "its result, once encoded,")
        v.finite_result(self.backend, "f", xt_next, "its result, once encoded,")

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
        old, new = self._dense, new_target._dense
        if old is not None and new is not None and type(xt) is np.ndarray:
            x = xt.dot(old.state_left)  # what the dense operators compute
            x = v.finite_result(self.backend, "encoded_state", x, "decoding it")
            x_new = x.dot(new.state)
        else:
            x = v.finite_result(self.backend, "encoded_state", self._state_in(xt), "decoding it")
            x_new = new_target._state_out(x)
        return v.finite_result(self.backend, "encoded_state", x_new, "re-encoding it")

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
            self._decoding_overflow(x, y)
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


class _DenseTarget(TargetAlgorithm):
    """A target made by :meth:`TargetAlgorithm.from_dense`: its codes (the general path's
    operators) are built from the transposed matrices on first use."""

    @cached_property
    def codes(self) -> TargetCodes:  # type: ignore[override]
        assert self._dense is not None
        return TargetCodes.from_transposed(self._dense)

    @cached_property
    def _state_in(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self.codes.state_in

    @cached_property
    def _state_out(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self.codes.state_out

    @cached_property
    def _input_in(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self.codes.input_in

    @cached_property
    def _output_out(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self.codes.output_out

    @cached_property
    def _mask(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return self.codes.mask
