"""LWE coding: the proven and the measured precision, per controller and requested precision.

Run:  .venv/bin/python benchmarks/lwe_precision.py [--steps 2000]   (prints one JSON object)

For each example loop (LQG with 2, 3, 4 states, a 2-input 2-output LQG, a PI, CDSL's four-tank)
and each requested precision (1e-4 and 1e-6 of output_range; 128-bit security), the design's
ring and proven one-step bound, and the encrypted closed loop beside the float one from the same
disturbances: max |u - u_float| over output_range (closed loop: the one-step errors accumulate
through the plant). Decoding is bit-identical to the fixed-point twin, so the figures do not
depend on the key or the noise.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from immersion.lwe import encrypt_controller
from immersion.lwe.examples import four_tank_loop, lqg_loop, pi_loop, simulate_float


def relative_error(loop, precision: float, steps: int) -> dict:
    try:
        imm = encrypt_controller(
            loop.controller,
            input_range=loop.input_range,
            output_range=loop.output_range,
            precision=precision,
            rng=0,
        )
    except ValueError as exc:
        return {"requested": precision, "refused": str(exc)}
    A, B, C = loop.plant
    w, v = loop.disturbance(steps)
    x, xt = loop.x0.copy(), imm.encode_state()
    us = np.empty((steps, B.shape[1]))
    for k in range(steps):
        y = C @ x + v[k]
        yt = imm.encode_input(y)
        ut, xt = imm.target.advance(xt, yt)
        us[k] = imm.decode_output(ut, yt)
        x = A @ x + B @ us[k] + w[k]
    ref = simulate_float(loop, steps)[1]
    d = imm.design
    return {
        "requested": precision,
        "degree": d.degree,
        "modulus_bits": round(float(np.log2(float(d.modulus))), 1),
        "plaintext_modulus_bits": round(float(np.log2(float(d.plaintext_modulus))), 1),
        "window": d.window,
        "precision_proven_one_step": d.precision,
        "closed_loop_error": float(np.abs(us - ref).max() / max(d.output_range)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    loops = {
        "lqg-2": lqg_loop(2),
        "lqg-3": lqg_loop(3),
        "lqg-4": lqg_loop(4),
        "lqg-3-mimo": lqg_loop(3, n_input=2, n_output=2),
        "pi": pi_loop(),
        "four-tank": four_tank_loop(),
    }
    rows = {
        name: [relative_error(loop, precision, args.steps) for precision in (1e-4, 1e-6)]
        for name, loop in loops.items()
    }
    command = "python benchmarks/lwe_precision.py --steps %d" % args.steps
    print(
        json.dumps(
            {"benchmark": "lwe-precision", "command": command, "steps": args.steps, "loops": rows}
        )
    )


if __name__ == "__main__":
    main()
