"""MP-DP (seed 004) beside plain FedSGD in the same runs: round time, upload size, accuracy.

Prints one JSON object (and each accuracy row on stderr as it finishes).

* ``timing``: per-round time over plain FedSGD with the same batches, and the per-phase medians
  (the paper's Table 5 columns: MP, Recover, client training, DP), with the corrections masked
  (our default) and in the clear (the paper).
* ``accuracy``: final test accuracy at per-round epsilon 1 and 3 (and larger, to show where
  training recovers) next to plain FedSGD, for 10 clients, and for 100 clients with a smaller
  model over half the rounds. ``sensitivity_observed_max`` is the measured per-record
  sensitivity that the DP theorems assume to be at most 1.

* ``--before DIR`` (with ``--only timing``): the same timing settings for the code in ``DIR``
  (a tree with ``sdk/`` and ``plugins/`` of an earlier commit, e.g. ``git archive COMMIT | tar -x
  -C DIR``) and for this checkout, at each code's default options, in subprocesses taking turns,
  so both see the same machine load; prints the ratios side by side, the settings only this
  checkout has (e.g. the complete mask graph), the load average, and the floor the ``n_L``-fold
  size of Psi sets (:func:`psi_floor`).
* ``--out PATH``: also write the JSON there.

    python benchmarks/bench_mpdp.py [--rounds 100] [--quick] [--only timing|accuracy] [--plot DIR]
    python benchmarks/bench_mpdp.py --only timing --before /tmp/before [--repeats 3] [--out F]
    python benchmarks/bench_mpdp.py --from-json SAVED.json --plot DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from immersion_fl.runtime.engine import RunConfig, run_federated
from immersion_mpdp.engine import TrainingDivergedError


def run(**options: object) -> dict:
    cfg = RunConfig.from_flat({"scheme": "mpdp", "batch_size": 32, **options})
    print(f"[bench] {options}", file=sys.stderr, flush=True)
    try:
        return run_federated(cfg).summary()
    except TrainingDivergedError as exc:
        return {"diverged": str(exc)}


#: The timing settings of the issue's figures: (clients, hidden, masked corrections), at each
#: code's default options.
TIMING = [
    (10, (200, 200), True),
    (10, (200, 200), False),
    (6, (20, 12), True),
    (6, (20, 12), False),
]
#: Settings timed for this checkout only (options earlier code does not have).
TIMING_AFTER_ONLY = [
    (10, (200, 200), True, {"mask_graph": "complete"}),
    (6, (20, 12), True, {"mask_graph": "nout:2"}),
]


def timing_worker(spec: str) -> None:
    """One timing setting in this process (one torch thread), its summary as JSON on stdout."""
    import torch

    torch.set_num_threads(1)
    clients, hidden, masked, rounds, extra = json.loads(spec)
    out = run(
        noise="on",
        clients=clients,
        hidden=tuple(hidden),
        rounds=rounds,
        mask_corrections=masked,
        lr=0.01,
        **extra,
    )
    keep = ("round_time_ratio", "round_s_median", "upload_bytes_ratio", "phase_s_median")
    print(json.dumps({k: out.get(k) for k in (*keep, "graph", "mask_graph")}))


def _name(clients: int, hidden: tuple[int, ...], masked: bool, extra: dict) -> str:
    kind = "masked" if masked else "clear"
    more = "".join(f", {k}={v}" for k, v in extra.items())
    return f"{clients} clients, {'-'.join(map(str, hidden))}, {kind}{more}"


def before_after(before: Path, repeats: int, rounds: int) -> dict:
    """Every TIMING setting for the code in ``before`` and in this checkout, taking turns (and
    the TIMING_AFTER_ONLY settings for this checkout in the same turns)."""
    here = Path(__file__).resolve().parents[1]
    codes = {"before": before.resolve(), "after": here}
    jobs = [(c, h, m, {}, list(codes)) for c, h, m in TIMING] + [
        (c, h, m, extra, ["after"]) for c, h, m, extra in TIMING_AFTER_ONLY
    ]
    rows: dict[str, dict[str, list[dict]]] = {}
    for _ in range(repeats):
        for clients, hidden, masked, extra, which in jobs:
            name = _name(clients, hidden, masked, extra)
            for code in which:
                root = codes[code]
                env = dict(os.environ, PYTHONPATH=f"{root / 'sdk'}{os.pathsep}{root / 'plugins'}")
                spec = json.dumps([clients, list(hidden), masked, rounds, extra])
                done = subprocess.run(
                    [sys.executable, __file__, "--timing-worker", spec],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows.setdefault(name, {}).setdefault(code, []).append(json.loads(done.stdout))
    out = {}
    for name, by_code in rows.items():
        ratios = {c: sorted(r["round_time_ratio"] for r in v) for c, v in by_code.items()}
        out[name] = {f"round_time_ratio_{c}": ratios[c][len(ratios[c]) // 2] for c in ratios} | {
            "all_ratios": ratios,
            "phase_s_median_after": by_code["after"][-1]["phase_s_median"],
            "graphs_after": {k: by_code["after"][-1][k] for k in ("graph", "mask_graph")},
            "upload_bytes_ratio": {c: v[-1]["upload_bytes_ratio"] for c, v in by_code.items()},
        }
    return out


def psi_floor(
    sizes: tuple[int, ...] = (64, 200, 200, 10), batch: int = 32, repeats: int = 60
) -> dict:
    """What the ``n_L``-fold size of Psi costs by itself, against the plain gradient.

    One torch thread, every function timed in turn within each repeat (so all see the same
    load), each run twice and timed the second time (its data in cache: the floor, not the
    cache misses that depend on what ran before), medians, each writing into buffers it reuses
    as a client does from round to round (a fresh buffer costs a page fault per 4 KiB): the plain
    FedSGD gradient (forward + backward), the whole LMT, the part of LMT that exists because of
    the ``n_L + 1`` extra cotangents (their batched outer products per layer and their
    propagation through the weights), the fixed point of the corrections alone, and with one
    mask neighbour (AES-CTR keystream of the corrections' size, added modulo 2^64).
    """
    import numpy as np
    import torch
    from immersion.securesum.protocol import mask_fixed
    from immersion_mpdp.ddp import Layout
    from immersion_mpdp.lmt import local_model_training
    from immersion_mpdp.mlp import init_weights, mse_gradient, one_hot
    from immersion_mpdp.perturbation import perturb

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    w = init_weights(sizes, seed=0)
    model, _ = perturb(w, np.random.default_rng(0))
    x = torch.rand(batch, sizes[0], generator=gen, dtype=torch.float64)
    t = one_hot(torch.randint(0, sizes[-1], (batch,), generator=gen), sizes[-1])
    layout = Layout(sizes)
    n_out = sizes[-1]
    # the inputs of every hidden layer, as LMT forms them, and sensitivities of their shapes
    h, inputs = x, [x]
    for wl, d in zip(model.odd[:-1], model.transitional, strict=True):
        h = ((h @ wl.T).clamp_min(0.0) * d).clamp_min(0.0)
        inputs.append(h)
    sens = [
        torch.rand(n_out + 1, batch, n, generator=gen, dtype=torch.float64) for n in sizes[1:-1]
    ]
    products = [
        torch.empty(n_out + 1, a, b, dtype=torch.float64)
        for a, b in zip(sizes[1:-1], sizes[:-2], strict=True)
    ]
    below = [torch.empty(n_out + 1, batch, n, dtype=torch.float64) for n in sizes[1:-2]]

    def extra_cotangents() -> None:
        for layer in range(len(sizes) - 3, -1, -1):
            torch.matmul(sens[layer].transpose(1, 2), inputs[layer], out=products[layer])
            if layer:
                torch.matmul(sens[layer], model.odd[layer], out=below[layer - 1])

    flat = (np.empty(layout.gradient_size), np.empty(layout.correction_size))
    corrections = np.random.default_rng(0).uniform(-1, 1, layout.correction_size)
    spent = np.empty_like(corrections)

    def masked(peers: dict) -> None:
        np.copyto(spent, corrections)
        mask_fixed(spent, 10, 0, peers, words=1, overwrite=True)

    work = {
        "plain_gradient_ms": lambda: mse_gradient(w, x, t),
        "lmt_ms": lambda: local_model_training(model, x, t, out=flat),
        "lmt_extra_cotangents_ms": extra_cotangents,
        "fixed_point_ms": lambda: masked({}),
        "fixed_point_one_mask_ms": lambda: masked({1: bytes(32)}),
    }
    times: dict[str, list[float]] = {k: [] for k in work}
    for fn in work.values():
        fn()
    for _ in range(repeats):
        for name, fn in work.items():
            fn()
            tick = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - tick)
    out: dict = {"sizes": list(sizes), "batch": batch, "repeats": repeats}
    out.update({k: float(np.median(v) * 1e3) for k, v in times.items()})
    out["mask_per_neighbour_ms"] = out["fixed_point_one_mask_ms"] - out["fixed_point_ms"]
    out["lmt_over_plain_gradient"] = out["lmt_ms"] / out["plain_gradient_ms"]
    out["lmt_extra_cotangents_over_plain_gradient"] = (
        out["lmt_extra_cotangents_ms"] / out["plain_gradient_ms"]
    )
    out["mask_per_neighbour_over_plain_gradient"] = (
        out["mask_per_neighbour_ms"] / out["plain_gradient_ms"]
    )
    out["corrections_over_gradient_size"] = layout.correction_size / layout.gradient_size
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--timing-worker":
        timing_worker(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke test")
    parser.add_argument(
        "--only", choices=["timing", "accuracy"], default=None, help="run one of the two parts"
    )
    parser.add_argument("--plot", type=Path, default=None, help="write mpdp_accuracy.png here")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="plot a saved result instead of running"
    )
    parser.add_argument(
        "--before", type=Path, default=None, help="a checkout of earlier code to time beside this"
    )
    parser.add_argument("--repeats", type=int, default=3, help="turns per setting with --before")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    if args.before is not None:
        if args.only != "timing":
            parser.error("--before needs --only timing")
        load_start = os.getloadavg()
        result = {
            "before": str(args.before),
            "torch_threads": 1,
            "cpus": os.cpu_count(),
            "timing": before_after(args.before, args.repeats, 2 if args.quick else 5),
            "psi_floor": psi_floor(),
            "loadavg_start_end": [list(load_start), list(os.getloadavg())],
        }
        text = json.dumps(result, indent=1)
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
        return
    if args.from_json is not None:
        if args.plot is None:
            parser.error("--from-json needs --plot")
        print(plot_accuracy(json.loads(args.from_json.read_text()), args.plot))
        return
    rounds = 3 if args.quick else args.rounds
    timing: dict = {}
    for masked in (True, False) if args.only != "accuracy" else ():
        out = run(
            noise="on",
            clients=10,
            hidden=(200, 200),
            rounds=5 if not args.quick else 2,
            mask_corrections=masked,
            lr=0.01,
        )
        timing["masked" if masked else "clear"] = {
            k: out[k]
            for k in (
                "round_time_ratio",
                "round_s_median",
                "upload_bytes_ratio",
                "broadcast_bytes_ratio",
                "phase_s_median",
                "n_params",
            )
        }
    accuracy: list = []
    if args.only == "timing":
        _emit({"timing": timing}, args.out)
        return
    exact = run(
        noise="off", clients=10, hidden=(200, 200), rounds=rounds, mask_corrections=False, lr=0.1
    )
    accuracy.append(
        {
            "clients": 10,
            "hidden": [200, 200],
            "noise": "off",
            "accuracy": exact["accuracy"],
            "accuracy_plain": exact["accuracy_plain"],
            "max_abs_diff_vs_plain": exact["max_abs_diff_vs_plain"],
        }
    )
    keep = (
        "delta",
        "accuracy",
        "accuracy_plain",
        "sigma_eta",
        "sensitivity_observed_max",
        "epsilon_total",
        "diverged",
    )
    grid = [(10, (200, 200), lr, rounds) for lr in (0.1, 0.01)] + [
        (100, (32,), 0.1, max(1, rounds // 2))
    ]
    for clients, hidden, lr, n_rounds in grid:
        for eps in (1.0, 3.0, 30.0, 300.0):
            out = run(
                noise="on",
                epsilon=eps,
                clients=clients,
                hidden=hidden,
                rounds=n_rounds,
                mask_corrections=False,
                lr=lr,
            )
            accuracy.append(
                {
                    "clients": clients,
                    "hidden": list(hidden),
                    "lr": lr,
                    "rounds": n_rounds,
                    "epsilon": eps,
                    **{k: out[k] for k in keep if k in out},
                }
            )
            print(f"[bench] -> {json.dumps(accuracy[-1])}", file=sys.stderr, flush=True)
    result = {
        "rounds": rounds,
        "dataset": "digits",
        "batch_size": 32,
        "timing": timing,
        "accuracy": accuracy,
    }
    if args.plot is not None:
        result["plot"] = str(plot_accuracy(result, args.plot))
    _emit(result, args.out)


def _emit(result: dict, out: Path | None) -> None:
    """Print ``result`` as JSON (and write it to ``out``)."""
    text = json.dumps(result)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def plot_accuracy(result: dict, folder: Path) -> Path:
    """Final accuracy against per-round epsilon, one line per setting, plain FedSGD dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    settings = sorted(
        {(r["clients"], tuple(r["hidden"]), r["lr"]) for r in result["accuracy"] if "epsilon" in r}
    )
    for (clients, hidden, lr), color in zip(settings, ("C0", "C1", "C2", "C3"), strict=False):
        rows = [
            r
            for r in result["accuracy"]
            if "epsilon" in r
            and (r["clients"], tuple(r["hidden"]), r["lr"]) == (clients, hidden, lr)
        ]
        eps = [r["epsilon"] for r in rows]
        acc = [r.get("accuracy", 0.1) for r in rows]  # diverged: chance level
        label = f"{clients} clients, {'-'.join(map(str, hidden))} hidden, lr {lr}"
        ax.plot(eps, acc, "o-", color=color, label=label)
        for r in rows:
            if "diverged" in r:
                ax.annotate(
                    "diverged",
                    (r["epsilon"], 0.1),
                    textcoords="offset points",
                    xytext=(8, -3),
                    fontsize=8,
                )
        plain = next(r["accuracy_plain"] for r in rows if "accuracy_plain" in r)
        ax.axhline(plain, color=color, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon per round (delta 1e-5, Theorem 10, sensitivity 1 assumed)")
    ax.set_ylabel("test accuracy (dashed: plain FedSGD)")
    ax.set_title("MP-DP on digits: accuracy against the privacy budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mpdp_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
