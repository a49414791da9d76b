"""Federated learning by immersion on sklearn's digits: every SIFL scheme beside plain FedAvg.

    .venv/bin/python fl_demos/sifl_digits.py [--rounds 10] [--optimizer adam] [--plot out/sifl]

Each scheme trains in lockstep with FedAvg on the same batches; the decoded global models agree
to rounding error, so the accuracy curves coincide (seed 000 Figs. 2-3, on the data available here).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from immersion_fl.runtime.engine import RunConfig, run_federated, stderr_progress


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--optimizer", choices=["sgd", "momentum", "adam"], default="adam")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--plot", type=Path, default=None, help="folder for accuracy.png")
    args = parser.parse_args()
    lr = 0.005 if args.optimizer == "adam" else 0.05
    curves = {}
    for scheme in ("sifl-m1", "sifl-m2", "sifl-rm"):
        cfg = RunConfig(
            scheme=scheme,
            optimizer=args.optimizer,
            lr=lr,
            rounds=args.rounds,
            clients=args.clients,
            local_epochs=2,
        )
        result = run_federated(cfg, progress=stderr_progress)
        curves[scheme] = result.accuracy
        curves["fedavg"] = result.accuracy_plain
        print(
            f"{scheme:8s} accuracy {result.accuracy[-1]:.4f}  "
            f"fedavg {result.accuracy_plain[-1]:.4f}  "
            f"max |w - w_fedavg| {max(result.diff_vs_plain):.1e}  "
            f"epsilon_local {result.privacy['epsilon_local']}"
        )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        args.plot.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, acc in curves.items():
            ax.plot(range(1, len(acc) + 1), acc, "--" if name == "fedavg" else "-", label=name)
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"digits, {args.clients} clients, {args.optimizer}: SIFL schemes vs FedAvg")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot / "accuracy.png", dpi=110)
        print(f"plot: {args.plot / 'accuracy.png'}")


if __name__ == "__main__":
    main()
