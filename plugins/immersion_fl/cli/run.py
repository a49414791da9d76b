"""``immersion fl run``, ``immersion bench sifl`` and ``immersion keys flower``."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import click
import numpy as np
from immersion.cli.params import SEED, FiniteFloatRange, json_safe

from ..registry import fl_registry

SCHEMES = tuple(sorted(fl_registry().fl_schemes))
OPTIMIZERS = tuple(sorted(fl_registry().optimizers))


def _hidden(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected comma-separated layer sizes, e.g. 200,200", param_hint="--hidden"
        ) from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r}: expected positive layer sizes", param_hint="--hidden")
    return sizes


def _model_name(value: str) -> str:
    from immersion.imports import is_import_path

    if value in ("linear", "mlp", "cnn", "cnn2") or is_import_path(value):
        return value
    raise click.BadParameter(
        f"{value!r}: expected linear, mlp, cnn, cnn2 or package.module:function",
        param_hint="--model",
    )


#: What the float figures mean (printed under them; docs/tutorials/federated_learning.md,
#: "What exactness means").
EXACTNESS_NOTE = (
    "one_step_error: the decoded aggregate against the weighted average of the same round's local "
    "models. diff_vs_plain: the whole trajectory against plain FedAvg, which training (Adam above "
    "all) amplifies from any 1e-16 difference; reference_drift is plain FedAvg against itself with "
    "its uploads summed in another order. --arithmetic modular decodes bit for bit."
)


@click.group("fl")
def fl_group() -> None:
    """Federated learning: immersion (seeds 000, 003) and model perturbation (seed 004,
    --scheme mpdp)."""


@fl_group.command("run")
@click.option("--scheme", type=click.Choice(SCHEMES), default="sifl-m1", show_default=True)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="sgd", show_default=True)
@click.option(
    "--model",
    default="mlp",
    show_default=True,
    callback=lambda ctx, param, value: _model_name(value),
    help="linear, mlp, cnn, cnn2, or your own as package.module:function returning a float64 "
    "nn.Module.",
)
@click.option("--hidden", default="200,200", show_default=True, help="MLP hidden layer sizes.")
@click.option("--clients", type=click.IntRange(1), default=10, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True)
@click.option("--local-epochs", type=click.IntRange(1), default=1, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option("--lr", type=FiniteFloatRange(min=0, min_open=True), default=0.05, show_default=True)
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="digits, digits28, mnist:PATH, fashion:PATH, or your own as package.module:function "
    "returning (X, Y) or (X, Y, X_test, Y_test).",
)
@click.option("--split", type=click.Choice(["iid", "dirichlet"]), default="iid", show_default=True)
@click.option(
    "--alpha",
    type=FiniteFloatRange(min=0, min_open=True),
    default=0.5,
    show_default=True,
    help="Dirichlet concentration for --split dirichlet.",
)
@click.option(
    "--extra",
    type=click.IntRange(1),
    default=None,
    help="Added dimensions n~ - n (default: 201 for M1/M2 as in the paper's MLP, 1 for sifl-rm).",
)
@click.option(
    "--p",
    "p",
    type=click.IntRange(2),
    default=2,
    show_default=True,
    help="Aggregator columns (sifl-m2).",
)
@click.option(
    "--epsilon-local",
    type=FiniteFloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Per-element epsilon of each upload (seed 000 Theorem 1 or 2).",
)
@click.option(
    "--noise",
    type=click.Choice(["auto", "laplace", "gaussian", "on", "off"]),
    default="auto",
    show_default=True,
    help="SIFL: laplace or gaussian (auto: laplace). mpdp, sgd-dp, gsgd-dp, gd-dp: on or off "
    "(auto: on).",
)
@click.option(
    "--delta",
    type=FiniteFloatRange(0, 0.5, min_open=True),
    default=1e-5,
    show_default=True,
    help="Delta for --noise gaussian (SIFL), of mpdp's per-round guarantee and of the "
    "sgd-dp, gsgd-dp, gd-dp run.",
)
@click.option(
    "--epsilon",
    type=FiniteFloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="mpdp: per-round epsilon (seed 004 Eq. 23); sgd-dp, gsgd-dp, gd-dp: total over all "
    "rounds.",
)
@click.option(
    "--grad-clip",
    type=FiniteFloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="sgd-dp, gsgd-dp, gd-dp: per-example gradient clip C (seed 001).",
)
@click.option(
    "--sigma2",
    type=FiniteFloatRange(min=0),
    default=None,
    help="sgd-dp, gsgd-dp, gd-dp: per-user noise variance (WF-NA floor); default: calibrated to "
    "--epsilon.",
)
@click.option(
    "--secure-sum",
    type=click.Choice(["core", "secagg+"]),
    default="core",
    show_default=True,
    help="sgd-dp, gsgd-dp, gd-dp with --engine flower: the SDK's secure sum, or Flower's SecAgg+ "
    "(quantised; masks from 32-bit Mersenne Twister seeds).",
)
@click.option(
    "--graph",
    default="auto",
    show_default=True,
    help="mpdp: neighbour graph for pairwise noise, auto, complete or nout:N (Theorems 10, 11; "
    "auto: n-out where Theorem 11 allows a sparse one, complete below).",
)
@click.option(
    "--mask-graph",
    default="auto",
    show_default=True,
    help="mpdp: neighbour graph of the masks of the corrections, auto, complete or nout:N "
    "(auto: complete up to 7 clients, nout:2 above).",
)
@click.option(
    "--mask-corrections/--no-mask-corrections",
    default=True,
    show_default=True,
    help="mpdp: the server sees only the sum of Psi and Phi (off: the paper's clear upload).",
)
@click.option(
    "--sensitivity",
    type=FiniteFloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="mpdp: assumed per-record sensitivity (the paper's S_f = 1; the run reports the observed "
    "one).",
)
@click.option(
    "--clip",
    type=FiniteFloatRange(min=0, min_open=True),
    default=100.0,
    show_default=True,
    help="Client model norm bound C (sensitivity 2C/|D_i|, seed 000 Remark 3; the paper uses "
    "1000).",
)
@click.option(
    "--secure-aggregation",
    is_flag=True,
    help="sifl-m1, sifl-m2, sifl-rm: the aggregator gets pairwise-masked uploads and learns only "
    "their weighted sum (dropouts recovered).",
)
@click.option(
    "--keys", type=click.Choice(["auto", "dense", "block"]), default="auto", show_default=True
)
@click.option(
    "--block-size",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Block size of structured keys (transforms are memory-bound: smaller is faster).",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "flower"]),
    default="local",
    show_default=True,
    help="local: clients in this process; flower: Flower ClientApps on Flower's simulation "
    "runtime.",
)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--compare-plain/--no-compare-plain",
    default=True,
    show_default=True,
    help="Run plain FedAvg in lockstep with the same batches.",
)
@click.option(
    "--arithmetic",
    type=click.Choice(["float", "modular"]),
    default="float",
    show_default=True,
    help="SIFL: float64 coding (seed 000) or exact integers mod 2^64 (epsilon 0; decodes bit "
    "for bit to FedAvg on the same fixed-point values).",
)
@click.option(
    "--fraction-bits",
    type=click.IntRange(0, 62),
    default=32,
    show_default=True,
    help="Modular arithmetic: fixed-point values round(w 2^f).",
)
@click.option(
    "--reference-drift/--no-reference-drift",
    default=True,
    show_default=True,
    help="Also run FedAvg summing its uploads in reverse order: the float64 drift any two FedAvg "
    "runs show, next to the scheme's (with --compare-plain).",
)
@click.option(
    "--client-timeout",
    type=FiniteFloatRange(min=0, min_open=True, max=threading.TIMEOUT_MAX),
    default=None,
    help="Seconds a client may take before it is left out of the round.",
)
@click.option(
    "--inject-fault",
    "inject",
    multiple=True,
    metavar="CLIENT:ROUND:KIND",
    help="Make a client fail on purpose (raise, timeout, malformed, wrong-shape; no-recovery: a "
    "survivor does not reveal its seeds, mpdp and --secure-aggregation).",
)
@click.option(
    "--checkpoint",
    "checkpoint",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Save server state and keys here after every round (owner-only files).",
)
@click.option("--resume", is_flag=True, help="Continue the run saved in --checkpoint.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fl_run(
    hidden: str,
    plot_dir: Path | None,
    as_json: bool,
    engine: str,
    inject: tuple[str, ...],
    checkpoint: Path | None,
    resume: bool,
    reference_drift: bool,
    **options: Any,
) -> None:
    """Train a model federatedly with a SIFL scheme beside plain FedAvg, or with mpdp beside plain
    FedSGD.

    \b
    Times reported (seconds; the plain twin runs the same clients and batches):
      setup_s            one-time set-up before round 1 (keys drawn, noise calibrated,
                         clients built); in no round
      first_round_s      round 1 alone (it also pays first-use costs)
      round_s_median     steady state: median over rounds 2..R (round 1 if R = 1)
      round_time_ratio   steady state: scheme / plain twin, medians over rounds 2..R
    """
    from ..runtime.engine import EveryClientFailedError, RunConfig, progress_bar, run_federated
    from ..runtime.faults import FaultPlan

    cfg = RunConfig.from_flat({"hidden": _hidden(hidden), **options})
    if engine == "flower" and (checkpoint or resume):
        raise click.UsageError("--checkpoint/--resume work with --engine local")
    try:
        result = run_federated(
            cfg,
            engine=engine,
            progress=progress_bar(cfg.rounds),
            faults=FaultPlan.parse(inject),
            checkpoint=checkpoint,
            resume=resume,
            reference_drift=reference_drift and cfg.compare_plain,
        )
    except EveryClientFailedError as exc:  # e.g. an --lr so large that training diverges
        raise click.ClickException(
            f"{exc} (see the reasons above; check --lr, --clip, --epsilon-local, --client-timeout)"
        ) from None
    out = result.summary()
    out["engine"] = engine
    if plot_dir is not None:
        from .plots import write_fl_plots

        out["plots"] = [str(p) for p in write_fl_plots(result, plot_dir)]
    if as_json:  # strict JSON: an infinite epsilon (no noise) is null
        click.echo(json.dumps(json_safe(out)))
        return
    keys = [
        "scheme",
        "optimizer",
        "model",
        "n_params",
        "n_encoded",
        "key_bytes",
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "round_time_ratio",
        "setup_s",
        "epsilon_local",
        "epsilon_global",
        "one_step_error_max",
        "reference_drift_max",
    ]
    if out.get("arithmetic") == "modular":
        keys += ["arithmetic", "max_abs_diff_vs_float_fedavg"]
    if cfg.scheme == "mpdp":
        keys = (
            keys[:4]
            + keys[6:11]
            + [
                "upload_bytes_ratio",
                "noise",
                "epsilon",
                "delta",
                "epsilon_total",
                "delta_total",
                "sensitivity_assumed",
                "sensitivity_observed_max",
            ]
        )
    elif "sigma2" in out:  # seed 001's schemes
        keys = keys[:4] + keys[7:11] + ["epsilon", "delta", "alpha", "sigma2", "accountant"]
    for key in keys:
        click.echo(f"  {key:28s} {out.get(key)}")
    if out.get("one_step_error_max") is not None and out.get("arithmetic") == "float":
        click.echo(f"  {EXACTNESS_NOTE}")
    for p in out.get("plots", []):
        click.echo(f"  plot: {p}")


@click.command("sifl")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--scheme",
    type=click.Choice([s for s in SCHEMES if s != "fedavg"]),
    default="sifl-m1",
    show_default=True,
)
@click.option("--dataset", default="digits28", show_default=True)
@click.option(
    "--local-epochs",
    type=click.IntRange(1),
    default=40,
    show_default=True,
    help="40 epochs of digits' ~144 samples per client ~ one epoch of MNIST's 6000 per client.",
)
@click.option(
    "--arithmetic",
    type=click.Choice(["float", "modular"]),
    default="float",
    show_default=True,
    help="The scheme's coding: float64 (seed 000) or integers mod 2^64.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_sifl(
    rounds: int, scheme: str, dataset: str, local_epochs: int, arithmetic: str, as_json: bool
) -> None:
    """The paper's 199,210-parameter MLP with 10 clients, scheme beside plain FedAvg in one run."""
    from ..runtime.engine import RunConfig, progress_bar, run_federated

    cfg = RunConfig.from_flat(
        {
            "scheme": scheme,
            "model": "mlp",
            "hidden": (200, 200),
            "clients": 10,
            "rounds": rounds,
            "dataset": dataset,
            "keys": "block",
            "local_epochs": local_epochs,
            "arithmetic": arithmetic,
        }
    )
    result = run_federated(cfg, progress=progress_bar(cfg.rounds))
    out = result.summary()
    keep = (
        "scheme",
        "arithmetic",
        "n_params",
        "n_encoded",
        "round_time_ratio",
        "key_bytes",
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "round_s_median",
    )
    out = {k: out[k] for k in keep}
    from ..runtime.engine import codec_seconds_per_round

    codec = codec_seconds_per_round(cfg)
    plain = float(np.median(result.round_s_plain))
    out.update(
        {
            "plain_round_s_median": plain,
            "codec_s_per_round": codec,
            "round_time_ratio_from_codec": (plain + codec) / plain,
        }
    )
    click.echo(
        json.dumps(json_safe(out))
        if as_json
        else "\n".join(f"  {k:24s} {v}" for k, v in out.items())
    )


@click.command("flower")
@click.option(
    "--out",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the files (created 0700 if missing).",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A name or address the SuperLink is dialled at (repeat); makes a CA and its certificate.",
)
@click.option("--node", "nodes", multiple=True, help="A SuperNode key pair NAME (repeat).")
@click.option("--overwrite", is_flag=True, help="Replace existing files.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def keys_flower(
    folder: Path, hosts: tuple[str, ...], nodes: tuple[str, ...], overwrite: bool, as_json: bool
) -> None:
    """TLS certificates and SuperNode keys for a Flower deployment (extra: fl), files mode 0600."""
    from ..flower.tls import write_node_key, write_tls_certificates

    if not hosts and not nodes:
        raise click.UsageError("give --host (TLS certificates) and/or --node (SuperNode keys)")
    info: dict[str, Any] = {}
    if hosts:
        info.update(
            {
                k: str(v)
                for k, v in write_tls_certificates(folder, list(hosts), overwrite=overwrite).items()
            }
        )
    for name in nodes:
        private, public = write_node_key(folder, name, overwrite=overwrite)
        info[name] = {"private": str(private), "public": str(public)}
    click.echo(json.dumps(info) if as_json else "\n".join(f"{k:15s} {v}" for k, v in info.items()))
