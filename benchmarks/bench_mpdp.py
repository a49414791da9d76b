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
  (a checkout of an earlier commit, e.g. ``git worktree add /tmp/before main``) and for this
  checkout, in subprocesses taking turns, so both see the same machine load; prints the ratios
  side by side, and the floor the ``n_L``-fold size of Psi sets (:func:`psi_floor`).

    python benchmarks/bench_mpdp.py [--rounds 100] [--quick] [--only timing|accuracy] [--plot DIR]
    python benchmarks/bench_mpdp.py --only timing --before /tmp/before [--repeats 3]
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

from immersion_fl.engine import RunConfig, run_federated
from immersion_mpdp.engine import TrainingDivergedError


def run(**options: object) -> dict:
    cfg = RunConfig.from_flat({"scheme": "mpdp", "batch_size": 32, **options})
    print(f"[bench] {options}", file=sys.stderr, flush=True)
    try:
        return run_federated(cfg).summary()
    except TrainingDivergedError as exc:
        return {"diverged": str(exc)}


#: The timing settings of the issue's figures: (clients, hidden, masked corrections).
TIMING = [
    (10, (200, 200), True),
    (10, (200, 200), False),
    (6, (20, 12), True),
    (6, (20, 12), False),
]


def timing_worker(spec: str) -> None:
    """One timing setting in this process (one torch thread), its summary as JSON on stdout."""
    import torch

    torch.set_num_threads(1)
    clients, hidden, masked, rounds = json.loads(spec)
    out = run(
        noise="on",
        clients=clients,
        hidden=tuple(hidden),
        rounds=rounds,
        mask_corrections=masked,
        lr=0.01,
    )
    keep = ("round_time_ratio", "round_s_median", "upload_bytes_ratio", "phase_s_median")
    print(json.dumps({k: out[k] for k in keep}))


def before_after(before: Path, repeats: int, rounds: int) -> dict:
    """Every TIMING setting for the code in ``before`` and in this checkout, taking turns."""
    here = Path(__file__).resolve().parents[1]
    codes = {"before": before.resolve(), "after": here}
    rows: dict[str, dict[str, list[dict]]] = {}
    for _ in range(repeats):
        for clients, hidden, masked in TIMING:
            kind = "masked" if masked else "clear"
            name = f"{clients} clients, {'-'.join(map(str, hidden))}, {kind}"
            for code, root in codes.items():
                env = dict(os.environ, PYTHONPATH=f"{root / 'sdk'}{os.pathsep}{root / 'plugins'}")
                spec = json.dumps([clients, list(hidden), masked, rounds])
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
        out[name] = {
            "round_time_ratio_before": ratios["before"][len(ratios["before"]) // 2],
            "round_time_ratio_after": ratios["after"][len(ratios["after"]) // 2],
            "all_ratios": ratios,
            "phase_s_median_after": by_code["after"][-1]["phase_s_median"],
            "upload_bytes_ratio": {c: v[-1]["upload_bytes_ratio"] for c, v in by_code.items()},
        }
    return out


def psi_floor(sizes: tuple[int, ...] = (64, 200, 200, 10), batch: int = 32) -> dict:
    """What the ``n_L``-fold size of Psi costs by itself, against the plain gradient.

    Medians over repeats, one torch thread: the plain FedSGD gradient (forward + backward), the
    whole LMT, the batched outer products that form Psi and Phi alone, and one copy of a
    float64 array of Psi's size (the memory traffic of writing it once).
    """
    import numpy as np
    import torch
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
    n_out = sizes[-1]
    sens = [torch.rand(n_out + 2, batch, n, dtype=torch.float64) for n in sizes[1:-1]]
    inputs = [torch.rand(batch, n, dtype=torch.float64) for n in sizes[:-2]]
    layout = Layout(sizes)
    block = np.ones(layout.correction_size)

    def median_ms(fn, n: int = 50) -> float:
        fn()
        times = []
        for _ in range(n):
            tick = time.perf_counter()
            fn()
            times.append(time.perf_counter() - tick)
        return float(np.median(times) * 1e3)

    return {
        "sizes": list(sizes),
        "batch": batch,
        "plain_gradient_ms": median_ms(lambda: mse_gradient(w, x, t)),
        "lmt_ms": median_ms(lambda: local_model_training(model, x, t)),
        "psi_phi_outer_products_ms": median_ms(
            lambda: [s.transpose(1, 2) @ h for s, h in zip(sens, inputs, strict=True)]
        ),
        "copy_psi_sized_array_ms": median_ms(lambda: block.copy()),
        "corrections_over_gradient_size": layout.correction_size / layout.gradient_size,
    }


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
    args = parser.parse_args()
    if args.before is not None:
        if args.only != "timing":
            parser.error("--before needs --only timing")
        result = {
            "before": str(args.before),
            "torch_threads": 1,
            "timing": before_after(args.before, args.repeats, 2 if args.quick else 5),
            "psi_floor": psi_floor(),
        }
        print(json.dumps(result, indent=1))
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
        print(json.dumps({"timing": timing}))
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
    print(json.dumps(result))


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
