"""Huge block keys: ``immerse`` for a 1,199,882-entry state, this tree beside an earlier one.

Run:  .venv/bin/python benchmarks/bench_huge_keys.py [--baseline-ref REF] [--repeats 3]
(prints one JSON object; progress on stderr)

The call is ``immerse(f, g, n_state=1_199_882, n_input=10, n_output=10, keys="block",
extra_state=1_199_882 // 64)`` (seed 000's CNN state with 18,748 extra entries). Each run is a
fresh Python process, so its peak resident memory (``ru_maxrss``) is that of one construction;
the process first imports the library, and the import's own peak is reported beside it. With
``--baseline-ref`` the same call runs on the ``sdk/`` of that git revision (extracted with
``git archive``), alternating with this tree, and the JSON carries the ratios this / baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trees import REPO, extract_tree, tree_env  # benchmarks/trees.py (the script's folder)

#: What one child process runs: import, build, report seconds and peak memory as JSON.
CHILD = """
import json, resource, time
start = time.perf_counter()
import numpy as np
from immersion import immerse
imported = time.perf_counter()
import_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = 1_199_882
imm = immerse(lambda x, y: 0.5 * x, lambda x, y: x[:10] + y, n_state=n, n_input=10, n_output=10,
              keys="block", extra_state=n // 64, rng=0)
built = time.perf_counter()
x = np.linspace(-1.0, 1.0, n)
stepped = imm.target.step(imm.encode_state(x), imm.encode_input(np.zeros(10)))
error = float(np.abs(imm.decode_state(stepped) - 0.5 * x).max())
print(json.dumps({"import_s": imported - start, "build_s": built - imported,
                  "import_peak_rss_bytes": import_peak * 1024,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "key_bytes": imm.keys.nbytes, "max_abs_state_error": error}))
"""


def _run(tree: Path) -> dict[str, float]:
    """One construction in a fresh process on ``tree``'s ``sdk/`` and ``plugins/`` (the plugins
    register at import, so an earlier core must come with its own)."""
    env = tree_env(tree)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    return {
        "build_s_min": min(r["build_s"] for r in runs),
        "build_s_median": statistics.median(r["build_s"] for r in runs),
        "peak_rss_bytes_median": statistics.median(r["peak_rss_bytes"] for r in runs),
        "import_peak_rss_bytes_median": statistics.median(r["import_peak_rss_bytes"] for r in runs),
        "import_s_median": statistics.median(r["import_s"] for r in runs),
        "key_bytes": runs[0]["key_bytes"],
        "max_abs_state_error": max(r["max_abs_state_error"] for r in runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline-ref", help="git revision to run beside this tree")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {"this": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            trees = {"baseline": extract_tree(args.baseline_ref, Path(tmp)), **trees}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for i in range(args.repeats):
            for name, tree in trees.items():  # alternating, so load changes hit both alike
                print(f"[bench] run {i + 1}/{args.repeats}: {name}", file=sys.stderr)
                runs[name].append(_run(tree))
    result: dict[str, object] = {
        "benchmark": "huge_keys",
        "call": "immerse(n_state=1_199_882, n_input=10, n_output=10, keys='block', "
        "extra_state=1_199_882 // 64)",
        "repeats": args.repeats,
        **{name: _summary(r) for name, r in runs.items()},
    }
    if args.baseline_ref:
        base, this = _summary(runs["baseline"]), _summary(runs["this"])
        result["baseline_ref"] = args.baseline_ref
        result["build_time_ratio"] = this["build_s_median"] / base["build_s_median"]
        result["peak_rss_ratio"] = this["peak_rss_bytes_median"] / base["peak_rss_bytes_median"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
