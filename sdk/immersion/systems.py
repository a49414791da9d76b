"""Controllers from python-control: :func:`immerse_system` (seed 002, Proposition 1, eqs. 16-18).

A discrete-time controller reads the plant's measurement ``y`` and returns the plant's input
``u``; its state ``x`` lives in the cloud. That is exactly the algorithm ``x+ = f(x, y)``,
``u = g(x, y)`` of :func:`immersion.immerse`, so a python-control system maps onto it term by
term:

* ``control.StateSpace`` ``(A, B, C, D, dt)``: ``f(x, y) = A x + B y``, ``g(x, y) = C x + D y``;
  a discrete ``control.TransferFunction`` through its realisation ``control.ss(sys)``;
* ``control.NonlinearIOSystem``: ``f(x, y) = updfcn(t, x, y, params)``,
  ``g(x, y) = outfcn(t, x, y, params)``, through python-control's own ``sys.dynamics`` and
  ``sys.output`` (so interconnected systems and ``outfcn=None`` behave as in python-control);
* a tuple ``(A, B, C, D)`` of matrices, read as a discrete-time ``StateSpace``.

numpy only at import time; python-control (extra ``control``) is imported when a python-control
system is given.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

import numpy as np

from . import validation as v
from .backends import make_backend
from .coding.factory import Immersion, immerse
from .errors import InvalidArgumentError, OptionalDependencyError

if TYPE_CHECKING:
    from .lwe import EncryptedController

#: What :func:`immerse_system` returns, by coding: the float immersion's handle, or an LWE one.
CodedController = Union[Immersion, "EncryptedController"]

#: Options that :func:`immerse_system` sets itself from ``sys`` (the user may not pass them).
_DERIVED_OPTIONS = ("n_state", "n_input", "n_output", "n_public")
#: ``immerse``'s ``design``: a :class:`~immersion.Design` holds the dimensions, which
#: :func:`immerse_system` reads from ``sys``; the coding options are passed as keywords instead.
_DESIGN_OPTION = "design"


@dataclass(frozen=True, eq=False)
class DiscreteController:
    """A discrete-time controller ``x+ = f(x, y)``, ``u = g(x, y)`` read from a ``sys``.

    ``matrices`` is ``(A, B, C, D)`` for a linear time-invariant controller (``StateSpace`` or a
    tuple), else ``None``; ``iosys`` is the python-control system for a nonlinear one.
    """

    n_state: int
    n_input: int
    n_output: int
    matrices: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    iosys: Any = None


class LinearMap:
    """``(x, y) -> M x + N y`` with matrices of the backend (picklable, unlike a closure)."""

    def __init__(self, M: Any, N: Any) -> None:
        self.M, self.N = M, N

    def __call__(self, x: Any, y: Any) -> Any:
        return self.M @ x + self.N @ y


class SystemFunction:
    """``sys.dynamics`` or ``sys.output`` at time ``t = 0``: ``(x, y) -> fn(0, x, y, params)``."""

    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None) -> None:
        self.fn, self.params = fn, params

    def __call__(self, x: Any, y: Any) -> Any:
        return self.fn(0.0, x, y, self.params)


class TimedSystemFunction:
    """``sys.dynamics`` or ``sys.output`` at public time ``w = [t]``: ``fn(t, x, y, params)``."""

    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None) -> None:
        self.fn, self.params = fn, params

    def __call__(self, x: Any, y: Any, w: Any) -> Any:
        t = np.asarray(w, dtype=np.float64).reshape(-1)
        if t.size != 1:
            raise InvalidArgumentError("w", f"expected the time as [t], got shape {np.shape(w)}")
        return self.fn(float(t[0]), x, y, self.params)


def _python_control() -> Any:
    try:
        import control
    except ImportError:
        raise OptionalDependencyError(
            "control", "control", "immerse_system with a python-control system"
        ) from None
    return control


def _checked_matrices(
    matrices: tuple[Any, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, C, D)`` as finite float64 matrices of matching shapes, or an error on ``sys``."""
    arrays = []
    for label, value in zip("ABCD", matrices, strict=True):
        try:
            arrays.append(v.finite_array(label, value, ndim=2))
        except InvalidArgumentError as exc:
            raise type(exc)("sys", f"matrix {exc}") from None
    A, B, C, D = arrays
    n, m, p = A.shape[0], B.shape[1], C.shape[0]
    if n == 0:
        raise InvalidArgumentError(
            "sys", "has no state (a static gain): immersion needs a controller state"
        )
    if m == 0 or p == 0:
        raise InvalidArgumentError(
            "sys", f"needs at least one input and one output, got B {B.shape} and C {C.shape}"
        )
    for label, arr, shape in (
        ("A", A, (n, n)),
        ("B", B, (n, m)),
        ("C", C, (p, n)),
        ("D", D, (p, m)),
    ):
        if arr.shape != shape:
            raise InvalidArgumentError(
                "sys",
                f"matrix {label} has shape {arr.shape}, expected {shape} "
                f"(n_state={n}, n_input={m}, n_output={p} from A, B and C)",
            )
    return A, B, C, D


def _positive_dimension(sys: Any, attribute: str) -> int:
    value = getattr(sys, attribute, None)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidArgumentError(
            "sys", f"needs {attribute} >= 1 (give states=, inputs=, outputs=), got {value!r}"
        )
    return int(value)


def _looks_time_varying(sys: Any, n_state: int, n_input: int, params: Any) -> bool:
    """Spot check: does ``dynamics`` or ``output`` change with ``t`` at two points?

    A check at a few points, not a proof: it catches a time-varying system written with an
    explicit ``t`` term, not one whose time dependence vanishes at these points. Points at which
    the user's code raises are skipped (``immerse`` probes and names the failure).
    """
    points = [(np.zeros(n_state), np.zeros(n_input)), (np.full(n_state, 0.5), np.ones(n_input))]
    for x, y in points:
        for fn in (sys.dynamics, sys.output):
            try:
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    at_zero = np.asarray(fn(0.0, x, y, params), dtype=np.float64)
                    later = [np.asarray(fn(t, x, y, params), dtype=np.float64) for t in (1.0, 37.0)]
            except Exception:  # noqa: BLE001 - the user's code; immerse's probe reports failures
                continue
            if any(
                b.shape != at_zero.shape or not np.array_equal(b, at_zero, equal_nan=True)
                for b in later
            ):
                return True
    return False


def read_system(sys: Any) -> DiscreteController:
    """The controller in ``sys`` (``StateSpace``, ``TransferFunction``, ``NonlinearIOSystem`` or
    ``(A, B, C, D)``); continuous-time and unspecified timebases are refused, naming ``sys``.

    Examples
    --------
    >>> import numpy as np
    >>> ctrl = read_system((np.eye(2) * 0.5, np.ones((2, 1)), np.ones((1, 2)), np.zeros((1, 1))))
    >>> ctrl.n_state, ctrl.n_input, ctrl.n_output
    (2, 1, 1)
    """
    if isinstance(sys, tuple):
        if len(sys) != 4:
            raise InvalidArgumentError(
                "sys", f"a tuple must hold the four matrices (A, B, C, D), got {len(sys)} entries"
            )
        A, B, C, D = _checked_matrices(sys)
        return DiscreteController(
            n_state=A.shape[0], n_input=B.shape[1], n_output=C.shape[0], matrices=(A, B, C, D)
        )
    control = _python_control()
    if isinstance(sys, control.TransferFunction):
        v.discrete_timebase("sys", sys.dt)
        sys = control.ss(sys)  # its state-space realisation (same dt), read as a StateSpace
    if isinstance(sys, control.StateSpace):
        v.discrete_timebase("sys", sys.dt)
        A, B, C, D = _checked_matrices((sys.A, sys.B, sys.C, sys.D))
        return DiscreteController(
            n_state=A.shape[0], n_input=B.shape[1], n_output=C.shape[0], matrices=(A, B, C, D)
        )
    if isinstance(sys, control.NonlinearIOSystem):
        v.discrete_timebase("sys", sys.dt)
        return DiscreteController(
            n_state=_positive_dimension(sys, "nstates"),
            n_input=_positive_dimension(sys, "ninputs"),
            n_output=_positive_dimension(sys, "noutputs"),
            iosys=sys,
        )
    raise InvalidArgumentError(
        "sys",
        "expected a discrete-time control.StateSpace, control.TransferFunction, "
        f"control.NonlinearIOSystem or a tuple (A, B, C, D), got {type(sys).__name__}",
    )


def _checked_options(
    options: Mapping[str, Any], builder: Callable[..., Any], coding: str
) -> dict[str, Any]:
    """The keyword-only options of ``builder`` that ``options`` sets; others raise, naming them."""
    accepted = [
        name
        for name, p in inspect.signature(builder).parameters.items()
        if p.kind is p.KEYWORD_ONLY and name not in (*_DERIVED_OPTIONS, _DESIGN_OPTION)
    ]
    for name in options:
        if name in _DERIVED_OPTIONS:
            raise InvalidArgumentError(name, "is read from sys; do not pass it to immerse_system")
        if name == _DESIGN_OPTION:
            raise InvalidArgumentError(
                name,
                "is not taken by immerse_system (the dimensions are read from sys); pass the "
                "coding options as keywords",
            )
        if name not in accepted:
            raise InvalidArgumentError(
                name, f"is not an option of coding={coding!r}; accepted: {', '.join(accepted)}"
            )
    return dict(options)


def _immersion_coding(
    controller: DiscreteController,
    time: str,
    params: dict[str, Any] | None,
    options: dict[str, Any],
) -> Immersion:
    """The affine immersion of seed 002 (Proposition 1) through :func:`immerse`."""
    options = _checked_options(options, immerse, "immersion")
    f: Callable[..., Any]
    g: Callable[..., Any]
    n_public = None
    if controller.matrices is not None:
        if time != "invariant":
            raise InvalidArgumentError("time", "a linear system (A, B, C, D) is time-invariant")
        if params is not None:
            raise InvalidArgumentError("params", "a linear system (A, B, C, D) takes no params")
        be = make_backend(
            options.get("backend", "numpy"),
            dtype=options.get("dtype"),
            device=options.get("device"),
        )
        A, B, C, D = (be.asarray(m) for m in controller.matrices)
        f, g = LinearMap(A, B), LinearMap(C, D)
    else:
        if options.get("backend", "numpy") != "numpy":
            raise InvalidArgumentError(
                "backend",
                "a NonlinearIOSystem runs python-control's numpy code; use backend='numpy'",
            )
        sys = controller.iosys
        if time == "invariant":
            if _looks_time_varying(sys, controller.n_state, controller.n_input, params):
                raise InvalidArgumentError(
                    "sys",
                    "its updfcn or outfcn gave different results at t = 0, 1 and 37 (same x, y): "
                    "time-varying; immerse it with time='public' and pass w=[t] to "
                    "target.step/output/advance (the cloud then sees t)",
                )
            f, g = SystemFunction(sys.dynamics, params), SystemFunction(sys.output, params)
        else:
            f = TimedSystemFunction(sys.dynamics, params)
            g = TimedSystemFunction(sys.output, params)
            n_public = 1
    handle = immerse(
        f,
        g,
        controller.n_state,
        controller.n_input,
        controller.n_output,
        n_public=n_public,
        **options,
    )
    handle.controller_matrices = controller.matrices
    return handle


def _lwe_coding(
    controller: DiscreteController,
    time: str,
    params: dict[str, Any] | None,
    options: dict[str, Any],
) -> CodedController:
    """RLWE encryption of a linear controller, gains included
    (:func:`immersion.lwe.encrypt_controller`)."""
    from .lwe import encrypt_controller

    if controller.matrices is None:
        raise InvalidArgumentError(
            "sys",
            "coding='lwe' runs linear time-invariant controllers only (the cloud multiplies "
            "ciphertexts by integer matrices): give a StateSpace or (A, B, C, D); a "
            "NonlinearIOSystem needs coding='immersion'",
        )
    if time != "invariant":
        raise InvalidArgumentError(
            "time",
            "coding='lwe' runs linear time-invariant controllers only (the cloud applies one "
            "fixed integer matrix to the ciphertexts every sample), so there is no public time "
            "to pass: use time='invariant'; a controller that depends on t needs the float "
            "coding, coding='immersion' with time='public' (a control.NonlinearIOSystem whose "
            "updfcn/outfcn read t)",
        )
    if params is not None:
        raise InvalidArgumentError("params", "a linear system (A, B, C, D) takes no params")
    options = dict(options)
    hide = options.pop("hide_gains", True)
    if hide is not True:
        raise InvalidArgumentError(
            "hide_gains",
            f"got {hide!r}: coding='lwe' always encrypts the gains (the cloud computes on "
            "encrypted coefficients); the earlier public-gains mode, in which the plant re-ran "
            "the controller on its own pads, was removed. Omit hide_gains or pass True",
        )
    return encrypt_controller(
        controller.matrices, **_checked_options(options, encrypt_controller, "lwe")
    )


#: Codings by name: each takes the controller, ``time``, ``params`` and the remaining options.
_CODINGS: dict[str, Callable[..., CodedController]] = {
    "immersion": _immersion_coding,
    "lwe": _lwe_coding,
}


def immerse_system(
    sys: Any,
    *,
    coding: str = "immersion",
    time: Literal["invariant", "public"] = "invariant",
    params: dict[str, Any] | None = None,
    **immerse_options: Any,
) -> CodedController:
    """Immerse a discrete-time python-control controller (seed 002, Proposition 1, eqs. 16-18).

    The controller's input is the plant's measurement ``y``, its output the plant's input ``u``,
    its state ``x`` (e.g. a Kalman estimate) stays encoded in the cloud. The result is the same
    :class:`~immersion.Immersion` as :func:`~immersion.immerse` returns for
    ``f(x, y) = A x + B y``, ``g(x, y) = C x + D y`` (``StateSpace`` or ``(A, B, C, D)``) or
    ``f(x, y) = updfcn(t, x, y, params)``, ``g(x, y) = outfcn(t, x, y, params)``
    (``NonlinearIOSystem``, evaluated by python-control's ``sys.dynamics`` / ``sys.output``).

    Parameters
    ----------
    sys:
        A discrete-time ``control.StateSpace``, ``control.TransferFunction`` (read through
        ``control.ss(sys)``) or ``control.NonlinearIOSystem`` (``dt=True`` or ``dt > 0``;
        continuous-time and ``dt=None`` are refused: discretise with ``control.c2d``), or a
        tuple ``(A, B, C, D)`` of matrices read as a discrete-time state-space controller (no
        python-control needed).
    coding:
        How values are hidden: ``"immersion"`` (seed 002's affine coding, any controller; the
        cloud decodes what it computes on) or ``"lwe"`` (LWE encryption of a linear controller:
        the cloud learns nothing about the signals, docs/tutorials/encrypted_control.md).
    time:
        What ``t`` a ``NonlinearIOSystem`` sees. ``"invariant"`` (default): ``t = 0`` on every
        step, for time-invariant systems; a system whose ``updfcn``/``outfcn`` visibly changes
        with ``t`` (spot-checked at two points) is refused. ``"public"``: ``f`` and ``g`` take
        a public signal ``w = [t]`` that the user passes, unencoded, as the third argument of
        ``target.step`` / ``target.output`` / ``target.advance`` (e.g. ``[k * dt]``): the
        cloud sees ``t``.
    params:
        Parameter values for a ``NonlinearIOSystem``, over ``sys.params`` (as in
        ``sys.dynamics(t, x, u, params)``); ``None`` uses ``sys.params``.
    **immerse_options:
        The keyword options of :func:`~immersion.immerse` (``extra_state``, ``epsilon_input``,
        ``rng``, ``keys``, ``backend``, ...); the dimensions come from ``sys``. A
        ``NonlinearIOSystem`` runs with ``backend="numpy"`` only. With ``coding="lwe"``: those
        of :func:`immersion.lwe.encrypt_controller` (``input_range`` and ``output_range``
        required; ``precision``, ``security_bits``, ``rng``, ``secure``, ...); the gains are
        always encrypted (``hide_gains=True``, the default, is the only value).

    Returns
    -------
    Immersion or EncryptedController
        User-side handle (by ``coding``); ``.target`` goes to the cloud. For a
        ``NonlinearIOSystem`` the target holds ``sys`` (it pickles if ``sys``'s functions do);
        for a linear one only the matrices (``"lwe"``: the encrypted coefficients).

    Examples
    --------
    >>> import numpy as np
    >>> A, B = np.array([[0.9, 0.1], [0.0, 0.7]]), np.array([[0.0], [1.0]])
    >>> C, D = np.array([[-1.0, -0.5]]), np.array([[0.2]])
    >>> imm = immerse_system((A, B, C, D), rng=0)
    >>> x, y = np.array([1.0, -2.0]), np.array([0.3])
    >>> yt = imm.encode_input(y)
    >>> ut, xt = imm.target.advance(imm.encode_state(x), yt)
    >>> bool(np.allclose(imm.decode_output(ut, yt), C @ x + D @ y, atol=1e-9))
    True
    >>> bool(np.allclose(imm.decode_state(xt), A @ x + B @ y, atol=1e-9))
    True
    >>> lwe = immerse_system((A, B, C, D), coding="lwe", input_range=1, output_range=5, rng=0)
    >>> xt = lwe.encode_state()                   # x0 = 0: the first u is D y
    >>> yt = lwe.encode_input(y)
    >>> u = lwe.decode_output(lwe.target.output(xt, yt), yt)
    >>> bool(abs(u[0] - 0.06) < 1e-4), lwe.design.degree
    (True, 4096)
    """
    build = _CODINGS[v.one_of("coding", coding, tuple(_CODINGS))]
    time_mode = v.one_of("time", time, ("invariant", "public"))
    if params is not None and not isinstance(params, Mapping):
        raise InvalidArgumentError("params", f"expected a dict or None, got {params!r}")
    controller = read_system(sys)
    return build(controller, time_mode, None if params is None else dict(params), immerse_options)
