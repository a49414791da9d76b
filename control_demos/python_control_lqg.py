"""An LQG controller designed with python-control, run plainly and immersed, side by side.

The plant is two masses joined by a spring and a damper (4 states), a force on the first mass,
both positions measured; it is discretised with ``control.c2d``. ``control.dlqr`` gives the state
feedback ``u = -K x_hat`` and ``control.dlqe`` the Kalman gain ``L``; the controller is the
``control.StateSpace``

    x_hat+ = (A - B K - L C) x_hat + L y,    u = -K x_hat

(4 states, 2 inputs, 1 output), handed to ``immerse_system`` as it is. The plain loop runs the
controller's matrices; the immersed loop encodes each measurement, lets the cloud advance the
encoded Kalman state, and decodes the force. Both loops see the same process and sensor noise.

    .venv/bin/python control_demos/python_control_lqg.py [--steps 400] [--json] [--plot DIR]

Needs the extra ``control`` (``pip install 'immersion-coding[control]'``); ``--plot`` needs
matplotlib (extra ``dev``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from immersion import immerse_system

try:
    import control
except ImportError:
    sys.exit("this demo needs python-control: pip install 'immersion-coding[control]'")

DT = 0.05
MASS_1, MASS_2, SPRING, COUPLING_DAMPING, FRICTION = 1.0, 0.5, 4.0, 0.2, 0.05
PROCESS_NOISE, SENSOR_NOISE = 1e-3, 1e-2  # standard deviations per step


def plant() -> Any:
    """The two-mass plant, states (p1, v1, p2, v2), discretised by zero-order hold."""
    k, c, b = SPRING, COUPLING_DAMPING, FRICTION
    A = np.array(
        [
            [0.0, 1.0, 0.0, 0.0],
            [-k / MASS_1, -(c + b) / MASS_1, k / MASS_1, c / MASS_1],
            [0.0, 0.0, 0.0, 1.0],
            [k / MASS_2, c / MASS_2, -k / MASS_2, -(c + b) / MASS_2],
        ]
    )
    B = np.array([[0.0], [1.0 / MASS_1], [0.0], [0.0]])
    C = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    return control.c2d(control.ss(A, B, C, 0), DT)


def lqg(plant_d: Any) -> Any:
    """The LQG controller as a discrete-time ``StateSpace`` from measurement y to force u."""
    K, _, _ = control.dlqr(plant_d, np.diag([10.0, 1.0, 10.0, 1.0]), 0.1 * np.eye(1))
    L, _, _ = control.dlqe(
        plant_d.A,
        np.eye(4),
        plant_d.C,
        PROCESS_NOISE**2 * np.eye(4),
        SENSOR_NOISE**2 * np.eye(2),
    )
    A, B, C = plant_d.A, plant_d.B, plant_d.C
    return control.ss(A - B @ K - L @ C, L, -K, np.zeros((1, 2)), dt=plant_d.dt)


def run(*, steps: int, seed: int, epsilon: float) -> dict[str, Any]:
    """Both closed loops from the same noise; the history and the figures printed by the demo."""
    plant_d = plant()
    ctrl = lqg(plant_d)
    imm = immerse_system(
        ctrl,
        extra_state=2,
        extra_input=2,
        extra_output=2,
        epsilon_input=epsilon,
        epsilon_output=epsilon,
    )  # keys from OS entropy; `seed` draws only the disturbances below
    A, B, C = plant_d.A, plant_d.B, plant_d.C
    Ac, Bc, Cc, Dc = ctrl.A, ctrl.B, ctrl.C, ctrl.D
    rng = np.random.default_rng(seed + 1)
    process = PROCESS_NOISE * rng.standard_normal((steps, 4))
    sensor = SENSOR_NOISE * rng.standard_normal((steps, 2))

    x_plain = x_imm = np.array([1.0, 0.0, -0.5, 0.0])
    xc_plain, xc_enc = np.zeros(4), imm.encode_state(np.zeros(4))
    xc_pc = np.zeros(4)
    times = np.zeros((steps, 3))  # per step: plain, immersed, python-control's own evaluation
    rows = []
    for k in range(steps):
        y_plain, y_imm = C @ x_plain + sensor[k], C @ x_imm + sensor[k]

        t0 = time.perf_counter()
        u_plain = Cc @ xc_plain + Dc @ y_plain  # the controller's own matrices, plain numpy
        xc_plain = Ac @ xc_plain + Bc @ y_plain
        t1 = time.perf_counter()
        y_enc = imm.encode_input(y_imm)  # user
        u_enc, xc_enc = imm.target.advance(xc_enc, y_enc)  # cloud: encoded data only
        u_imm = imm.decode_output(u_enc, y_enc)  # user
        t2 = time.perf_counter()
        ctrl.output(0, xc_pc, y_plain)  # python-control's own evaluation, for the time ratio
        xc_pc = ctrl.dynamics(0, xc_pc, y_plain)
        t3 = time.perf_counter()
        times[k] = (t1 - t0, t2 - t1, t3 - t2)

        rows.append(
            (
                k * DT,
                x_plain[0],
                x_plain[2],
                x_imm[0],
                x_imm[2],
                u_plain[0],
                u_imm[0],
                abs(u_plain[0] - u_imm[0]),
                float(np.abs(imm.decode_state(xc_enc) - xc_plain).max()),
                y_enc[0],
            )
        )
        x_plain = A @ x_plain + B @ u_plain + process[k]
        x_imm = A @ x_imm + B @ u_imm + process[k]
    history = np.array(rows)
    report = imm.report()
    # medians per step: robust to the scheduler's pauses on a shared machine
    t_plain, t_imm, t_pc = np.median(times, axis=0)
    return {
        "steps": steps,
        "plant_states": 4,
        "controller": {"n_state": imm.n_state, "n_input": imm.n_input, "n_output": imm.n_output},
        "closed_loop_spectral_radius": float(
            max(abs(np.linalg.eigvals(control.feedback(plant_d, ctrl, sign=1).A)))
        ),
        "max_abs_u": float(np.abs(history[:, 5]).max()),
        "max_abs_u_error": float(history[:, 7].max()),
        "max_abs_controller_state_error": float(history[:, 8].max()),
        "max_abs_plant_position_difference": float(
            np.abs(history[:, [1, 2]] - history[:, [3, 4]]).max()
        ),
        "final_positions_plain": [float(x_plain[0]), float(x_plain[2])],
        "final_positions_immersed": [float(x_imm[0]), float(x_imm[2])],
        "step_time_ratio": float(t_imm / t_plain),
        "step_time_ratio_vs_python_control": float(t_imm / t_pc),
        "plain_step_us": float(1e6 * t_plain),
        "immersed_step_us": float(1e6 * t_imm),
        "python_control_step_us": float(1e6 * t_pc),
        "epsilon_input": report.epsilon_input,
        "epsilon_output": report.epsilon_output,
        "decode_error_estimate": report.decode_error_estimate,
        "keys": repr(imm.keys),
        "history": history,
    }


def plot(history: np.ndarray, folder: Path) -> Path:
    """One PNG: both loops' positions, both forces, the decoding error and what the cloud sees."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = history[:, 0]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot(t, history[:, 1], label="p1, plain loop")
    ax[0].plot(t, history[:, 3], "--", label="p1, immersed loop")
    ax[0].plot(t, history[:, 2], label="p2, plain loop")
    ax[0].plot(t, history[:, 4], "--", label="p2, immersed loop")
    ax[0].set_ylabel("position")
    ax[0].legend(fontsize=8)
    ax[1].plot(t, history[:, 5], label="u, plain LQG")
    ax[1].plot(t, history[:, 6], "--", label="u decoded from the cloud")
    ax[1].set_ylabel("force")
    ax[1].legend(fontsize=8)
    ax[2].semilogy(t, np.maximum(history[:, 7], 1e-18), label="|u plain - u decoded|")
    ax[2].semilogy(t, np.maximum(history[:, 8], 1e-18), label="max |x_hat plain - x_hat decoded|")
    ax[2].semilogy(t, np.abs(history[:, 9]), lw=0.6, label="|y~[0]| (what the cloud sees)")
    ax[2].set_xlabel("t [s]")
    ax[2].legend(fontsize=8)
    fig.suptitle("python-control LQG (dlqr + dlqe): plain vs immerse_system")
    fig.tight_layout()
    path = folder / "python_control_lqg.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0, help="seed of the disturbances (not keys)")
    parser.add_argument("--epsilon", type=float, default=1e-3, help="per-element epsilon of y~, u~")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--plot", type=Path, default=None, help="folder for a PNG of both loops")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    result = run(steps=args.steps, seed=args.seed, epsilon=args.epsilon)
    history = result.pop("history")
    if args.plot is not None:
        result["plot"] = str(plot(history, args.plot))
    if args.json:
        print(json.dumps(result))
        return
    print(f"LQG from python-control (dlqr + dlqe), {args.steps} steps, plain vs immersed")
    print(f"  {result['keys']}")
    print(f"  closed-loop spectral radius {result['closed_loop_spectral_radius']:.4f}")
    print(
        f"  max |u_plain - u_immersed| = {result['max_abs_u_error']:.2e} "
        f"(max |u| = {result['max_abs_u']:.2f}); "
        f"max |x_hat plain - x_hat decoded| = {result['max_abs_controller_state_error']:.2e}"
    )
    print(
        f"  median per step: plain {result['plain_step_us']:.1f} us, immersed "
        f"{result['immersed_step_us']:.1f} us, ratio {result['step_time_ratio']:.1f}x "
        f"({result['step_time_ratio_vs_python_control']:.2f}x python-control's own "
        f"sys.output + sys.dynamics, {result['python_control_step_us']:.1f} us)"
    )
    print(
        f"  final positions plain {result['final_positions_plain']}, "
        f"immersed {result['final_positions_immersed']}"
    )
    if "plot" in result:
        print(f"  plot: {result['plot']}")


if __name__ == "__main__":
    main()
