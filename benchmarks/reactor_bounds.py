"""The reactor demo's per-decode bound and closed-loop drift over several seeds.

Run:  .venv/bin/python benchmarks/reactor_bounds.py [--seeds 0-9] [--steps 2000]
(prints one JSON object; about 1-3 s per seed)

For each seed, ``immersion demo reactor --json --seed S`` (the same run and summary): the drift
of the decoded closed loop against its plain twin (``drift_max_abs_u``,
``drift_max_abs_controller_state``; measured, not bounded) and its ratio to the probe-point
``decode_error_estimate``; the per-decode figures (``decode_error_bound``,
``max_abs_decode_error``, ``decode_bound_holds``, error / bound median and worst). ``pooled``
takes the median and worst of error / bound over every decode of u and x_c of every seed.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from immersion.errors import InvalidArgumentError
from immersion_reactor.simulation import run_reactor, summary

PER_SEED = (
    "drift_max_abs_u",
    "drift_max_abs_controller_state",
    "decode_error_estimate",
    "decode_error_bound",
    "max_abs_decode_error",
    "decode_bound_holds",
    "decode_error_over_bound_median",
    "decode_error_over_bound_max",
)


def parse_seeds(text: str) -> list[int]:
    """``"0-9"`` or ``"0,3,5"`` as a list of seeds.

    Parameters
    ----------
    text : str
        An inclusive range ``A-B`` or a comma-separated list of non-negative integers.

    Returns
    -------
    list of int
        The seeds, in order.
    """
    try:
        if "-" in text:
            first, last = (int(v) for v in text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(v) for v in text.split(",")]
    except ValueError:
        raise InvalidArgumentError("seeds", f"{text!r}: expected A-B or A,B,C") from None
    if not seeds or min(seeds) < 0:
        raise InvalidArgumentError("seeds", f"{text!r}: expected non-negative seeds")
    return seeds


def measure(seeds: list[int], steps: int) -> dict:
    """Run the reactor demo for each seed and pool the per-decode error / bound ratios.

    Parameters
    ----------
    seeds : list of int
        Seeds of ``run_reactor``.
    steps : int
        Control samples per run.

    Returns
    -------
    dict
        ``per_seed`` (the figures of :data:`PER_SEED` and ``drift_u_over_estimate``) and
        ``pooled`` (median and worst error / bound over every decode, whether every bound held,
        the largest drift over estimate).
    """
    per_seed, ratios = {}, []
    for seed in seeds:
        run = run_reactor(steps=steps, seed=seed)
        out = summary(run)
        row = {k: out[k] for k in PER_SEED}
        row["drift_u_over_estimate"] = out["drift_max_abs_u"] / out["decode_error_estimate"]
        per_seed[str(seed)] = row
        ratios.append(run.u_decode_error / run.u_decode_bound)
        ratios.append(run.state_decode_error / run.state_decode_bound)
    pooled = np.concatenate([r.ravel() for r in ratios])
    return {
        "steps": steps,
        "seeds": seeds,
        "per_seed": per_seed,
        "pooled": {
            "decodes": int(pooled.size),
            "decode_bound_holds": bool(all(r["decode_bound_holds"] for r in per_seed.values())),
            "decode_error_over_bound_median": float(np.median(pooled)),
            "decode_error_over_bound_max": float(pooled.max()),
            "drift_u_over_estimate_max": max(r["drift_u_over_estimate"] for r in per_seed.values()),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0-9", help="A-B (inclusive) or A,B,C")
    parser.add_argument("--steps", type=int, default=2000, help="control samples per run")
    args = parser.parse_args()
    print(json.dumps(measure(parse_seeds(args.seeds), args.steps), indent=2))


if __name__ == "__main__":
    main()
