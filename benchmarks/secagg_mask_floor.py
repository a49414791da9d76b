"""The floor that pairwise masks put under a secure round's total work, against plain FedAvg.

A node of ``SecureAggregation`` (defaults: a ring of ``k = ring_neighbours(n)`` peers, one 64-bit
word per value) generates one AES-128-CTR keystream per peer, as long as its vector. Those
keystreams are work plain FedAvg never does, whatever else is made faster. This script measures,
on this machine and in one process, for the benchmark's 1M-parameter MLP (1,010,850 values) and
its CNN at 50 nodes:

* ``keystream_s``: the ``k`` keystreams alone (``aes_ctr_chunks`` into one buffer, nothing added);
* ``mask_s``: the whole mask of one node (``mask_fixed``: fixed point, the ``k`` streams added);

each the least of ``--repeat`` runs, and reads plain FedAvg's per-round total work and server
time from a saved run of ``bench_flower_secagg.py`` (``--plain``). The floor of the total-work
ratio is ``(plain_serial + n * keystream_s) / plain_serial``: the masks' keystreams added to plain
FedAvg's round and nothing else counted (no masking arithmetic, no larger uploads); ``mask_floor``
counts the whole mask instead. The keystream floor is also given for fewer peers and for 32-bit
words (half the stream), the two ways to lower it; the mask floor for 32-bit words assumes the
whole mask halves too.

    python benchmarks/secagg_mask_floor.py [--repeat 5]
        [--plain docs/figures/fl/bench_flower_secagg_paired.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from immersion.securesum.prg import aes_ctr_chunks, chunk_buffer
from immersion.securesum.protocol import CHUNK_BYTES, mask_fixed
from immersion_secagg.message_graph import ring_neighbours

ROOT = Path(__file__).resolve().parents[1]
#: Values of the benchmark's MLP (784-1024-200-10, as ``bench_flower_secagg.py`` builds it).
MLP_VALUES = 784 * 1024 + 1024 + 1024 * 200 + 200 + 200 * 10 + 10


def cnn_values() -> int:
    """Values of the Flower quickstart's CNN (the benchmark's other model)."""
    sys.path.insert(0, str(ROOT / "fl_demos" / "flower_quickstart"))
    from digitsexample.task import Net

    return sum(p.numel() for p in Net().parameters())


def least_time(work, repeat: int) -> float:
    """The least wall time of ``repeat`` runs of ``work()``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def keystreams(n_words: int, peers: int) -> None:
    """``peers`` AES-128-CTR keystreams of ``n_words`` 64-bit words, chunk by chunk."""
    chunk = min(CHUNK_BYTES // 8, n_words)
    buffer = chunk_buffer(chunk)
    for peer in range(peers):
        key = bytes([peer + 1]) * 16
        for _ in aes_ctr_chunks(
            key, n_words, chunk_words=chunk, extra="fl", purpose="a benchmark", buffer=buffer
        ):
            pass


def floor_row(model: str, n_values: int, nodes: int, plain: dict, repeat: int) -> dict:
    """The measured keystream and mask times of one node and the floors they put under a round."""
    k = ring_neighbours(nodes) or nodes - 1
    values = np.random.default_rng(0).normal(0, 0.05, n_values)
    seeds = {peer: bytes([peer]) * 32 for peer in range(1, k + 1)}
    stream_s = least_time(lambda: keystreams(n_values, k), repeat)
    mask_s = least_time(lambda: mask_fixed(values, nodes, 0, seeds, words=1), repeat)
    plain_serial = plain["serial_s"]
    plain_node = (plain["serial_s"] - plain["server_s"]) / nodes

    def floor(peers: int, word_bytes: int) -> float:
        return (plain_serial + nodes * stream_s * peers / k * word_bytes / 8) / plain_serial

    return {
        "model": model,
        "nodes": nodes,
        "n_values": n_values,
        "k": k,
        "keystream_s": stream_s,
        "mask_s": mask_s,
        "keystream_gb_per_s": k * 8 * n_values / stream_s / 1e9,
        "plain_serial_s": plain_serial,
        "plain_node_s": plain_node,
        "keystreams_over_plain_node": stream_s / plain_node,
        "floor_ratio": floor(k, 8),
        "floor_ratio_32bit_words": floor(k, 4),
        "floor_ratio_k8": floor(8, 8),
        "mask_floor_ratio": (plain_serial + nodes * mask_s) / plain_serial,
        "mask_floor_ratio_32bit_words": (plain_serial + nodes * mask_s / 2) / plain_serial,
        "measured_serial_ratio": plain.get("ours_serial_ratio"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--plain", default=str(ROOT / "docs/figures/fl/bench_flower_secagg_paired.json")
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    saved = json.loads(Path(args.plain).read_text())
    rows = []
    for row in saved["rows"]:
        if row["dropout"] != 0.0:
            continue
        plain = dict(row["plain"], ours_serial_ratio=row["ours"]["serial_ratio"])
        n_values = MLP_VALUES if row["model"] == "mlp1m" else cnn_values()
        rows.append(floor_row(row["model"], n_values, row["nodes"], plain, args.repeat))
    out = {
        "command": "python benchmarks/secagg_mask_floor.py"
        + (f" --repeat {args.repeat}" if args.repeat != 5 else "")
        + (f" --out {args.out}" if args.out else ""),
        "plain_from": str(Path(args.plain).resolve().relative_to(ROOT)),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "rows": rows,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
