"""SIFL on a user's own torch module of about 200k parameters, against plain FedAvg, one process.

The module is defined here (not an SDK model): a 784-250-10 network with a tanh hidden layer and
a skip term, 198,760 parameters, trained on sklearn's digits upsampled to 28x28 through the
public API (``immersion_fl.run``). Each round runs the scheme and plain FedAvg in lockstep on
the same batches (``compare_plain=True``), so the round-time ratio is measured side by side.

    .venv/bin/python benchmarks/bench_own_model.py [--scheme sifl-m1] [--rounds 4] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch import nn


class WideTanh(nn.Module):
    """784 -> 250 (tanh) -> 10, plus a linear read-out of the mean pixel: 198,760 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(784, 250)
        self.out = nn.Linear(250, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        return self.out(torch.tanh(self.hidden(flat))) + flat.mean(1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="sifl-m1")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import immersion_fl
    from immersion_fl.runtime.data import load_dataset, split_clients

    torch.manual_seed(0)
    model = WideTanh().double()
    data = load_dataset("digits28", seed=0)
    parts = split_clients(data.y_train, args.clients, seed=0)
    clients = [(data.x_train[p], data.y_train[p]) for p in parts]
    out = immersion_fl.run(
        model,
        clients,
        scheme=args.scheme,
        lr=0.05,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        batch_size=32,
        rng=0,
        compare_plain=True,
        test_data=(data.x_test, data.y_test),
        keys="block",
    )
    summary = out.summary()
    figures = {
        "scheme": args.scheme,
        "n_params": summary["n_params"],
        "n_encoded": summary["n_encoded"],
        "clients": args.clients,
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "round_time_ratio": summary["round_time_ratio"],
        "round_s_median": summary["round_s_median"],
        "plain_round_s_median": float(np.median(out.history.round_s_plain)),
        "max_abs_diff_vs_plain": summary["max_abs_diff_vs_plain"],
        "accuracy": summary["accuracy"],
        "accuracy_plain": summary["accuracy_plain"],
        "epsilon_local": summary["epsilon_local"],
    }
    print(
        json.dumps(figures)
        if args.json
        else "\n".join(f"  {k:24s} {v}" for k, v in figures.items())
    )


if __name__ == "__main__":
    main()
