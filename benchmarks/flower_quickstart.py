"""Flower's quickstart app on digits, with and without ``enable_sifl.patch``, side by side.

Copies ``fl_demos/flower_quickstart`` twice (as shipped, and with the patch applied), runs each
on Flower's simulation runtime (two SuperNodes, in-process ``run_simulation``) and compares the
final models: the largest weight difference for SIFL M1, M2 and RM against the unpatched app,
and the wall time of each run over the unpatched one's (taking turns, the median of the
repeats). Each run is a fresh process, so Ray's start-up is inside every time.

    .venv/bin/python benchmarks/flower_quickstart.py [--rounds 3] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / "fl_demos" / "flower_quickstart"
SCHEMES = ("sifl-m1", "sifl-m2", "sifl-rm")

SIMULATE = """
import sys
from flwr.simulation import run_simulation
from digitsexample import server_app, client_app
server_app.DEFAULTS.update({{"final-model": sys.argv[1], "num-server-rounds": {rounds}}})
server_app.DEFAULTS.update({extra})
run_simulation(server_app=server_app.app, client_app=client_app.app, num_supernodes=2,
               backend_config={{"client_resources": {{"num_cpus": 1, "num_gpus": 0.0}},
                               "init_args": {{"num_cpus": 2}}}})
"""


def app_copy(folder: Path, name: str, patched: bool, patch: str = "enable_sifl.patch") -> Path:
    """A copy of the quickstart app under ``folder/name``, with ``patch`` (a file beside the app)
    applied when ``patched``."""
    app = folder / name
    shutil.copytree(QUICKSTART, app)
    if patched:
        subprocess.run(["git", "apply", patch], cwd=app, check=True)
    return app


def simulate(app: Path, out: Path, *, rounds: int = 2, extra: str = "{}") -> dict:
    """Run ``app`` on the simulation runtime in a fresh process; its final state dict."""
    import torch

    env = {**os.environ, "PYTHONPATH": f"{app}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-c", SIMULATE.format(rounds=rounds, extra=extra), str(out)]
    try:  # a run takes ~15 s here; Ray's start-up has been seen to hang on a loaded CI machine
        done = subprocess.run(
            command, cwd=app, env=env, capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:  # one retry: a hang in our code would hang again
        done = subprocess.run(
            command, cwd=app, env=env, capture_output=True, text=True, timeout=180
        )
    if not out.exists():
        raise RuntimeError(f"the app wrote no model:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return torch.load(out)


def max_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert list(a) == list(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        plain_app, sifl_app = app_copy(folder, "plain", False), app_copy(folder, "sifl", True)
        seconds: dict[str, list[float]] = {"plain": [], **{s: [] for s in SCHEMES}}
        diffs: dict[str, float] = {}
        for repeat in range(args.repeats):
            for name in ("plain", *SCHEMES):
                app = plain_app if name == "plain" else sifl_app
                extra = "{}" if name == "plain" else f'{{"sifl-scheme": "{name}"}}'
                out = folder / f"{name}-{repeat}.pt"
                start = time.perf_counter()
                model = simulate(app, out, rounds=args.rounds, extra=extra)
                seconds[name].append(time.perf_counter() - start)
                if name == "plain":
                    plain = model
                else:
                    diffs[name] = max(diffs.get(name, 0.0), max_diff(plain, model))
                print(f"[flower-quickstart] {name} run {repeat}: {seconds[name][-1]:.1f} s",
                      file=sys.stderr)  # fmt: skip
    median = {name: statistics.median(s) for name, s in seconds.items()}
    result = {
        "rounds": args.rounds,
        "repeats": args.repeats,
        "max_abs_diff_vs_unpatched": diffs,
        "seconds_median": median,
        "time_ratio_vs_unpatched": {s: median[s] / median["plain"] for s in SCHEMES},
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
