"""Example plants and controllers for the LWE coding: LQG loops of several sizes and a PI loop.

Used by the tests, ``immersion bench control`` and ``control_demos/encrypted_lqg.py``; all
deterministic (a seed), all numpy/scipy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from ..validation import positive_int


@dataclass(frozen=True)
class ControlLoop:
    """A discrete plant ``x+ = A x + B u + w``, ``y = C x + v`` and its controller ``(F, G, H, J)``.

    Built once per argument set and shared (do not modify its arrays).

    ``disturbance(k)`` gives ``(w_k, v_k)``; ``input_range``/``output_range`` bound ``|y|`` and
    ``|u|`` along the closed loop (measured on the float loop over 100,000 samples, doubled).
    """

    name: str
    plant: tuple[np.ndarray, np.ndarray, np.ndarray]
    controller: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    x0: np.ndarray
    input_range: float
    output_range: float
    seed: int

    def disturbance(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Process and measurement disturbances ``(w, v)`` for ``steps`` samples (seeded)."""
        A, B, C = self.plant
        rng = np.random.default_rng(self.seed)
        k = np.arange(steps)[:, None]
        w = 0.02 * rng.standard_normal((steps, A.shape[0])) + 0.05 * np.sin(2 * np.pi * k / 400)
        v = 0.01 * rng.standard_normal((steps, C.shape[0]))
        return w, v


def _c2d(Ac: np.ndarray, Bc: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    n, m = Bc.shape
    block = np.zeros((n + m, n + m))
    block[:n, :n], block[:n, n:] = Ac, Bc
    e = scipy.linalg.expm(block * h)
    return e[:n, :n], e[:n, n:]


@functools.lru_cache(maxsize=16)
def lqg_loop(
    n_state: int = 2, *, n_input: int = 1, n_output: int = 1, seed: int = 0
) -> ControlLoop:
    """An unstable plant of ``n_state`` states sampled at 20 Hz, and its LQG controller.

    The controller is the predictor-form Kalman filter with LQR feedback (Q = I, R = I; process
    and measurement covariances 0.01 I and 0.001 I): ``x^+ = (A - B K - L C) x^ + L y``,
    ``u = -K x^``: ``n_state`` states, ``n_output`` measurements in, ``n_input`` controls out.

    Examples
    --------
    >>> loop = lqg_loop(2)
    >>> [m.shape for m in loop.controller]
    [(2, 2), (2, 1), (1, 2), (1, 1)]
    """
    n = positive_int("n_state", n_state)
    rng = np.random.default_rng(seed)
    Ac = rng.standard_normal((n, n))
    Ac += np.diag(np.linspace(0.5, -1.0, n)) - np.diag(
        np.linalg.eigvals(Ac).real.mean() * np.ones(n)
    )
    Bc = rng.standard_normal((n, n_input))
    C = rng.standard_normal((n_output, n))
    A, B = _c2d(Ac, Bc, 0.05)
    P = scipy.linalg.solve_discrete_are(A, B, np.eye(n), np.eye(n_input))
    K = np.linalg.solve(B.T @ P @ B + np.eye(n_input), B.T @ P @ A)
    S = scipy.linalg.solve_discrete_are(A.T, C.T, 0.01 * np.eye(n), 0.001 * np.eye(n_output))
    L = A @ S @ C.T @ np.linalg.inv(C @ S @ C.T + 0.001 * np.eye(n_output))
    controller = (A - B @ K - L @ C, L, -K, np.zeros((n_input, n_output)))
    loop = ControlLoop(f"lqg-{n}", (A, B, C), controller, 0.5 * np.ones(n), 1.0, 1.0, seed)
    y_max, u_max = _ranges(loop, 100_000)
    return ControlLoop(loop.name, loop.plant, controller, loop.x0, 2 * y_max, 2 * u_max, seed)


@functools.lru_cache(maxsize=4)
def pi_loop(*, seed: int = 0) -> ControlLoop:
    """A first-order lag ``x+ = 0.95 x + 0.1 u`` under a PI controller (``Kp = 2``, ``Ki h = 0.2``).

    The controller ``x+ = x + 0.2 e``, ``u = x + 2 e`` with ``e = -y`` (regulation to 0) has a
    plain integrator: its state matrix is 1, the case the history form covers with ``R = 1``.
    """
    plant = (np.array([[0.95]]), np.array([[0.1]]), np.array([[1.0]]))
    controller = (np.array([[1.0]]), np.array([[-0.2]]), np.array([[1.0]]), np.array([[-2.0]]))
    loop = ControlLoop("pi", plant, controller, np.array([1.0]), 1.0, 1.0, seed)
    y_max, u_max = _ranges(loop, 100_000)
    return ControlLoop(loop.name, plant, controller, loop.x0, 2 * y_max, 2 * u_max, seed)


@functools.lru_cache(maxsize=1)
def four_tank_loop(*, seed: int = 0) -> ControlLoop:
    """CDSL's benchmark: the discretised four-tank plant and its 4-state, 2-input, 2-output
    observer-based controller, as in CDSL ``ctrRGSW/packing/main.go`` (public repository
    CDSL-EncryptedControl/CDSL).

    CDSL writes the controller with ``u`` fed back, ``x+ = F x + G y + R u``, ``u = H x``
    (``F`` an integer matrix); as a controller from ``y`` to ``u`` that is
    ``(F + R H, G, H, 0)``. It starts at rest here (CDSL starts it at ``[-1, 0, -1, 0]``).
    """
    A = np.array(
        [[0.9984, 0, 0.0042, 0], [0, 0.9989, 0, -0.0033], [0, 0, 0.9958, 0], [0, 0, 0, 0.9967]]
    )
    B = np.array([[0.0083, 0], [0, 0.0063], [0, 0.0048], [0.0031, 0]])
    C = np.array([[0.5, 0, 0, 0], [0, 0.5, 0, 0]])
    F = np.array([[-1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 1]])
    G = np.array([[0.7160, -0.3828], [-0.8131, -1.4790], [0.6646, 1.1860], [0.0181, -0.0060]])
    R = np.array([[-1.7396, 0.3476], [0.2588, 1.3226], [0.5115, 2.4668], [0.0122, 0.0030]])
    H = np.array([[-0.8829, 0.0445, -0.0533, -0.0855], [0.1791, 0.2180, -0.2738, 0.0180]])
    controller = (F + R @ H, G, H, np.zeros((2, 2)))
    loop = ControlLoop("four-tank", (A, B, C), controller, np.ones(4), 1.0, 1.0, seed)
    y_max, u_max = _ranges(loop, 20_000)
    return ControlLoop(loop.name, loop.plant, controller, loop.x0, 2 * y_max, 2 * u_max, seed)


def controller_of_order(n_state: int, *, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A stable SISO controller of ``n_state`` states (spectral radius 0.6, Gaussian gains): the
    order sweep of the benchmarks (the plant's work must not depend on ``n_state``).

    Examples
    --------
    >>> [m.shape for m in controller_of_order(3)]
    [(3, 3), (3, 1), (1, 3), (1, 1)]
    """
    n = positive_int("n_state", n_state)
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((n, n))
    F *= 0.6 / max(abs(np.linalg.eigvals(F)))
    return F, rng.standard_normal((n, 1)), rng.standard_normal((1, n)), rng.standard_normal((1, 1))


def _ranges(loop: ControlLoop, steps: int) -> tuple[float, float]:
    ys, us = simulate_float(loop, steps)
    return float(np.abs(ys).max()), float(np.abs(us).max())


def simulate_float(loop: ControlLoop, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The closed loop with the float controller: measurements ``y_k`` and controls ``u_k``."""
    A, B, C = loop.plant
    F, G, H, J = loop.controller
    w, v = loop.disturbance(steps)
    x, xc = loop.x0.copy(), np.zeros(F.shape[0])
    ys, us = np.empty((steps, C.shape[0])), np.empty((steps, B.shape[1]))
    for k in range(steps):
        y = C @ x + v[k]
        u = H @ xc + J @ y
        xc = F @ xc + G @ y
        x = A @ x + B @ u + w[k]
        ys[k], us[k] = y, u
    return ys, us
