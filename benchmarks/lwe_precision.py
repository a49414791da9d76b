"""LWE coding: the decoded controls against the float controller, per loop and modulus.

Run:  .venv/bin/python benchmarks/lwe_precision.py [--steps 2000]   (prints one JSON object)

For each example loop (LQG with 2, 3, 4 states, a 2-input 2-output LQG, a PI) and each modulus
(q = 2^64, 2^104 at n = 4096, 2^128 at n = 8192; 128-bit security), the encrypted closed loop
runs beside the float one from the same disturbances; the figure is max |u - u_float| over the
float loop's max |u|. Decoding is bit-identical to the fixed-point twin, so the figures do not
depend on the key or the noise.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from immersion.lwe import encrypt_controller
from immersion.lwe.examples import lqg_loop, pi_loop, simulate_float


def relative_error(loop, modulus_bits: int, steps: int) -> dict:
    imm = encrypt_controller(
        loop.controller,
        input_range=loop.input_range,
        output_range=loop.output_range,
        modulus_bits=modulus_bits,
        rng=0,
    )
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
    r = imm.report()
    return {
        "modulus_bits": modulus_bits,
        "dimension": r.parameters.dimension,
        "window": r.window,
        "max_rel_u_error": float(np.abs(us - ref).max() / np.abs(ref).max()),
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
    }
    rows = {
        name: [relative_error(loop, bits, args.steps) for bits in (64, 104, 128)]
        for name, loop in loops.items()
    }
    print(json.dumps({"benchmark": "lwe-precision", "steps": args.steps, "loops": rows}))


if __name__ == "__main__":
    main()
