"""Codec benchmark: the modular codec (integers mod 2^64) beside the float codec, side by side.

Run:  .venv/bin/python benchmarks/bench_codec.py [--quick]   (prints one JSON object)
Also: .venv/bin/immersion bench codec --json

Round trip = fixed-point conversion (modular only) + encoding with fresh noise + decoding of one
flat vector, block keys with each arithmetic's default block size (equal key memory: float
blocks of 32, integer blocks of 16 stored with their inverses), at the 199,210-parameter MLP
and the 1,199,882-entry CNN state. Before the timings it builds integer block keys for the CNN
state alone and reports their wall time, bytes and the peak resident memory of that build.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from immersion.bench.core import CODEC_SIZES, bench_codec
from immersion.keys import draw_modular_code


def cnn_modular_key_build() -> dict[str, float]:
    """Integer block keys for the 1,199,882-entry CNN state: seconds, bytes, peak memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    code = draw_modular_code(1_199_882, 2, kind="block", rng=0)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    all_odd = bool(code.odd_noise_rows().all())
    check_s = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "n": 1_199_882,
        "build_s": build_s,
        "odd_noise_rows_check_s": check_s,
        "every_noise_row_odd": all_odd,
        "key_bytes": code.nbytes,
        "peak_rss_bytes": peak * 1024,
        "rss_growth_bytes": (peak - before) * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="only n = 199,210")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    build = None if args.quick else cnn_modular_key_build()
    result = bench_codec(
        sizes=CODEC_SIZES[:1] if args.quick else CODEC_SIZES,
        repeats=args.repeats,
        progress=lambda m: print(f"[bench] {m}", file=sys.stderr),
    )
    if build is not None:
        result["cnn_modular_block_keys"] = build
    print(json.dumps(result))


if __name__ == "__main__":
    main()
