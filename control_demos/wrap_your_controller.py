"""Wrap your own controller with immerse(f, g): a nonlinear example using only the public API.

The plant is a damped pendulum; the controller is a nonlinear observer (a Luenberger-type
estimator with the pendulum's sin nonlinearity) plus a feedback-linearising control law.
Write the controller as ``x+ = f(x, y)``, ``u = g(x, y)``, call ``immerse``, and run the cloud
part on encoded data. The plain and the immersed loops run side by side from the same noise.

    .venv/bin/python control_demos/wrap_your_controller.py [--steps 600] [--plot out/]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from immersion import OptionalDependencyError, immerse
from immersion.plotting import pyplot

DT, G_OVER_L, DAMPING = 0.02, 9.81, 0.2
OBSERVER_GAIN = np.array([0.6, 2.5])
KP, KD = 6.0, 3.0


def plant(x: np.ndarray, u: float) -> np.ndarray:
    """Pendulum (angle, rate), explicit Euler."""
    return x + DT * np.array([x[1], -G_OVER_L * np.sin(x[0]) - DAMPING * x[1] + u])


def g(x_hat: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cancel gravity and damping, then PD to ``th = 0``.

    ``u = g sin(th) + c w - kp th - kd w``.
    """
    th, w = x_hat
    return np.array([G_OVER_L * np.sin(th) + DAMPING * w - KP * th - KD * w])


def f(x_hat: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Nonlinear observer: model prediction plus output injection ``L (y - th_hat)``."""
    return plant(x_hat, g(x_hat, y)[0]) + OBSERVER_GAIN * (y[0] - x_hat[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--plot", type=Path, default=None, help="folder for a PNG of the two loops")
    args = parser.parse_args()
    if args.plot:
        try:  # before the loop: a missing extra is said at once, not after the run
            plt = pyplot("wrap_your_controller.py --plot")
        except OptionalDependencyError as exc:
            parser.error(str(exc))

    imm = immerse(
        f,
        g,
        n_state=2,
        n_input=1,
        n_output=1,
        extra_state=2,
        extra_input=2,
        extra_output=2,
        epsilon_input=1e-3,
        epsilon_output=1e-3,
    )  # keys from OS entropy (rng=SEED would make them reproducible: tests only)
    print(imm.keys)
    print(
        f"per-element epsilon: input {imm.report().epsilon_input:.2e}, output "
        f"{imm.report().epsilon_output:.2e}; predicted decode error "
        f"{imm.report().decode_error_estimate:.1e}"
    )

    sensor = np.random.default_rng(0).normal(0, 1e-3, args.steps)
    x_plain = x_imm = np.array([1.2, 0.0])  # the pendulum starts at 1.2 rad
    xc_plain, xc_enc = np.zeros(2), imm.encode_state(np.zeros(2))
    worst_u, history = 0.0, []
    for k in range(args.steps):
        y_plain, y_imm = np.array([x_plain[0] + sensor[k]]), np.array([x_imm[0] + sensor[k]])
        u_plain = g(xc_plain, y_plain)
        xc_plain = f(xc_plain, y_plain)

        y_enc = imm.encode_input(y_imm)  # user: encode the measurement
        u_enc = imm.target.output(xc_enc, y_enc)  # cloud: works on encoded data only
        xc_enc = imm.target.step(xc_enc, y_enc)
        u_imm = imm.decode_output(u_enc, y_enc)  # user: decode the control

        worst_u = max(worst_u, abs(u_plain[0] - u_imm[0]))
        x_plain, x_imm = plant(x_plain, u_plain[0]), plant(x_imm, u_imm[0])
        history.append((x_plain[0], x_imm[0], u_plain[0], u_imm[0], y_enc[0]))
    print(
        f"{args.steps} steps: max |u_plain - u_decoded| = {worst_u:.2e}; final angle plain "
        f"{x_plain[0]:+.2e}, immersed {x_imm[0]:+.2e}"
    )
    if args.plot:
        h = np.array(history)
        args.plot.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        ax[0].plot(h[:, 0], label="angle, plain loop")
        ax[0].plot(h[:, 1], "--", label="angle, immersed loop")
        ax[0].legend()
        ax[1].plot(h[:, 4], label="what the cloud sees: y~[0]")
        ax[1].legend()
        ax[1].set_xlabel("step")
        fig.tight_layout()
        fig.savefig(args.plot / "wrap_your_controller.png", dpi=100)
        print(f"plot: {args.plot / 'wrap_your_controller.png'}")


if __name__ == "__main__":
    main()
