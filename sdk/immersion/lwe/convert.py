"""Linear controllers for the LWE coding: parsing, and conversion to the input-output history form.

Why a conversion. Under LWE the cloud can add ciphertexts and multiply them by *integers*. A
controller ``x+ = F x + G y``, ``u = H x + J y`` run on an encrypted state multiplies by the
non-integer ``F`` every step, so the fixed-point scale of ``x`` would grow without bound. Kim, Shim
and Han (arXiv 1912.07362) remove the growth with **output injection through the fed-back u**:
for any ``R``,

    x+ = (F - R H) x + (G - R J) y + R u,

because ``H x = u - J y``. If ``F_R = F - R H`` is nilpotent (deadbeat, ``F_R^N = 0``), unrolling
``N`` steps removes the state altogether (Lee, Lee, Kim and Shim, arXiv 2307.03451, the
input-output history form):

    u_k = J y_k + sum_{i=1..N} H F_R^(i-1) [(G - R J) y_(k-i) + R u_(k-i)]  (+ H F_R^k x_0, k < N).

The cloud's state is then the window of the last ``N`` encrypted ``y`` and ``u``; its state matrix
is a 0/1 shift (an integer matrix, Kim-Shim-Han's condition), and each sample costs one product
of plaintext integers by ciphertexts, so neither the scale nor the noise grows with time.

How ``R`` is found. Unobservable modes never reach ``u``: they are dropped first (an orthonormal
basis of the observable part; exact). For a single output Ackermann's formula for the dual
system gives the unique deadbeat ``R``; with several outputs the outputs are first combined
(``c^T H``) into one that observes the pair, after an output injection ``R_0`` that makes ``F``
cyclic where needed (Heymann's lemma). The result is checked: ``||H F_R^N||`` must be negligible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..validation import discrete_timebase

#: A conversion whose neglected term ``||H F_R^N|| / ||H||`` exceeds this is refused.
RESIDUAL_TOLERANCE = 1e-9
#: Samples over which a reduced (observable-part) realisation is compared with the original.
CHECK_HORIZON = 2000

_FLOAT_CODING = "use the float coding (coding='immersion', i.e. immersion.immerse(f, g))"


@dataclass(frozen=True)
class LinearController:
    """A discrete-time LTI controller ``x+ = F x + G y``, ``u = H x + J y`` (float64, checked)."""

    F: np.ndarray
    G: np.ndarray
    H: np.ndarray
    J: np.ndarray

    @property
    def n_state(self) -> int:
        return self.F.shape[0]

    @property
    def n_input(self) -> int:
        return self.G.shape[1]

    @property
    def n_output(self) -> int:
        return self.H.shape[0]


@dataclass(frozen=True)
class HistoryForm:
    """``u_k = sum_i theta_y[i] y_(k-i) + sum_i theta_u[i-1] u_(k-i) + initial[k] x_0``.

    ``theta_y``: ``(N + 1, n_u, n_y)`` for ``i = 0..N``; ``theta_u``: ``(N, n_u, n_u)`` for
    ``i = 1..N``; ``initial``: ``(N, n_u, n_x)``, ``H F_R^k`` in the original coordinates.
    ``residual``: ``||H F_R^N||_2 / ||H||_2`` (what the truncation neglects).
    """

    theta_y: np.ndarray
    theta_u: np.ndarray
    initial: np.ndarray
    injection: np.ndarray
    residual: float
    n_state: int
    n_observable: int

    @property
    def window(self) -> int:
        return self.theta_u.shape[0]

    @property
    def n_input(self) -> int:
        return self.theta_y.shape[2]

    @property
    def n_output(self) -> int:
        return self.theta_y.shape[1]


def _matrix(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(name, f"expected a real matrix ({exc})") from None
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise InvalidArgumentError(name, f"expected a 2-D matrix, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise InvalidArgumentError(name, "contains NaN or inf")
    return arr


def _refuse_nonlinear(sys: Any) -> None:
    if callable(sys) or hasattr(sys, "updfcn") or hasattr(sys, "outfcn"):
        raise InvalidArgumentError(
            "sys",
            f"coding='lwe' runs linear time-invariant controllers only (the cloud multiplies "
            f"ciphertexts by public integer matrices); {type(sys).__name__} is not one: "
            + _FLOAT_CODING,
        )


def linear_controller(sys: Any) -> LinearController:
    """``(F, G, H, J)`` of a discrete LTI controller: ``(A, B, C, D)`` or a python-control system.

    Accepts a tuple/list ``(A, B, C, D)``, a discrete-time ``control.StateSpace`` (``dt`` > 0 or
    ``True``) or a discrete ``control.TransferFunction`` (through ``control.ss(sys)``), as
    :func:`immersion.immerse_system` does. Refuses nonlinear systems (``NonlinearIOSystem``,
    callables) and continuous-time or unspecified timebases (``dt == 0``, ``dt is None``),
    naming ``sys`` and why.

    Parameters
    ----------
    sys:
        The controller.

    Returns
    -------
    LinearController

    Examples
    --------
    >>> c = linear_controller(([[1.0]], [[0.1]], [[1.0]], [[2.0]]))
    >>> c.n_state, c.n_input, c.n_output
    (1, 1, 1)
    """
    if type(sys).__name__ == "TransferFunction" and hasattr(sys, "num"):
        import control

        discrete_timebase("sys", sys.dt)
        sys = control.ss(sys)
    if isinstance(sys, (tuple, list)):
        if len(sys) != 4:
            raise InvalidArgumentError(
                "sys", f"expected (A, B, C, D), got a sequence of {len(sys)} items"
            )
        A, B, C, D = sys
    elif all(hasattr(sys, name) for name in "ABCD"):
        if hasattr(sys, "dt"):  # a python-control (or scipy) system carries its timebase
            discrete_timebase("sys", sys.dt)
        A, B, C, D = sys.A, sys.B, sys.C, sys.D
    else:
        _refuse_nonlinear(sys)
        raise InvalidArgumentError(
            "sys",
            "expected (A, B, C, D), a discrete control.StateSpace or control.TransferFunction, "
            f"got {type(sys).__name__}",
        )
    F, G, H, J = _matrix("A", A), _matrix("B", B), _matrix("C", C), _matrix("D", D)
    n = F.shape[0]
    if F.shape != (n, n) or n == 0:
        raise InvalidArgumentError("A", f"expected a square matrix, got shape {F.shape}")
    if G.shape[0] != n:
        raise InvalidArgumentError("B", f"expected {n} rows (A is {n}x{n}), got shape {G.shape}")
    if H.shape[1] != n:
        raise InvalidArgumentError("C", f"expected {n} columns (A is {n}x{n}), got shape {H.shape}")
    if J.shape != (H.shape[0], G.shape[1]):
        raise InvalidArgumentError(
            "D",
            f"expected shape {(H.shape[0], G.shape[1])} (rows of C, columns of B), got {J.shape}",
        )
    return LinearController(F, G, H, J)


def _observability(F: np.ndarray, H: np.ndarray, steps: int) -> np.ndarray:
    rows, block = [], H
    for _ in range(steps):
        rows.append(block)
        block = block @ F
    return np.vstack(rows)


def _observable_part(c: LinearController) -> tuple[np.ndarray, float]:
    """Orthonormal basis ``V`` (``n x r``) of the complement of the unobservable subspace."""
    obs = _observability(c.F, c.H, c.n_state)
    _, sv, vt = np.linalg.svd(obs)
    scale = max(float(sv[0]) if sv.size else 0.0, 1e-300)
    rank = int((sv > scale * 1e-10 * max(c.n_state, 1)).sum())
    return vt[:rank].T, scale


def _deadbeat(F: np.ndarray, H: np.ndarray) -> tuple[np.ndarray, float]:
    """An output injection ``R`` with ``F - R H`` nilpotent, and ``||H F_R^n|| / ||H||``."""
    n, p = F.shape[0], H.shape[0]
    norm_h = max(float(np.linalg.norm(H, 2)), 1e-300)
    picker = np.random.default_rng(0)  # public and fixed: the choice of c, R0 is not secret
    combos = [np.eye(p)[i] for i in range(p)] + [picker.standard_normal(p) for _ in range(8)]
    injections = [np.zeros((n, p))] + [
        picker.standard_normal((n, p)) * (np.linalg.norm(F, 2) + 1) / norm_h for _ in range(4)
    ]
    best: tuple[float, np.ndarray] | None = None
    e_last = np.zeros(n)
    e_last[-1] = 1.0
    for R0 in injections:
        Fc = F - R0 @ H
        for c in combos:
            h = (c @ H).reshape(1, n)
            with np.errstate(all="ignore"):  # a poor candidate may overflow: it is skipped
                obs = _observability(Fc, h, n)
                if not np.isfinite(obs).all() or np.linalg.cond(obs) > 1e10:
                    continue
                k = np.linalg.matrix_power(Fc, n) @ np.linalg.solve(obs, e_last)
                R = R0 + np.outer(k, c)
                power = H @ np.linalg.matrix_power(F - R @ H, n)
            if not np.isfinite(power).all():
                continue
            residual = float(np.linalg.norm(power, 2)) / norm_h
            if best is None or residual < best[0]:
                best = (residual, R)
            if residual <= RESIDUAL_TOLERANCE * 1e-3:
                return R, residual
    if best is None:
        raise InvalidArgumentError(
            "sys",
            "cannot be converted: no output combination observes the controller well enough for a "
            "deadbeat output injection (observability matrices too ill-conditioned); "
            + _FLOAT_CODING,
        )
    return best[1], best[0]


def _check_reduction(
    c: LinearController, V: np.ndarray, F: np.ndarray, G: np.ndarray, H: np.ndarray
) -> None:
    """Dropping the (numerically) unobservable part must not change ``u``: compare the maps from
    ``x0`` and from ``y`` to ``u`` (``H F^k`` and ``H F^k G``) of both realisations, for ``k`` up to
    :data:`CHECK_HORIZON` or until both have decayed below the tolerance."""
    if V.shape[1] == c.n_state:
        return
    full, reduced = c.H.copy(), H @ V.T
    F_back = V @ F @ V.T
    worst, scale = 0.0, 1e-300
    for _ in range(CHECK_HORIZON):
        for a, b in ((full, reduced), (full @ c.G, reduced @ c.G)):
            worst = max(worst, float(np.abs(a - b).max()))
            scale = max(scale, float(np.abs(a).max()))
        if scale > 1e100:  # an unstable controller: the relative comparison is made by now
            break
        full, reduced = full @ c.F, reduced @ F_back
        if (
            max(float(np.abs(full).max()), float(np.abs(reduced).max()))
            < 1e-3 * worst + 1e-15 * scale
        ):
            break
    if worst > RESIDUAL_TOLERANCE * scale:
        raise InvalidArgumentError(
            "sys",
            f"cannot be converted accurately: its observability is numerically degenerate (the "
            f"observable part differs from it by {worst / scale:.1e} relative); " + _FLOAT_CODING,
        )


def history_form(c: LinearController) -> HistoryForm:
    """Convert to the input-output history form (module docstring): exact up to ``residual``.

    Examples
    --------
    >>> pi = linear_controller(([[1.0]], [[0.05]], [[1.0]], [[2.0]]))    # PI: Ki h = 0.05, Kp = 2
    >>> h = history_form(pi)
    >>> h.window, float(h.theta_u[0, 0, 0]), float(h.theta_y[0, 0, 0]), float(h.theta_y[1, 0, 0])
    (1, 1.0, 2.0, -1.95)
    """
    V, _ = _observable_part(c)
    r = V.shape[1]
    n_u, n_y = c.n_output, c.n_input
    if r == 0:  # a static gain u = J y
        return HistoryForm(
            c.J[None].copy(), np.zeros((0, n_u, n_u)), np.zeros((0, n_u, c.n_state)),
            np.zeros((0, n_u)), 0.0, c.n_state, 0,
        )  # fmt: skip
    F, G, H = V.T @ c.F @ V, V.T @ c.G, c.H @ V
    _check_reduction(c, V, F, G, H)
    R, residual = _deadbeat(F, H)
    if residual > RESIDUAL_TOLERANCE:
        raise InvalidArgumentError(
            "sys",
            f"cannot be converted accurately: the deadbeat form neglects ||H F_R^N|| / ||H|| = "
            f"{residual:.1e} > {RESIDUAL_TOLERANCE:g} (ill-conditioned controller); "
            + _FLOAT_CODING,
        )
    FR = F - R @ H
    GR = G - R @ c.J
    theta_y = np.empty((r + 1, n_u, n_y))
    theta_u = np.empty((r, n_u, n_u))
    initial = np.empty((r, n_u, c.n_state))
    theta_y[0] = c.J
    power = H.copy()  # H F_R^(i-1)
    for i in range(1, r + 1):
        initial[i - 1] = power @ V.T
        theta_y[i] = power @ GR
        theta_u[i - 1] = power @ R
        power = power @ FR
    return HistoryForm(theta_y, theta_u, initial, R, residual, c.n_state, r)
