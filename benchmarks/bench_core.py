"""Core benchmark: encode + target + decode per step versus plain f, g, side by side.

Run:  .venv/bin/python benchmarks/bench_core.py [--quick]   (prints one JSON object)
Also: .venv/bin/immersion bench core --json

Besides the per-step ratios it measures building block keys for seed 000's CNN state
(1,199,882 entries, n~ - n = 129): wall time and peak resident memory of that build.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from immersion.bench.core import DEFAULT_SIZES, bench_core
from immersion.keys import Keys


def cnn_key_build() -> dict[str, float]:
    """Build block keys for the 1,199,882-parameter CNN state; report seconds and memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    keys = Keys.draw(n_state=1_199_882, n_input=1, n_output=1, extra_state=129, kind="block", rng=0)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    keys.state_code.row_stats()
    stats_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "n_state": 1_199_882,
        "n_state_encoded": keys.state_code.n_total,
        "build_s": build_s,
        "row_stats_s": stats_s,
        "key_bytes": keys.nbytes,
        "peak_rss_bytes": peak * 1024,
        "rss_growth_bytes": (peak - before) * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only n_state 3 and 100")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    sizes = DEFAULT_SIZES[:2] if args.quick else DEFAULT_SIZES
    result = bench_core(
        sizes=sizes, steps=args.steps, progress=lambda m: print(f"[bench] {m}", file=sys.stderr)
    )
    if not args.quick:
        result["cnn_block_keys"] = cnn_key_build()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
