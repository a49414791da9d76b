"""Secure sums side by side in one process: what each costs per round, and how exact it is.

Prints one JSON object (each run's line on stderr as it finishes):

Torch runs on one thread; a throwaway run warms the process up first.

* ``sifl``: ``sifl-m1`` on digits (``--clients`` clients, MLP with one hidden layer of 16) with and
  without ``secure_aggregation``, on the local engine and on Flower's simulation runtime: median
  round time after the first round, the ratio, and ``max |w - w_fedavg|``;
* ``seed001``: ``gd-dp`` (noise off, linear model) on Flower with the core secure sum and with
  Flower's SecAgg+ (``secure_sum``), beside the in-process run: median round time, the ratio, and
  the distance of the final model to the in-process one.

    python benchmarks/bench_secure_sum.py [--clients 5] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from immersion_fl.runtime.engine import RunConfig, run_federated


def _median_after_first(seconds: list[float]) -> float:
    return float(np.median(seconds[1:] if len(seconds) > 1 else seconds))


def sifl(clients: int, rounds: int) -> dict[str, object]:
    out: dict[str, object] = {}
    run_federated(RunConfig.from_flat(dict(scheme="sifl-m1", hidden=(16,), clients=2, rounds=1)))
    for engine in ("local", "flower"):
        times = {}
        for secure in (False, True):
            cfg = RunConfig.from_flat(
                dict(
                    scheme="sifl-m1",
                    hidden=(16,),
                    clients=clients,
                    rounds=rounds,
                    batch_size=64,
                    seed=0,
                    secure_aggregation=secure,
                )
            )
            result = run_federated(cfg, engine=engine)
            times[secure] = _median_after_first(result.round_s)
            out[f"{engine}_{'secure' if secure else 'clear'}"] = {
                "round_s_median": times[secure],
                "max_abs_diff_vs_fedavg": max(result.diff_vs_plain),
            }
            print(
                engine,
                secure,
                out[f"{engine}_{'secure' if secure else 'clear'}"],
                file=sys.stderr,
                flush=True,
            )
        out[f"{engine}_ratio"] = times[True] / times[False]
    return out


def seed001(clients: int, rounds: int) -> dict[str, object]:
    flags = dict(
        scheme="gd-dp",
        noise="off",
        model="linear",
        clients=clients,
        rounds=rounds,
        batch_size=8,
        lr=0.5,
    )
    local = run_federated(RunConfig.from_flat(flags))
    out: dict[str, object] = {}
    for how in ("core", "secagg+"):
        run = run_federated(RunConfig.from_flat({**flags, "secure_sum": how}), engine="flower")
        out[how] = {
            "round_s_median": _median_after_first(run.round_s),
            "max_abs_diff_vs_in_process": float((run.final_model - local.final_model).abs().max()),
        }
        print(how, out[how], file=sys.stderr, flush=True)
    out["secagg_plus_over_core"] = (
        out["secagg+"]["round_s_median"] / out["core"]["round_s_median"]  # type: ignore[index]
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # tiny models: one thread is steadier on a busy machine
    print(
        json.dumps(
            {
                "clients": args.clients,
                "rounds": args.rounds,
                "sifl": sifl(args.clients, args.rounds),
                "seed001": seed001(args.clients, args.rounds),
            }
        )
    )


if __name__ == "__main__":
    main()
