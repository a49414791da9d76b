"""An LQR controller with a Kalman filter, written as ``x+ = f(x, y)``, ``u = g(x, y)``.

The plant is a discretised mass-spring-damper (position measured, force applied). The
controller state is the filter's estimate; ``f`` is the predict-correct update and ``g`` the
LQR law. It is linear, which makes it a good first "wrap your controller" example.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import expm, solve_discrete_are


@dataclass(frozen=True)
class LqrKalman:
    """Plant matrices ``(A, B, C)``, LQR gain ``K`` and steady-state Kalman gain ``L``.

    Parameters
    ----------
    A, B, C : np.ndarray
        The discretised plant ``x+ = A x + B u``, ``y = C x``.
    K : np.ndarray
        LQR gain, ``u = -K x_hat``.
    L : np.ndarray
        Steady-state Kalman gain.
    plant_initial_state : np.ndarray
        The true plant's initial state (position, velocity).
    n_state, n_input, n_output : int
        Dimensions of the controller state, the measurement and the input: what ``immerse``
        needs.

    Examples
    --------
    >>> ctrl = build(dt=0.05)
    >>> y = np.array([0.1])
    >>> ctrl.f(ctrl.initial_state, y).shape, ctrl.g(ctrl.initial_state, y).shape
    ((2,), (1,))
    """

    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    K: np.ndarray
    L: np.ndarray
    plant_initial_state: np.ndarray
    n_state: int = 2
    n_input: int = 1
    n_output: int = 1

    @property
    def initial_state(self) -> np.ndarray:
        """The controller starts with a zero estimate."""
        return np.zeros(self.n_state)

    def g(self, x_hat: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Control law ``u = -K x_hat`` (the measurement enters through the filter).

        Parameters
        ----------
        x_hat : np.ndarray
            The filter's estimate (the controller state).
        y : np.ndarray
            The measurement (unused by the law itself; part of the ``g(x, y)`` signature).
        """
        return -self.K @ x_hat

    def f(self, x_hat: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Kalman predict-correct: ``x_hat+ = A x_hat + B u + L (y - C x_hat)``.

        Parameters
        ----------
        x_hat : np.ndarray
            The filter's estimate (the controller state).
        y : np.ndarray
            The position measurement.
        """
        return self.A @ x_hat + self.B @ self.g(x_hat, y) + self.L @ (y - self.C @ x_hat)

    def plant_step(
        self, x: np.ndarray, u: np.ndarray, rng: np.random.Generator, noise: float
    ) -> np.ndarray:
        """One step of the true plant with process noise.

        Parameters
        ----------
        x : np.ndarray
            Plant state.
        u : np.ndarray
            Input.
        rng : np.random.Generator
            Source of the process noise.
        noise : float
            Standard deviation of the process noise.
        """
        return self.A @ x + self.B @ u + noise * rng.standard_normal(self.n_state)

    def measure(self, x: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
        """The position measurement with sensor noise.

        Parameters
        ----------
        x : np.ndarray
            Plant state.
        rng : np.random.Generator
            Source of the sensor noise.
        noise : float
            Standard deviation of the sensor noise.
        """
        return self.C @ x + noise * rng.standard_normal(1)


def build(
    *,
    dt: float = 0.05,
    mass: float = 1.0,
    stiffness: float = 2.0,
    damping: float = 0.1,
    q_weight: float = 10.0,
    r_weight: float = 0.1,
    process_noise: float = 1e-3,
    sensor_noise: float = 1e-2,
) -> LqrKalman:
    """Discretise the plant (zero-order hold) and solve the two Riccati equations.

    Parameters
    ----------
    dt : float
        Sampling period in seconds.
    mass, stiffness, damping : float
        The mass-spring-damper.
    q_weight, r_weight : float
        LQR weights on the state (``q_weight I``) and on the input (``r_weight I``).
    process_noise, sensor_noise : float
        Process and sensor noise covariances (times ``I``) the Kalman gain is designed for.

    Returns
    -------
    LqrKalman
        The controller, with the plant starting at position 1, velocity 0.

    Examples
    --------
    >>> build().K.shape
    (1, 2)
    """
    a_c = np.array([[0.0, 1.0], [-stiffness / mass, -damping / mass]])
    b_c = np.array([[0.0], [1.0 / mass]])
    m = expm(np.block([[a_c, b_c], [np.zeros((1, 3))]]) * dt)
    a, b, c = m[:2, :2], m[:2, 2:], np.array([[1.0, 0.0]])
    p = solve_discrete_are(a, b, q_weight * np.eye(2), r_weight * np.eye(1))
    k = np.linalg.solve(r_weight * np.eye(1) + b.T @ p @ b, b.T @ p @ a)
    s = solve_discrete_are(a.T, c.T, process_noise * np.eye(2), sensor_noise * np.eye(1))
    gain = a @ s @ c.T @ np.linalg.inv(c @ s @ c.T + sensor_noise * np.eye(1))
    return LqrKalman(a, b, c, k, gain, plant_initial_state=np.array([1.0, 0.0]))
