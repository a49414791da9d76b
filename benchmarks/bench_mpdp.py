"""MP-DP (seed 004) beside plain FedSGD in the same runs: round time, upload size, accuracy at epsilon.

Prints one JSON object (and each accuracy row on stderr as it finishes).

* ``timing``: per-round time over plain FedSGD with the same batches, and the per-phase medians
  (the paper's Table 5 columns: MP, Recover, client training, DP), with the corrections masked
  (our default) and in the clear (the paper).
* ``accuracy``: final test accuracy at per-round epsilon 1 and 3 (and larger, to show where
  training recovers) next to plain FedSGD, for 10 clients, and for 100 clients with a smaller
  model over half the rounds. ``sensitivity_observed_max`` is the measured per-record
  sensitivity that the DP theorems assume to be at most 1.

    python benchmarks/bench_mpdp.py [--rounds 100] [--quick] [--only timing|accuracy]
"""
from __future__ import annotations

import argparse
import json
import sys

from immersion_fl.engine import RunConfig, run_federated
from immersion_mpdp.engine import TrainingDivergedError


def run(**options: object) -> dict:
    cfg = RunConfig(scheme="mpdp", batch_size=32, **options)  # type: ignore[arg-type]
    print(f"[bench] {options}", file=sys.stderr, flush=True)
    try:
        return run_federated(cfg).summary()
    except TrainingDivergedError as exc:
        return {"diverged": str(exc)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    parser.add_argument("--only", choices=["timing", "accuracy"], default=None, help="run one of the two parts")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    timing: dict = {}
    for masked in (True, False) if args.only != "accuracy" else ():
        out = run(noise="on", clients=10, hidden=(200, 200), rounds=5 if not args.quick else 2,
                  mask_corrections=masked, lr=0.01)
        timing["masked" if masked else "clear"] = {k: out[k] for k in (
            "round_time_ratio", "round_s_median", "upload_bytes_ratio", "broadcast_bytes_ratio", "phase_s_median",
            "n_params")}
    accuracy: list = []
    if args.only == "timing":
        print(json.dumps({"timing": timing}))
        return
    exact = run(noise="off", clients=10, hidden=(200, 200), rounds=rounds, mask_corrections=False, lr=0.1)
    accuracy.append({"clients": 10, "hidden": [200, 200], "noise": "off", "accuracy": exact["accuracy"],
                     "accuracy_plain": exact["accuracy_plain"], "max_abs_diff_vs_plain": exact["max_abs_diff_vs_plain"]})
    keep = ("delta", "accuracy", "accuracy_plain", "sigma_eta", "sensitivity_observed_max", "epsilon_total", "diverged")
    grid = [(10, (200, 200), lr, rounds) for lr in (0.1, 0.01)] + [(100, (32,), 0.1, max(1, rounds // 2))]
    for clients, hidden, lr, n_rounds in grid:
        for eps in (1.0, 3.0, 30.0, 300.0):
            out = run(noise="on", epsilon=eps, clients=clients, hidden=hidden, rounds=n_rounds,
                      mask_corrections=False, lr=lr)
            accuracy.append({"clients": clients, "hidden": list(hidden), "lr": lr, "rounds": n_rounds, "epsilon": eps,
                             **{k: out[k] for k in keep if k in out}})
            print(f"[bench] -> {json.dumps(accuracy[-1])}", file=sys.stderr, flush=True)
    print(json.dumps({"rounds": rounds, "dataset": "digits", "batch_size": 32, "timing": timing,
                      "accuracy": accuracy}))


if __name__ == "__main__":
    main()
