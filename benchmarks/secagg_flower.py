"""Flower's SecAgg+ beside the same Flower run without it: precision of the sum, dropouts, time.

Prints one JSON object (and each run's line on stderr as it finishes): thirteen Flower runs on
the simulation runtime, about five minutes on 2 cores. The figures are those of
``docs/notes/secagg_flower.md``.

* ``precision``: 5 users, ``dim`` float64 values ``+-U(0.1, 1)`` each, 3 rounds; the error of the
  SecAgg+ sum against the exact float64 sum, max and RMS, beside the bound
  :func:`~immersion_secagg.flower_secagg.quantization_error_bound`, for four settings of
  ``(clipping_range, quantization_range, modulus_range)``, the last one clipping;
* ``dropouts``: which users each round aggregates when user 2 fails at each SecAgg+ stage of
  round 1 (5 shares, threshold 3), with two and three failures, with threshold 4, and plain;
* ``time``: a round after the first (the first includes starting Ray's workers), SecAgg+ over
  plain (``round_ratio``), and the whole ``run_simulation`` call.

    python benchmarks/secagg_flower.py [--users 5] [--dim 650] [--rounds 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
from immersion_secagg.flower_secagg import (
    STAGES,
    AggregationRun,
    FixedUpdates,
    exact_sums,
    plain_sum,
    quantization_error_bound,
    secagg_sum,
)


def errors(run: AggregationRun, updates: FixedUpdates, n_users: int, rounds: int) -> dict:
    """Max and RMS error of the run's sums against the exact sums over the same contributors."""
    done = {t: total for t in range(rounds) if (total := run.sums[t]) is not None}
    if not done:
        return {}
    exact = exact_sums(updates, n_users, rounds, run.contributors)
    diffs = np.concatenate([np.ravel(total - exact[t]) for t, total in done.items()])
    return {"max": float(np.max(np.abs(diffs))), "rms": float(np.sqrt(np.mean(diffs**2)))}


def row(label: str, run: AggregationRun, updates: FixedUpdates, n_users: int, rounds: int) -> dict:
    """One run's figures (printed on stderr as well)."""
    out = {
        "run": label,
        "aggregated": [s is not None for s in run.sums],
        "contributors": run.contributors,
        "error": errors(run, updates, n_users, rounds),
        "round_seconds": run.round_seconds,
        "warm_round_s": float(np.mean(run.round_seconds[1:])) if rounds > 1 else None,
        "total_s": run.total_seconds,
    }
    print(f"[bench] {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--dim", type=int, default=650)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    n, rounds = args.users, args.rounds
    rng = np.random.default_rng(args.seed)
    values = rng.uniform(0.1, 1.0, (rounds, n, args.dim)) * rng.choice(
        [-1.0, 1.0], (rounds, n, args.dim)
    )
    updates = FixedUpdates(values)

    plain = row("plain", plain_sum(updates, n, rounds), updates, n, rounds)
    precision = []
    for c, q, m in [
        (8.0, 2**22, 2**32),
        (1.0, 2**22, 2**32),
        (1.0, 2**30, 2**40),
        (0.5, 2**22, 2**32),
    ]:
        run = secagg_sum(
            updates, n, rounds, clipping_range=c, quantization_range=q, modulus_range=m
        )
        label = f"secagg c={c} T=2**{int(math.log2(q))} M=2**{int(math.log2(m))}"
        precision.append(
            {**row(label, run, updates, n, rounds), "bound": quantization_error_bound(n, c, q)}
        )

    shares = dict(num_shares=5, reconstruction_threshold=3)
    cases: list[tuple[str, dict, dict]] = [
        (f"user 2 fails at {stage}, threshold 3", shares, {(1, 2): stage}) for stage in STAGES
    ]
    stage2 = "collect_masked_vectors"
    cases += [
        ("users 2, 4 fail at stage 2, threshold 3", shares, {(1, 2): stage2, (1, 4): stage2}),
        ("users 0, 2, 4 fail at stage 2, threshold 3", shares, {(1, u): stage2 for u in (0, 2, 4)}),
        (
            "user 2 fails at stage 2, threshold 4",
            {**shares, "reconstruction_threshold": 4},
            {(1, 2): stage2},
        ),
    ]
    dropouts = [
        row(label, secagg_sum(updates, n, rounds, dropouts=drop, **kw), updates, n, rounds)
        for label, kw, drop in cases
    ]
    dropouts.append(
        row(
            "plain, user 2 fails",
            plain_sum(updates, n, rounds, dropouts={(1, 2): "fit"}),
            updates,
            n,
            rounds,
        )
    )
    secure = precision[0]
    rms_sum = float(np.sqrt(np.mean(values.sum(axis=1) ** 2)))
    print(
        json.dumps(
            {
                "setting": {"users": n, "dim": args.dim, "rounds": rounds, "rms_of_sum": rms_sum},
                "precision": precision,
                "dropouts": dropouts,
                "time": {
                    "plain_warm_round_s": plain["warm_round_s"],
                    "secagg_warm_round_s": secure["warm_round_s"],
                    "round_ratio": secure["warm_round_s"] / plain["warm_round_s"]
                    if rounds > 1
                    else None,
                    "plain_total_s": plain["total_s"],
                    "secagg_total_s": secure["total_s"],
                    "total_ratio": secure["total_s"] / plain["total_s"],
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
