"""PNG figures of a reactor run, matching seed 002's Figs. 8-12."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .simulation import ReactorRun


def write_plots(run: ReactorRun, folder: Path) -> list[Path]:
    """Write the five figures; return their paths (needs matplotlib, extra ``plot``)."""
    from immersion.plotting import pyplot

    plt = pyplot("the reactor demo's --plot")

    folder.mkdir(parents=True, exist_ok=True)
    t = run.t
    paths: list[Path] = []

    def save(fig: object, name: str) -> None:
        path = folder / name
        fig.tight_layout()  # type: ignore[attr-defined]
        fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
        plt.close(fig)  # type: ignore[arg-type]
        paths.append(path)

    fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax[0].plot(t, run.y_immersed, label="y = x1 (user side)")
    ax[0].set_ylabel("y")
    ax[0].legend()
    for i in range(run.y_encoded.shape[1]):
        ax[1].plot(t, run.y_encoded[:, i], lw=0.6, label=f"y~[{i}] (what the cloud sees)")
    ax[1].set_ylabel("encoded y~")
    ax[1].set_xlabel("t [s]")
    ax[1].legend(fontsize=8)
    fig.suptitle("Fig. 8: measurement and encoded measurement")
    save(fig, "fig08_measurement_encoded.png")

    fig, ax = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax[0].plot(t, run.u_plain, label="u, plain controller")
    ax[0].plot(t, run.u_decoded, "--", label="u decoded from the cloud")
    ax[0].legend()
    for i in range(run.u_encoded.shape[1]):
        ax[1].plot(t, run.u_encoded[:, i], lw=0.6, label=f"u~[{i}]")
    ax[1].set_xlabel("t [s]")
    ax[1].legend(fontsize=8)
    fig.suptitle("Fig. 9: control, decoded control and encoded control")
    save(fig, "fig09_control_decoded.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.semilogy(
        t, np.maximum(np.abs(run.u_plain - run.u_decoded), 1e-18), label="|u plain - u decoded|"
    )
    ax.semilogy(
        t, np.maximum(run.controller_state_error, 1e-18), label="max |x_c plain - x_c decoded|"
    )
    ax.semilogy(t, run.u_decode_bound, lw=0.8, label="per-decode bound of u (rigorous)")
    ax.semilogy(t, np.maximum(run.u_decode_error, 1e-18), lw=0.8, label="per-decode error of u")
    ax.axhline(run.report.decode_error_estimate, color="k", ls=":", label="probe-point estimate")
    ax.set_xlabel("t [s]")
    ax.legend()
    fig.suptitle("Fig. 10: decoding error")
    save(fig, "fig10_decoding_error.png")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    tx = np.arange(run.x_plain.shape[0]) * (t[1] - t[0] if t.size > 1 else 1.0)
    for i, name in enumerate(("x1", "x2")):
        ax.plot(tx, run.x_plain[:, i], label=f"{name} without coding")
        ax.plot(tx, run.x_immersed[:, i], "--", label=f"{name} with immersion coding")
    ax.set_xlabel("t [s]")
    ax.legend()
    fig.suptitle("Fig. 11: closed-loop reactor states")
    save(fig, "fig11_closed_loop_states.png")

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, np.cumsum(run.step_s_plain) * 1e3, label="plain controller")
    ax.plot(t, np.cumsum(run.step_s_immersed) * 1e3, label="encode + cloud + decode")
    ax.set_xlabel("t [s]")
    ax.set_ylabel("cumulative running time [ms]")
    ax.legend()
    fig.suptitle("Fig. 12: running time")
    save(fig, "fig12_running_time.png")
    return paths
