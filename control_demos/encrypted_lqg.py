"""An LQG controller that runs in the cloud on LWE ciphertexts: the cloud learns nothing.

The plant is an unstable 2-state system sampled at 20 Hz; its LQG controller (Kalman predictor
plus LQR gain) is LWE-encrypted with ``immersion.lwe.encrypt_controller`` at 128-bit parameters
from the Homomorphic Encryption Security Standard. Three closed loops run side by side from the
same disturbances: the plain float controller, the encrypted one (the cloud holds only an
integer matrix and ciphertexts), and the fixed-point twin (same integers, no encryption).

    .venv/bin/python control_demos/encrypted_lqg.py [--steps 2000] [--modulus-bits 64]
        [--n-state 2] [--plot out/] [--json]

The default ``q = 2^64`` (the fastest) keeps the encrypted loop within 1e-6 of the float one;
``--modulus-bits 104`` (still n = 4096 at 128 bits) brings it closer still, to about float64's
own rounding (``benchmarks/lwe_precision.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from immersion.lwe import encrypt_controller
from immersion.lwe.examples import lqg_loop


def run(steps: int, modulus_bits: int, n_state: int) -> tuple[dict, dict[str, np.ndarray]]:
    loop = lqg_loop(n_state)  # plant (A, B, C), controller (F, G, H, J), signal ranges
    A, B, C = loop.plant
    F, G, H, J = loop.controller
    imm = encrypt_controller(
        loop.controller,
        input_range=loop.input_range,  # |y| and |u| bounds: they prove nothing can wrap
        output_range=loop.output_range,
        modulus_bits=modulus_bits,
        secure=True,  # the key comes from OS entropy
    )
    twin = imm.fixed_point_twin()
    w, v = loop.disturbance(steps)

    x_plain = x_enc = x_twin = loop.x0.copy()
    xc = np.zeros(F.shape[0])  # the plain controller's state
    xt = imm.encode_state()  # the cloud's state: an (empty) encrypted history
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
        ut = imm.target.output(xt, yt)  # cloud: integer matrix times ciphertext words
        xt = imm.target.step(xt, yt)  # cloud: shift the encrypted history
        t2 = time.perf_counter()
        u_enc = imm.decode_output(ut, yt)  # user: decrypt (subtract the pad, noise included)
        plant_s += (t1 - t0) + (time.perf_counter() - t2)
        cloud_s += t2 - t1

        u_twin = twin.output(C @ x_twin + v[k])
        x_plain = A @ x_plain + B @ u_plain + w[k]
        x_enc = A @ x_enc + B @ u_enc + w[k]
        x_twin = A @ x_twin + B @ u_twin + w[k]
        row = (y[0], y_enc[0], u_plain[0], u_enc[0], u_twin[0], ut[3])
        for name, value in zip(trace, row, strict=True):
            trace[name][k] = value

    r = imm.report()
    scale = float(np.abs(trace["u_plain"]).max())
    summary = {
        "steps": steps,
        "n_state": n_state,
        "dimension": r.parameters.dimension,
        "modulus_bits": r.parameters.modulus_bits,
        "security_bits": r.parameters.security_bits,
        "window": r.window,
        "fractional_bits": [r.frac_input, r.frac_output, r.frac_gain],
        "headroom_bits": r.headroom_bits,
        "max_abs_u_plain": scale,
        "max_rel_u_error": float(np.abs(trace["u_enc"] - trace["u_plain"]).max()) / scale,
        "bit_identical_to_twin": bool(np.array_equal(trace["u_enc"], trace["u_twin"])),
        "scale_bits": r.noise_scale_bits,
        "noise_bound": r.noise_bound,
        "plain_us_per_sample": 1e6 * plain_s / steps,
        "plant_us_per_sample": 1e6 * plant_s / steps,
        "cloud_us_per_sample": 1e6 * cloud_s / steps,
        "uplink_bytes": r.uplink_bytes,
        "downlink_bytes": r.downlink_bytes,
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
    ax[0].plot(t, trace["y_enc"], lw=1, color="C0", label="LWE-encrypted controller")
    ax[0].set_ylabel("measurement y")
    ax[0].legend(loc="upper right")
    scale = np.abs(trace["u_plain"]).max()
    rel = np.maximum(np.abs(trace["u_enc"] - trace["u_plain"]) / scale, 1e-17)
    ax[1].semilogy(t, rel, lw=0.8, label="encrypted (= fixed-point twin, bit for bit)")
    ax[1].set_ylabel("|u_enc - u_plain| / max|u|")
    ax[1].legend(loc="lower right")
    ax[2].plot(t, trace["word"].astype(np.float64) / 2.0**64, ".", ms=1)
    ax[2].set_ylabel("u~ word / 2^64\n(what the cloud sends)")
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
    parser.add_argument("--modulus-bits", type=int, default=64, help="log2 q (64 to 128)")
    parser.add_argument("--n-state", type=int, default=2, help="plant and controller states")
    parser.add_argument("--plot", type=Path, default=None, help="folder for encrypted_lqg.png")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    summary, trace = run(args.steps, args.modulus_bits, args.n_state)
    if args.plot:
        summary["figure"] = str(plot(trace, args.plot))
    if args.json:
        print(json.dumps(summary))
        return
    for key, value in summary.items():
        print(f"{key:24s} {value}")


if __name__ == "__main__":
    main()
