"""SIFL M1 on a 1,126,410-parameter MLP, CUDA beside CPU, each with plain FedAvg in lockstep.

The user's own module (64-1024-1024-10, float64) on scikit-learn's bundled digits split over four
clients, block-structured keys, one local epoch per round. For each device the same run reports
the steady-state round time of SIFL and of plain FedAvg (medians over rounds 2..R, the same
clients and batches), their ratio, the set-up time (keys drawn), and the largest distance of the
decoded model to plain FedAvg over all rounds; then the GPU's round time over the CPU's.

Usage: ``python benchmarks/bench_gpu_sifl.py --rounds 6 --out FILE.json`` (needs a CUDA device;
``--devices cpu`` runs the CPU half alone).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch
from sklearn.datasets import load_digits


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).double()


def _clients(n_clients: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple]:
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    parts = np.array_split(np.arange(1500), n_clients)
    return [(x[p], y[p]) for p in parts], (x[1500:], y[1500:])


def run(device: str, rounds: int) -> dict:
    import immersion_fl

    data, test = _clients(4)
    model = _model()
    start = time.perf_counter()
    out = immersion_fl.run(
        model,
        data,
        scheme="sifl-m1",
        keys="block",
        lr=0.05,
        rounds=rounds,
        local_epochs=1,
        batch_size=64,
        rng=0,
        compare_plain=True,
        test_data=test,
        device=device,
    )
    summary = out.summary()
    return {
        "device": device,
        "n_params": sum(p.numel() for p in model.parameters()),
        "round_s_sifl": summary["round_s_median"],
        "round_s_plain": float(np.median(out.history.round_s_plain[1:])),
        "round_time_ratio_sifl_over_plain": summary["round_time_ratio"],
        "setup_s": summary["setup_s"],
        "max_abs_diff_vs_plain": summary["max_abs_diff_vs_plain"],
        "accuracy": summary["accuracy"],
        "accuracy_plain": summary["accuracy_plain"],
        "whole_run_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--devices", default="cuda,cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [run(d, args.rounds) for d in args.devices.split(",")]
    result = {
        "command": f"python benchmarks/bench_gpu_sifl.py --rounds {args.rounds}",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "rows": rows,
    }
    if len(rows) == 2:
        result["sifl_round_cpu_over_gpu"] = rows[1]["round_s_sifl"] / rows[0]["round_s_sifl"]
        result["plain_round_cpu_over_gpu"] = rows[1]["round_s_plain"] / rows[0]["round_s_plain"]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
