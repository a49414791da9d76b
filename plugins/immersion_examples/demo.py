"""The "wrap your controller" demo: plain and immersed closed loops side by side, one process."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from immersion import immerse

from .lqr_kalman import build


def run_controller_demo(
    *,
    steps: int = 400,
    epsilon_input: float = 1e-3,
    epsilon_output: float = 1e-3,
    seed: int = 0,
    plot_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the LQR + Kalman loop plainly and through ``immerse`` with identical plant noise.

    Parameters
    ----------
    steps : int
        Control steps.
    epsilon_input, epsilon_output : float
        Per-element epsilon of the encoded measurement and of the encoded input.
    seed : int
        Seed of the keys and the encoding noise; the plant noise uses ``seed + 1``.
    plot_dir : Path, optional
        Folder to write ``controller_demo.png`` into (needs matplotlib).

    Returns
    -------
    dict
        The figures printed by ``immersion demo controller --json``: decoding errors, the
        report's epsilons and bound, the time ratio immersed / plain and the keys' ``repr``.

    Examples
    --------
    >>> result = run_controller_demo(steps=50)
    >>> result["max_abs_u_error"] < 1e-6
    True
    """
    ctrl = build()
    imm = immerse(
        ctrl.f,
        ctrl.g,
        n_state=ctrl.n_state,
        n_input=1,
        n_output=1,
        extra_state=2,
        extra_input=2,
        extra_output=2,
        epsilon_input=epsilon_input,
        epsilon_output=epsilon_output,
        rng=seed,
    )
    plant_rng = [np.random.default_rng(seed + 1), np.random.default_rng(seed + 1)]
    x_plain = x_imm = ctrl.plant_initial_state.copy()
    xc_plain, xc_enc = ctrl.initial_state, imm.encode_state(ctrl.initial_state)
    rows: list[tuple[float, ...]] = []
    t_plain = t_imm = 0.0
    for k in range(steps):
        y_p = ctrl.measure(x_plain, plant_rng[0], 1e-2)
        y_i = ctrl.measure(x_imm, plant_rng[1], 1e-2)
        t0 = time.perf_counter()
        u_p = ctrl.g(xc_plain, y_p)
        xc_plain = ctrl.f(xc_plain, y_p)
        t1 = time.perf_counter()
        y_enc = imm.encode_input(y_i)  # user
        u_enc = imm.target.output(xc_enc, y_enc)  # cloud
        xc_enc = imm.target.step(xc_enc, y_enc)  # cloud
        u_i = imm.decode_output(u_enc, y_enc)  # user
        t2 = time.perf_counter()
        t_plain += t1 - t0
        t_imm += t2 - t1
        rows.append(
            (
                k,
                y_i[0],
                y_enc[0],
                u_p[0],
                u_i[0],
                abs(u_p[0] - u_i[0]),
                float(np.abs(imm.decode_state(xc_enc) - xc_plain).max()),
                x_plain[0],
                x_imm[0],
            )
        )
        x_plain = ctrl.plant_step(x_plain, u_p, plant_rng[0], 1e-3)
        x_imm = ctrl.plant_step(x_imm, u_i, plant_rng[1], 1e-3)
    data = np.array(rows)
    report = imm.report()
    result = {
        "steps": steps,
        "max_abs_u": float(np.abs(data[:, 3]).max()),
        "max_abs_u_error": float(data[:, 5].max()),
        "max_abs_state_error": float(data[:, 6].max()),
        "max_abs_plant_state_difference": float(np.abs(data[:, 7] - data[:, 8]).max()),
        "final_plant_position_plain": float(x_plain[0]),
        "final_plant_position_immersed": float(x_imm[0]),
        "epsilon_input": report.epsilon_input,
        "epsilon_output": report.epsilon_output,
        "epsilon_input_proven": report.epsilon_input_proven,
        "epsilon_note": report.epsilon_note(),
        "decode_error_estimate": report.decode_error_estimate,
        "step_time_ratio": t_imm / t_plain,
        "keys": repr(imm.keys),
    }
    if plot_dir is not None:
        result["plots"] = [str(p) for p in _plot(data, plot_dir)]
    return result


def _plot(data: np.ndarray, folder: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots need matplotlib: pip install 'immersion-coding[dev]'", file=sys.stderr)
        return []
    folder.mkdir(parents=True, exist_ok=True)
    k = data[:, 0]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(k, data[:, 1], label="measurement y")
    axes[0].plot(k, data[:, 2], label="encoded y~[0] (what the cloud sees)", alpha=0.6)
    axes[0].set_yscale("symlog")
    axes[0].legend()
    axes[1].plot(k, data[:, 3], label="u plain")
    axes[1].plot(k, data[:, 4], "--", label="u decoded")
    axes[1].legend()
    axes[2].semilogy(k, np.maximum(data[:, 5], 1e-18), label="|u plain - u decoded|")
    axes[2].semilogy(k, np.maximum(data[:, 6], 1e-18), label="max |x plain - x decoded|")
    axes[2].legend()
    axes[2].set_xlabel("step")
    fig.suptitle("LQR + Kalman filter run through immerse(f, g)")
    fig.tight_layout()
    path = folder / "controller_demo.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def print_summary(result: dict[str, Any], *, as_json: bool) -> None:
    """Print the demo result as one JSON object or as a short table."""
    if as_json:
        print(json.dumps(result))
        return
    print(f"LQR + Kalman filter, {result['steps']} steps, plain vs immersed (one process)")
    for key in (
        "max_abs_u",
        "max_abs_u_error",
        "max_abs_state_error",
        "max_abs_plant_state_difference",
        "epsilon_input",
        "epsilon_output",
        "epsilon_input_proven",
        "decode_error_estimate",
        "step_time_ratio",
    ):
        print(f"  {key:32s} {result[key]:.3e}")
    if result["epsilon_note"]:
        print(f"  epsilon_note: {result['epsilon_note']}")
    print(f"  keys: {result['keys']}")
    for p in result.get("plots", []):
        print(f"  plot: {p}")
