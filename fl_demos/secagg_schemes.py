"""Seed 001's Fig. 5 on the data available here: SGD-DP, GSGD-DP and GD-DP under secure aggregation.

    .venv/bin/python fl_demos/secagg_schemes.py [--rounds 30] [--epsilons 1,4,16] [--plot DIR] \
        [--quick] [--json]

50 users (the paper's setting, with B = 32 reduced to 16: sklearn's digits give each of the 50
users 28 training records, and IID sampling needs B <= D), C = 10, delta = 1e-4, a linear model
(softmax regression, 650 parameters; seed 001 also used a linear model), FedSGD with lr 0.5.
For every scheme and total epsilon, the per-user noise ``sigma2`` is calibrated for the whole run
(RDP composition; dp-accounting for SGD-DP's sampling without replacement, eq. 35 for GSGD-DP,
the Gaussian mechanism for GD-DP). Each run is beside the same run without noise. Prints one JSON
object; ``--plot`` writes accuracy against epsilon and the per-round time of each scheme.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from immersion_fl.runtime.engine import RunConfig, run_federated

SCHEMES = ("sgd-dp", "gsgd-dp", "gd-dp")


def run_demo(
    *,
    rounds: int,
    epsilons: list[float],
    users: int = 50,
    batch: int = 16,
    lr: float = 0.5,
    seed: int = 0,
) -> dict:
    rows = []
    for scheme in SCHEMES:
        for eps in epsilons:
            cfg = RunConfig.from_flat(
                dict(
                    scheme=scheme,
                    model="linear",
                    clients=users,
                    rounds=rounds,
                    batch_size=batch,
                    lr=lr,
                    epsilon=eps,
                    delta=1e-4,
                    grad_clip=10.0,
                    seed=seed,
                )
            )
            start = time.perf_counter()
            out = run_federated(cfg).summary()
            rows.append(
                {
                    "scheme": scheme,
                    "epsilon_target": eps,
                    "epsilon": out["epsilon"],
                    "alpha": out["alpha"],
                    "sigma2": out["sigma2"],
                    "accuracy": out["accuracy"],
                    "accuracy_no_noise": out["accuracy_plain"],
                    "round_s_median": out["round_s_median"],
                    "update_s_median": out["update_s_median"],
                    "round_time_ratio_vs_no_noise": out["round_time_ratio"],
                    "samples_per_user": out["samples_per_user"],
                    "run_s": time.perf_counter() - start,
                }
            )
            print(f"[secagg] {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return {
        "settings": {
            "dataset": "digits",
            "model": "linear (650 parameters)",
            "users": users,
            "batch": batch,
            "clip": 10.0,
            "delta": 1e-4,
            "rounds": rounds,
            "lr": lr,
            "seed": seed,
        },
        "runs": rows,
    }


def plot(result: dict, folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for scheme, color in zip(SCHEMES, ("C0", "C1", "C2"), strict=True):
        rows = [r for r in result["runs"] if r["scheme"] == scheme]
        left.plot(
            [r["epsilon"] for r in rows],
            [r["accuracy"] for r in rows],
            "o-",
            color=color,
            label=scheme,
        )
        right.bar(scheme, sum(r["round_s_median"] for r in rows) / len(rows), color=color)
    no_noise = max(r["accuracy_no_noise"] for r in result["runs"])
    left.axhline(no_noise, color="gray", linestyle="--", linewidth=1, label="no noise")
    left.set_xscale("log")
    left.set_xlabel(f"epsilon over {result['settings']['rounds']} rounds (delta 1e-4)")
    left.set_ylabel("test accuracy")
    left.set_title("50 users, digits, linear model")
    left.legend()
    right.set_ylabel("seconds per round (50 users, median)")
    right.set_title("time per round")
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "secagg_schemes.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--epsilons", default="1,4,16")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds, epsilon 4, 10 users (a smoke test)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (the default prints it too)"
    )
    args = parser.parse_args()
    if args.quick:
        result = run_demo(rounds=3, epsilons=[4.0], users=10)
    else:
        result = run_demo(rounds=args.rounds, epsilons=[float(e) for e in args.epsilons.split(",")])
    if args.plot is not None:
        result["plot"] = str(plot(result, args.plot))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
