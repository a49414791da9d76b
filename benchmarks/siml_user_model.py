"""SIML on a user's own module of about 200k parameters, beside plain training of the same module.

Run from the repository root (prints one JSON object; progress on stderr):

    .venv/bin/python benchmarks/siml_user_model.py [--optimizer adam] [--epochs 10] [--repeats 3]
        [--threads N]
    .venv/bin/immersion bench siml --model benchmarks.siml_user_model:build_model --no-baselines

The module below is not one of the SDK's: a digits MLP 64-448-384-10 with the Mish activation
``x tanh(softplus(x))`` (205,386 parameters). The figures are those of ``immersion bench siml``:
one process, the same data, initial weights and batch order; training time only, best of
``--repeats`` with plain (the same flat-vector optimizer code), a standard torch loop
(``torch.optim``) and SIML alternating; epoch and per-batch sync; the largest weight difference
of the decoded model to both plain models.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


class DigitsMish(torch.nn.Module):
    """64-448-384-10 with Mish: 205,386 parameters, no buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 448)
        self.fc2 = torch.nn.Linear(448, 384)
        self.out = torch.nn.Linear(384, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        for layer in (self.fc1, self.fc2):
            h = layer(h)
            h = h * torch.tanh(torch.nn.functional.softplus(h))
        return self.out(h)


def build_model() -> torch.nn.Module:
    """The float64 module (``--model benchmarks.siml_user_model:build_model``)."""
    return DigitsMish().double()


def main() -> None:
    from immersion.cli.params import json_safe
    from immersion_fl.runtime.data import load_digits_dataset
    from immersion_siml.bench import bench_siml
    from immersion_siml.dynamics import TrainingPlan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lr = 0.001 if args.optimizer == "adam" else 0.05
    plan = TrainingPlan(
        optimizer=args.optimizer,
        lr=lr,
        epochs=args.epochs,
        batch_size=args.batch_size,
        order_seed=args.seed,
    )
    result = bench_siml(
        model="siml_user_model:build_model",  # this file (its folder is on sys.path as a script)
        dataset=load_digits_dataset(seed=args.seed),
        plan=plan,
        repeats=args.repeats,
        seed=args.seed,
        baselines=False,
        progress=lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True),
    )
    result["torch_threads"] = torch.get_num_threads()
    print(json.dumps(json_safe(result)))


if __name__ == "__main__":
    main()
