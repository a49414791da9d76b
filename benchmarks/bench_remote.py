"""Remote-service benchmark: concurrent plants against one `immersion serve`, set-ups side by side.

Run:  .venv/bin/python benchmarks/bench_remote.py [--plants 50] [--samples 2000] [--out PATH]
      (one JSON object on stdout; with --out also written to PATH, e.g.
      docs/figures/remote/bench_remote.json)
Also: .venv/bin/immersion bench remote --json [--out PATH]   (the first set-up alone)

Set-ups, one after the other in this process, each with its own server process:
CurveZMQ with 2 worker threads (the default service), plain loopback transport with 2 workers
(the cost of CurveZMQ), and CurveZMQ with the target work on the socket thread (workers=0: the
cost of the worker hand-off that keeps a slow plant from holding up the others). Every set-up
checks that each plant's decoded outputs equal its own local target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from immersion.bench.remote import bench_remote

SETUPS = {
    "curve_workers2": {"curve": True, "workers": 2},
    "plain_workers2": {"curve": False, "workers": 2},
    "curve_workers0": {"curve": True, "workers": 0},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plants", type=int, default=50)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    args = parser.parse_args()
    runs = {}
    for name, setup in SETUPS.items():
        runs[name] = bench_remote(
            plants=args.plants,
            samples=args.samples,
            progress=lambda m, n=name: print(f"[bench {n}] {m}", file=sys.stderr),
            **setup,
        )
    base = runs["curve_workers2"]

    def ratio(name: str, part: str, figure: str) -> float:
        return float(runs[name][part][figure] / base[part][figure])

    summary = {
        name: {
            "single_p50_ratio": ratio(name, "single_plant", "p50_us"),
            "concurrent_p50_ratio": ratio(name, "concurrent", "p50_us"),
            "concurrent_wall_per_sample_ratio": ratio(name, "concurrent", "wall_us_per_sample"),
        }
        for name in SETUPS
        if name != "curve_workers2"
    }
    text = json.dumps({"benchmark": "remote", "runs": runs, "relative_to_curve_workers2": summary})
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
