"""The encrypted four-tank controller beside the plain one, the earlier BFV mode and ECLib.

Run:  .venv/bin/python benchmarks/bench_encrypted_control.py [--steps 1000] [--bfv-samples 20]
      [--bfv-ref REF] [--out docs/figures/lwe/encrypted_control.json]
(one JSON object on stdout; progress on stderr)

One run, one machine, CDSL's four-tank controller (4 states, 2 measurements, 2 controls):

* this tree: ``immersion bench control`` (:func:`immersion.bench.control.bench_control`): plain,
  the RLWE controller (plant offline, plant online, cloud; bytes; proven and measured precision),
  the precision frontier at N = 4096 and 8192, the order sweep, ECLib's GSW-LWE controller;
* the earlier hidden-gains mode (BFV through TenSEAL, plant packing its plaintext history every
  sample) from git revision ``--bfv-ref`` (its ``sdk/`` and ``plugins/``, run in a child
  process), on the same controller, ranges and closed loop.

CDSL's own figures (``ctrRLWE`` 1.9 ms and ``ctrRGSW`` 6.8 ms per sample, their machine and
their committed ``period.csv``) are quoted, not measured here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from trees import REPO, extract_tree, tree_env  # benchmarks/trees.py (the script's folder)

#: The last revision with the BFV hidden-gains mode (removed by the RLWE controller).
BFV_REF = "777d159"

_BFV_SCRIPT = r"""
import json, sys, time
import numpy as np
from immersion.lwe import encrypt_controller_and_gains
from immersion.lwe.examples import simulate_float
sys.path.insert(0, sys.argv[2])
from four_tank import loop
samples = int(sys.argv[1])
start = time.perf_counter()
imm = encrypt_controller_and_gains(loop.controller, input_range=loop.input_range,
                                   output_range=loop.output_range)
setup = time.perf_counter() - start
A, B, C = loop.plant
w, v = loop.disturbance(samples)
x, xt = loop.x0.copy(), imm.encode_state()
plant = cloud = 0.0
us, up, down = [], 0, 0
for k in range(samples):
    y = C @ x + v[k]
    t0 = time.perf_counter(); yt = imm.encode_input(y); t1 = time.perf_counter()
    ut = imm.target.output(xt, yt); xt = imm.target.step(xt, yt); t2 = time.perf_counter()
    u = imm.decode_output(ut, yt); t3 = time.perf_counter()
    plant += (t1 - t0) + (t3 - t2); cloud += t2 - t1
    size = lambda z: len(z) if isinstance(z, (bytes, bytearray)) else np.asarray(z).nbytes
    up, down = size(yt), size(ut)
    x = A @ x + B @ u + w[k]; us.append(u)
ref = simulate_float(loop, samples)[1]
error = float(np.abs(np.array(us) - ref).max() / loop.output_range)
print(json.dumps({"samples": samples, "setup_s": setup, "plant_s": plant / samples,
                  "cloud_s": cloud / samples, "total_s": (plant + cloud) / samples,
                  "bytes_up": up, "bytes_down": down, "closed_loop_error_vs_float": error}))
"""

_FOUR_TANK = r"""
from immersion.lwe.examples import ControlLoop
import numpy as np
A = np.array({A}); B = np.array({B}); C = np.array({C})
controller = tuple(np.array(m) for m in {controller})
loop = ControlLoop("four-tank", (A, B, C), controller, np.array({x0}), {y_range}, {u_range}, 0)
"""


def _bfv(ref: str, samples: int) -> dict:
    """The earlier hidden-gains loop on this tree's four-tank loop, in that revision's code."""
    from immersion.lwe.examples import four_tank_loop

    loop = four_tank_loop()
    with tempfile.TemporaryDirectory() as tmp:
        tree = extract_tree(ref, Path(tmp))
        (Path(tmp) / "four_tank.py").write_text(
            _FOUR_TANK.format(
                A=loop.plant[0].tolist(), B=loop.plant[1].tolist(), C=loop.plant[2].tolist(),
                controller=[m.tolist() for m in loop.controller], x0=loop.x0.tolist(),
                y_range=loop.input_range, u_range=loop.output_range,
            )
        )  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", _BFV_SCRIPT, str(samples), tmp],
            env=tree_env(tree),
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if done.returncode:
        return {"ref": ref, "failed": done.stderr[-2000:]}
    return {"ref": ref, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--bfv-samples", type=int, default=20)
    parser.add_argument("--bfv-ref", default=BFV_REF)
    parser.add_argument("--eclib-budget", type=float, default=150.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "sdk"))
    from immersion.bench.control import bench_control

    say = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    result = bench_control(steps=args.steps, eclib_budget_s=args.eclib_budget, progress=say)
    say(f"earlier BFV hidden-gains mode ({args.bfv_ref}), {args.bfv_samples} samples")
    bfv = _bfv(args.bfv_ref, args.bfv_samples)
    result["earlier_bfv_mode"] = bfv
    if "total_s" in bfv:
        result["ratio_earlier_bfv_over_lwe"] = bfv["total_s"] / result["lwe"]["total_s"]
    result["cdsl_quoted_not_measured_here"] = {
        "ctrRLWE_ms": 1.9,
        "ctrRGSW_ms": 6.8,
        "source": "CDSL-EncryptedControl/CDSL committed period.csv, their machine",
    }
    result["command"] = "python benchmarks/bench_encrypted_control.py " + " ".join(sys.argv[1:])
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
