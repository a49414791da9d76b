"""MP-DP (seed 004) beside plain FedSGD in the same runs: round time, upload size, accuracy.

Prints one JSON object (and each accuracy row on stderr as it finishes).

* ``timing``: per-round time over plain FedSGD with the same batches, and the per-phase medians
  (the paper's Table 5 columns: MP, Recover, client training, DP), with the corrections masked
  (our default) and in the clear (the paper).
* ``accuracy``: final test accuracy at per-round epsilon 1 and 3 (and larger, to show where
  training recovers) next to plain FedSGD, for 10 clients, and for 100 clients with a smaller
  model over half the rounds. ``sensitivity_observed_max`` is the measured per-record
  sensitivity that the DP theorems assume to be at most 1.

    python benchmarks/bench_mpdp.py [--rounds 100] [--quick] [--only timing|accuracy] [--plot DIR]
    python benchmarks/bench_mpdp.py --from-json SAVED.json --plot DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from immersion_fl.engine import RunConfig, run_federated
from immersion_mpdp.engine import TrainingDivergedError


def run(**options: object) -> dict:
    cfg = RunConfig.from_flat({"scheme": "mpdp", "batch_size": 32, **options})
    print(f"[bench] {options}", file=sys.stderr, flush=True)
    try:
        return run_federated(cfg).summary()
    except TrainingDivergedError as exc:
        return {"diverged": str(exc)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    parser.add_argument(
        "--only", choices=["timing", "accuracy"], default=None, help="run one of the two parts"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write mpdp_accuracy.png here")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="plot a saved result instead of running"
    )
    args = parser.parse_args()
    if args.from_json is not None:
        if args.plot is None:
            parser.error("--from-json needs --plot")
        print(plot_accuracy(json.loads(args.from_json.read_text()), args.plot))
        return
    rounds = 3 if args.quick else args.rounds
    timing: dict = {}
    for masked in (True, False) if args.only != "accuracy" else ():
        out = run(
            noise="on",
            clients=10,
            hidden=(200, 200),
            rounds=5 if not args.quick else 2,
            mask_corrections=masked,
            lr=0.01,
        )
        timing["masked" if masked else "clear"] = {
            k: out[k]
            for k in (
                "round_time_ratio",
                "round_s_median",
                "upload_bytes_ratio",
                "broadcast_bytes_ratio",
                "phase_s_median",
                "n_params",
            )
        }
    accuracy: list = []
    if args.only == "timing":
        print(json.dumps({"timing": timing}))
        return
    exact = run(
        noise="off", clients=10, hidden=(200, 200), rounds=rounds, mask_corrections=False, lr=0.1
    )
    accuracy.append(
        {
            "clients": 10,
            "hidden": [200, 200],
            "noise": "off",
            "accuracy": exact["accuracy"],
            "accuracy_plain": exact["accuracy_plain"],
            "max_abs_diff_vs_plain": exact["max_abs_diff_vs_plain"],
        }
    )
    keep = (
        "delta",
        "accuracy",
        "accuracy_plain",
        "sigma_eta",
        "sensitivity_observed_max",
        "epsilon_total",
        "diverged",
    )
    grid = [(10, (200, 200), lr, rounds) for lr in (0.1, 0.01)] + [
        (100, (32,), 0.1, max(1, rounds // 2))
    ]
    for clients, hidden, lr, n_rounds in grid:
        for eps in (1.0, 3.0, 30.0, 300.0):
            out = run(
                noise="on",
                epsilon=eps,
                clients=clients,
                hidden=hidden,
                rounds=n_rounds,
                mask_corrections=False,
                lr=lr,
            )
            accuracy.append(
                {
                    "clients": clients,
                    "hidden": list(hidden),
                    "lr": lr,
                    "rounds": n_rounds,
                    "epsilon": eps,
                    **{k: out[k] for k in keep if k in out},
                }
            )
            print(f"[bench] -> {json.dumps(accuracy[-1])}", file=sys.stderr, flush=True)
    result = {
        "rounds": rounds,
        "dataset": "digits",
        "batch_size": 32,
        "timing": timing,
        "accuracy": accuracy,
    }
    if args.plot is not None:
        result["plot"] = str(plot_accuracy(result, args.plot))
    print(json.dumps(result))


def plot_accuracy(result: dict, folder: Path) -> Path:
    """Final accuracy against per-round epsilon, one line per setting, plain FedSGD dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    settings = sorted(
        {(r["clients"], tuple(r["hidden"]), r["lr"]) for r in result["accuracy"] if "epsilon" in r}
    )
    for (clients, hidden, lr), color in zip(settings, ("C0", "C1", "C2", "C3"), strict=False):
        rows = [
            r
            for r in result["accuracy"]
            if "epsilon" in r
            and (r["clients"], tuple(r["hidden"]), r["lr"]) == (clients, hidden, lr)
        ]
        eps = [r["epsilon"] for r in rows]
        acc = [r.get("accuracy", 0.1) for r in rows]  # diverged: chance level
        label = f"{clients} clients, {'-'.join(map(str, hidden))} hidden, lr {lr}"
        ax.plot(eps, acc, "o-", color=color, label=label)
        for r in rows:
            if "diverged" in r:
                ax.annotate(
                    "diverged",
                    (r["epsilon"], 0.1),
                    textcoords="offset points",
                    xytext=(8, -3),
                    fontsize=8,
                )
        plain = next(r["accuracy_plain"] for r in rows if "accuracy_plain" in r)
        ax.axhline(plain, color=color, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon per round (delta 1e-5, Theorem 10, sensitivity 1 assumed)")
    ax.set_ylabel("test accuracy (dashed: plain FedSGD)")
    ax.set_title("MP-DP on digits: accuracy against the privacy budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mpdp_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
