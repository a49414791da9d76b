"""Small argument checks shared by the public API and the plugins (one place, one wording)."""

from __future__ import annotations

import math
import numbers
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidArgumentError, NonFiniteError

if TYPE_CHECKING:
    from .backends import ArrayBackend

_FLOAT64 = np.dtype(np.float64)

#: Below this many entries a Python loop checks finiteness faster than a numpy call.
_SMALL = 64


def all_finite(arr: np.ndarray) -> bool:
    """True if every entry of a float array is finite (fast for a control loop's small vectors)."""
    if arr.size <= _SMALL:
        entries = (arr if arr.ndim == 1 else arr.ravel()).tolist()
        # the sum is finite unless an entry is NaN or inf (or the sum overflows: test each entry)
        return math.isfinite(sum(entries)) or all(map(math.isfinite, entries))
    return bool(np.isfinite(arr).all())


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` as an int >= ``minimum`` or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(name, f"expected an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise InvalidArgumentError(name, f"expected an integer >= {minimum}, got {value}")
    return int(value)


def as_float(value: Any) -> float:
    """``float(value)``, ``inf`` for an integer beyond float64 (instead of an OverflowError)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def positive_float(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a finite float > 0 (or >= 0) or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(name, f"expected a positive number, got {value!r}")
    out = as_float(value)
    if not np.isfinite(out) or out < 0 or (out == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(name, f"expected a finite number {bound}, got {value!r}")
    return out


def probability(name: str, value: Any) -> float:
    """Return ``value`` as a float in (0, 1) or raise naming ``name``."""
    out = positive_float(name, value)
    if out >= 1:
        raise InvalidArgumentError(name, f"expected a probability in (0, 1), got {value!r}")
    return out


#: dtype kinds accepted as numbers: bool, signed/unsigned integer, float, and object (checked entry
#: by entry).
_NUMERIC_KINDS = "biufO"


def finite_array(
    name: str, value: Any, *, last_dim: int | None = None, ndim: int | None = None
) -> np.ndarray:
    """Convert ``value`` to a float64 array, checking its trailing length and finiteness."""
    if type(value) is np.ndarray and value.dtype == np.float64:
        arr = value  # fast path: the common case on every step
    else:
        if isinstance(value, np.ma.MaskedArray):  # masked entries are missing values
            value = (
                np.ma.filled(value.astype(np.float64), np.nan)
                if value.dtype.kind in "biuf"
                else value.data
            )
        try:
            raw = np.asarray(value)
            if raw.dtype.kind == "c":
                raise InvalidArgumentError(name, "expected real numbers, got complex values")
            if raw.dtype.kind not in _NUMERIC_KINDS:
                raise InvalidArgumentError(
                    name, f"expected an array of numbers, got dtype {raw.dtype}"
                )
            arr = raw.astype(np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(name, f"expected an array of numbers ({exc})") from None
    if ndim is not None and arr.ndim != ndim:
        raise InvalidArgumentError(name, f"expected {ndim} dimension(s), got shape {arr.shape}")
    if last_dim is not None and (arr.ndim == 0 or arr.shape[-1] != last_dim):
        raise InvalidArgumentError(name, f"expected shape (..., {last_dim}), got shape {arr.shape}")
    if not all_finite(arr):
        raise NonFiniteError(name, "contains NaN or inf")
    return arr


def native_float64(
    backend: ArrayBackend, value: Any, last_dim: int, ndim: int | None = None
) -> bool:
    """True for a native float64 ndarray with trailing length ``last_dim`` on the numpy float64
    backend: what a numpy control loop passes on every call (its finiteness is not tested here).
    """
    return (
        type(value) is np.ndarray
        and value.dtype is _FLOAT64
        and value.shape[-1:] == (last_dim,)
        and (ndim is None or value.ndim == ndim)
        and backend.name == "numpy"
        and backend.dtype_name == "float64"
    )


def backend_array(
    backend: ArrayBackend, name: str, value: Any, *, last_dim: int, ndim: int | None = None
) -> Any:
    """``value`` as an array of ``backend``, with trailing length ``last_dim`` and finite entries.

    Tensors of the backend are checked in place (no copy to numpy); anything else goes through
    :func:`finite_array`. A float64 ndarray of the right shape on the numpy float64 backend (a
    control loop's every call) is checked and returned as it is.
    """
    if native_float64(backend, value, last_dim, ndim):
        if not all_finite(value):
            raise NonFiniteError(name, "contains NaN or inf")
        return value
    if backend.is_array(value) and not isinstance(value, np.ndarray):
        if getattr(value, "is_complex", lambda: False)():
            raise InvalidArgumentError(name, "expected real numbers, got complex values")
        if str(getattr(value, "layout", "torch.strided")) != "torch.strided" or getattr(
            value, "is_meta", False
        ):
            raise InvalidArgumentError(
                name, "expected a dense tensor holding values (not sparse, not meta)"
            )
        if (
            value.ndim == 0
            or value.shape[-1] != last_dim
            or (ndim is not None and value.ndim != ndim)
        ):
            want = f"({last_dim},)" if ndim == 1 else f"(..., {last_dim})"
            raise InvalidArgumentError(name, f"expected shape {want}, got {tuple(value.shape)}")
        if not backend.all_finite(value):
            raise NonFiniteError(name, "contains NaN or inf")
        return backend.asarray(value)
    return backend.asarray(finite_array(name, value, last_dim=last_dim, ndim=ndim))


def discrete_timebase(name: str, dt: Any) -> None:
    """Refuse a continuous-time (``dt == 0``) or unspecified (``dt is None``) timebase.

    One wording for every entry point that takes a python-control system (``immerse_system``,
    ``immersion.lwe.encrypt_controller``): the controller must be sampled.

    Parameters
    ----------
    name:
        The argument the system came in (named in the error).
    dt:
        The system's timebase: ``True`` or a sampling period ``> 0`` pass.

    Examples
    --------
    >>> discrete_timebase("sys", 0.05)
    >>> discrete_timebase("sys", 0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: sys: is continuous-time (dt=0); discretise it first, ...
    """
    if dt is True or (
        isinstance(dt, numbers.Real) and not isinstance(dt, (bool, np.bool_)) and float(dt) > 0
    ):
        return
    what = "has no timebase (dt=None)" if dt is None else f"is continuous-time (dt={dt!r})"
    raise InvalidArgumentError(
        name,
        f"{what}; discretise it first, e.g. control.c2d(sys, Ts), or build it with dt=True or "
        "the sampling period dt > 0",
    )


def one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed`` or raise naming ``name``."""
    if not isinstance(value, str) or value not in allowed:
        raise InvalidArgumentError(
            name, f"expected one of {', '.join(map(repr, allowed))}, got {value!r}"
        )
    return str(value)


def finite_result(backend: ArrayBackend, name: str, value: Any, what: str) -> Any:
    """``value`` (computed from finite inputs) if finite, else a :class:`NonFiniteError` naming it.

    Huge but finite inputs can overflow to inf (or NaN) once multiplied by the keys: that must
    raise, not propagate.
    """
    if backend.all_finite(value):
        return value
    raise NonFiniteError(
        name, f"is too large: {what} overflows to inf or NaN in {backend.dtype_name}"
    )


def physical_memory() -> float:
    """Bytes of physical memory (inf where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return math.inf


def vector_fits(name: str, value: int, entries: int, what: str = "one encoded vector") -> None:
    """Refuse sizes for which ``what`` (``entries`` float64 numbers) could not fit in memory.

    The error names ``name``.
    """
    memory = physical_memory()
    if 8 * entries > memory:
        raise InvalidArgumentError(
            name,
            f"{value} is too large: {what} needs {entries} float64 entries, more than "
            f"this machine's {memory / 2**30:.0f} GiB of memory",
        )
