"""The two-stage chemical reactor with delayed recycle and its adaptive output-feedback controller.

Seed 002 section VI-B, eqs. 47-50 (../shared/notes/seed002.md section 7). The paper writes the
equations with ``k+1`` notation, but they are continuous-time dynamics (simulated in Simulink;
read literally as recursions they overflow within 5 steps). Here:

* the **plant** is integrated as an ODE (forward Euler with ``substeps`` sub-steps per control
  sample, zero-order hold on ``u``); the delayed measurement ``x1(t - d(t))`` is read from the
  stored trajectory by linear interpolation, with the constant initial history
  ``x1(s) = x1(0)`` for ``s < 0``;
* the **controller** is sampled with period ``h``: ``x_c+ = x_c + h F_c(x_c, y)``,
  ``u = g_c(x_c, y)``. That sampled controller is the algorithm that is immersed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ReactorParameters:
    """Plant parameters of eqs. 47-48 (the paper's values are the defaults).

    Parameters
    ----------
    theta1, theta2, k1, k2 : float
        ``x1``'s coefficients ``-(1/theta_i + k_i)`` in eq. 47 (the paper's symbols).
    R1, R2, V1, V2, F2 : float
        The coefficients ``(1 - R2)/V1`` of ``x2``, ``R1/V2`` of the delayed ``x1`` and
        ``F2/V2`` of ``u`` in eq. 47.
    vartheta1, vartheta2, vartheta3 : float
        Coefficients of the uncertain terms ``delta1``, ``delta2`` (eq. 48).
    initial_state : tuple of float
        ``(x1(0), x2(0))``; ``x1(s) = x1(0)`` for ``s < 0`` too (the delayed history).

    Examples
    --------
    >>> ReactorParameters().delay(0.0)
    1.5
    """

    theta1: float = 2.0
    theta2: float = 2.0
    k1: float = 0.3
    k2: float = 0.3
    R1: float = 0.5
    R2: float = 0.5
    V1: float = 0.5
    V2: float = 0.5
    F2: float = 0.5
    vartheta1: float = 1.0
    vartheta2: float = 1.0
    vartheta3: float = -1.0
    initial_state: tuple[float, float] = (-0.5, 2.0)

    def delay(self, t: float) -> float:
        """``d(t) = 0.5 (3 + sin t)``: between 1 and 2 seconds.

        Parameters
        ----------
        t : float
            Time in seconds.
        """
        return 0.5 * (3.0 + math.sin(t))

    def rhs(self, t: float, x: np.ndarray, x1_delayed: float, u: float) -> np.ndarray:
        """Right-hand side of eqs. 47-48 read as ODEs.

        Parameters
        ----------
        t : float
            Time in seconds.
        x : np.ndarray
            Plant state ``(x1, x2)``.
        x1_delayed : float
            ``x1(t - d(t))``.
        u : float
            Control input.

        Returns
        -------
        np.ndarray
            ``dx/dt``, shape ``(2,)``.
        """
        x1, x2 = x
        delta1 = self.vartheta1 * math.sin(t) * x1_delayed**2
        delta2 = self.vartheta2 * math.sin(t) * x1_delayed**3 + self.vartheta3 * x2
        return np.array(
            [
                -(1.0 / self.theta1 + self.k1) * x1 + (1.0 - self.R2) / self.V1 * x2 + delta1,
                -(1.0 / self.theta2 + self.k2) * x1
                + self.R1 / self.V2 * x1_delayed
                + self.F2 / self.V2 * u
                + delta2,
            ]
        )


def _rho_zeta_delta(x_c: np.ndarray, y: float) -> tuple[float, float, float, float]:
    """The controller's ``rho_k``, ``zeta_k``, ``Delta_k`` (eq. 50) and ``v = z + r y + l rho y``.

    ``ell`` is the paper's ``l``.
    """
    z, r, ell = float(x_c[0]), float(x_c[1]), float(x_c[2])
    y2 = y * y
    rho = (0.1 + y2) ** 2 + 1.01
    v = z + r * y + ell * rho * y
    zeta = v / math.sqrt(r)
    p = 1.02 + 0.2 * y2 + y2 * y2
    delta = (
        2.0
        * (2.0 * ell * ell + ell**4 * p)
        * (1.0404 + 1.224 * y2 + 10.56 * y2**2 + 6.0 * y2**3 + 25.0 * y2**4)
        + 4.0 * y2 * y2 * p**4
    )
    return rho, zeta, delta, v


@dataclass(frozen=True)
class ReactorController:
    """The sampled adaptive controller of eqs. 49-50 as ``x_c+ = f(x_c, y)``, ``u = g(x_c, y)``.

    Parameters
    ----------
    dt : float
        Sampling period in seconds.
    initial_state : np.ndarray
        ``x_c(0) = (z_hat, r, l)``, by default ``(0, 1, 1)``.
    n_state, n_input, n_output : int
        Dimensions of ``x_c``, ``y`` and ``u`` (3, 1, 1): what ``immerse`` needs.

    Examples
    --------
    >>> ctrl = ReactorController(dt=0.01)
    >>> x_c, y = ctrl.initial_state, np.array([-0.5])
    >>> ctrl.g(x_c, y).shape, ctrl.f(x_c, y).shape
    ((1,), (3,))
    """

    dt: float = 0.01
    initial_state: np.ndarray = field(default_factory=lambda: np.array([0.0, 1.0, 1.0]))
    n_state: int = 3
    n_input: int = 1
    n_output: int = 1

    def rates(self, x_c: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``F_c(x_c, y)``: the controller's continuous-time right-hand side (eq. 49).

        Parameters
        ----------
        x_c, y : np.ndarray
            Controller state ``(z_hat, r, l)`` and measurement ``x1``, shape ``(1,)``.
        """
        yv = float(y[0])
        z, r = float(x_c[0]), float(x_c[1])
        rho, zeta, delta, v = _rho_zeta_delta(x_c, yv)
        gain = max(r * delta - r * r, rho * yv * yv + zeta * zeta)
        return np.array([-r * v - r * z - r * r * yv - gain * yv, gain, rho * yv * yv])

    def f(self, x_c: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Sampled update ``x_c + dt F_c(x_c, y)``.

        Parameters
        ----------
        x_c, y : np.ndarray
            Controller state ``(z_hat, r, l)`` and measurement ``x1``, shape ``(1,)``.
        """
        return x_c + self.dt * self.rates(x_c, y)

    def g(self, x_c: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Control ``u = -r (z_hat + r y + l rho y)`` (eq. 49).

        Parameters
        ----------
        x_c, y : np.ndarray
            Controller state ``(z_hat, r, l)`` and measurement ``x1``, shape ``(1,)``.
        """
        _, _, _, v = _rho_zeta_delta(x_c, float(y[0]))
        return np.array([-float(x_c[1]) * v])
