"""An LQG controller that runs in the cloud on RLWE ciphertexts, gains encrypted.

The plant is an unstable 2-state system sampled at 20 Hz; its LQG controller (Kalman predictor
plus LQR gain) is encrypted with ``immersion.lwe.encrypt_controller`` at 128-bit parameters from
the Homomorphic Encryption Security Standard. Three closed loops run side by side from the same
disturbances: the plain float controller, the encrypted one (the cloud holds the encrypted
coefficients and does every product; the plant encrypts, decrypts and checks), and the
fixed-point twin (same integers, no encryption).

    .venv/bin/python control_demos/encrypted_lqg.py [--steps 2000] [--precision 1e-4]
        [--n-state 2] [--plot out/] [--json]

``--precision`` is the proven one-step error of ``u`` relative to its range: it picks the ring
(N = 4096 for 1e-4, N = 8192 for finer) or is refused naming what can be reached.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from immersion.lwe import encrypt_controller
from immersion.lwe.examples import lqg_loop


def run(steps: int, precision: float, n_state: int) -> tuple[dict, dict[str, np.ndarray]]:
    loop = lqg_loop(n_state)  # plant (A, B, C), controller (F, G, H, J), signal ranges
    A, B, C = loop.plant
    F, G, H, J = loop.controller
    imm = encrypt_controller(
        loop.controller,
        input_range=loop.input_range,  # |y| and |u| bounds: they prove nothing can wrap
        output_range=loop.output_range,
        precision=precision,
        secure=True,  # the key comes from OS entropy
    )
    twin = imm.fixed_point_twin()
    w, v = loop.disturbance(steps)

    x_plain = x_enc = x_twin = loop.x0.copy()
    xc = np.zeros(F.shape[0])  # the plain controller's state
    xt = imm.encode_state()  # the cloud's state: an (empty) encrypted history
    imm.precompute(steps)  # the plant's offline part: encryptions of zero, ahead
    trace = {k: np.empty(steps) for k in ("y_plain", "y_enc", "u_plain", "u_enc", "u_twin", "word")}
    plant_s = cloud_s = plain_s = 0.0
    for k in range(steps):
        y = C @ x_plain + v[k]
        t0 = time.perf_counter()
        u_plain = H @ xc + J @ y
        xc = F @ xc + G @ y
        plain_s += time.perf_counter() - t0

        y_enc = C @ x_enc + v[k]
        t0 = time.perf_counter()
        yt = imm.encode_input(y_enc)  # user: y and the last applied u, encrypted
        t1 = time.perf_counter()
        ut = imm.target.output(xt, yt)  # cloud: encrypted coefficients times ciphertexts
        xt = imm.target.step(xt, yt)  # cloud: shift the encrypted history
        t2 = time.perf_counter()
        u_enc = imm.decode_output(ut, yt)  # user: decrypt, check the tag, round
        plant_s += (t1 - t0) + (time.perf_counter() - t2)
        cloud_s += t2 - t1

        u_twin = twin.output(C @ x_twin + v[k])
        x_plain = A @ x_plain + B @ u_plain + w[k]
        x_enc = A @ x_enc + B @ u_enc + w[k]
        x_twin = A @ x_twin + B @ u_twin + w[k]
        word = ut[2 * imm.design.rows] / imm.design.primes[0]  # a residue of c1
        row = (y[0], y_enc[0], u_plain[0], u_enc[0], u_twin[0], word)
        for name, value in zip(trace, row, strict=True):
            trace[name][k] = value

    d = imm.design
    scale = float(np.abs(trace["u_plain"]).max())
    summary = {
        "steps": steps,
        "n_state": n_state,
        "degree": d.degree,
        "modulus_bits": round(float(np.log2(float(d.modulus))), 1),
        "security_bits": d.security_bits,
        "window": d.window,
        "precision_proven": d.precision,
        "noise_margin_bits": round(d.noise_margin_bits, 2),
        "max_abs_u_plain": scale,
        "max_rel_u_error": float(np.abs(trace["u_enc"] - trace["u_plain"]).max()) / scale,
        "bit_identical_to_twin": bool(np.array_equal(trace["u_enc"], trace["u_twin"])),
        "plain_us_per_sample": 1e6 * plain_s / steps,
        "plant_online_us_per_sample": 1e6 * plant_s / steps,
        "cloud_us_per_sample": 1e6 * cloud_s / steps,
        "bytes_up": d.bytes_up,
        "bytes_down": d.bytes_down,
    }
    return summary, trace


def plot(trace: dict[str, np.ndarray], folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    t = np.arange(trace["u_plain"].size) * 0.05
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot(t, trace["y_plain"], lw=3, color="0.7", label="plain")
    ax[0].plot(t, trace["y_enc"], lw=1, color="C0", label="encrypted controller")
    ax[0].set_ylabel("measurement y")
    ax[0].legend(loc="upper right")
    scale = np.abs(trace["u_plain"]).max()
    rel = np.maximum(np.abs(trace["u_enc"] - trace["u_plain"]) / scale, 1e-17)
    ax[1].semilogy(t, rel, lw=0.8, label="encrypted (= fixed-point twin, bit for bit)")
    ax[1].set_ylabel("|u_enc - u_plain| / max|u|")
    ax[1].legend(loc="lower right")
    ax[2].plot(t, trace["word"], ".", ms=1)
    ax[2].set_ylabel("reply residue / q\n(what the cloud sends)")
    ax[2].set_xlabel("time [s]")
    fig.tight_layout()
    path = folder / "encrypted_lqg.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--precision", type=float, default=1e-4, help="one-step error of u")
    parser.add_argument("--n-state", type=int, default=2, help="plant and controller states")
    parser.add_argument("--plot", type=Path, default=None, help="folder for encrypted_lqg.png")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    summary, trace = run(args.steps, args.precision, args.n_state)
    if args.plot:
        summary["figure"] = str(plot(trace, args.plot))
    if args.json:
        print(json.dumps(summary))
        return
    for key, value in summary.items():
        print(f"{key:24s} {value}")


if __name__ == "__main__":
    main()
