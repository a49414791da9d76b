"""SIFL's coding work per round, float64 beside modular (integers mod 2^64), in one run.

Run:  .venv/bin/python benchmarks/bench_sifl_arithmetic.py [--local-epochs 40] [--scheme sifl-m1]
(prints one JSON object)

The paper's 199,210-parameter MLP (784-200-200-10), 10 clients, digits28, block keys. For each
arithmetic: the coding work one round adds to FedAvg, timed alone (best of 5; server encode and
decode, every client's decode and lift, the aggregation), and the median of plain FedAvg rounds
with ``--local-epochs`` (40 epochs of digits' ~144 samples per client ~ one MNIST epoch of 6,000
per client). The round-time ratio is ``(plain + coding) / plain``; the issue's goal is 1.05 at
most for both arithmetics.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from immersion_fl.runtime.engine import RunConfig, Server, codec_seconds_per_round, task_from_config


def config(scheme: str, arithmetic: str, local_epochs: int) -> RunConfig:
    """The benchmark's run: the paper's MLP, 10 clients, block keys."""
    return RunConfig.from_flat(
        {
            "scheme": scheme,
            "model": "mlp",
            "hidden": (200, 200),
            "clients": 10,
            "rounds": 1,
            "dataset": "digits28",
            "keys": "block",
            "local_epochs": local_epochs,
            "arithmetic": arithmetic,
        }
    )


def plain_round_seconds(cfg: RunConfig, rounds: int = 3) -> float:
    """Median seconds of a plain FedAvg round on the run's clients (training and averaging)."""
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    assert server.plain is not None
    plain = server.plain
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    times = []
    for t in range(rounds):
        start = time.perf_counter()
        received = plain.broadcast(t)
        uploads = [plain.client_upload(c, received, t) for c in clients]
        plain.server_update(plain.aggregate(uploads, [c.n_samples for c in clients]))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scheme", default="sifl-m1", choices=["sifl-m1", "sifl-m2", "sifl-rm"])
    parser.add_argument("--local-epochs", type=int, default=40)
    args = parser.parse_args()
    plain = plain_round_seconds(config(args.scheme, "float", args.local_epochs))
    out: dict[str, object] = {"scheme": args.scheme, "plain_round_s": plain}
    coding: dict[str, float] = {}
    for arithmetic in ("float", "modular"):
        coding[arithmetic] = codec_seconds_per_round(
            config(args.scheme, arithmetic, args.local_epochs)
        )
        out[f"{arithmetic}_coding_s_per_round"] = coding[arithmetic]
        out[f"{arithmetic}_round_time_ratio"] = (plain + coding[arithmetic]) / plain
    out["modular_over_float_coding"] = coding["modular"] / coding["float"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
