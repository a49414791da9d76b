"""``immersion siml``: run (all in one process), encode (user), serve (service), decode (user)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click
from immersion.cli.params import SEED, FiniteFloatRange, json_safe

from .models import MODEL_NAMES

DEFAULT_LR = {"adam": 0.001, "sgd": 0.05}

MODEL_HELP = (
    "Seed 002 Table I model (mlp64, nn-x2, cnn; digits-sized on digits), or your own as "
    "package.module:function returning a float64 torch.nn.Module (called with no arguments "
    "under torch.manual_seed(--seed): its weights are the initial ones)."
)
DATASET_HELP = (
    "digits, digits28, mnist:PATH, fashion:PATH, or your own as package.module:function "
    "returning (X, Y) or (X, Y, X_test, Y_test): X (N, ...) real, Y integer labels (N,) or "
    "probability rows (N, C)."
)


def _model_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from immersion.imports import is_import_path

    if value in MODEL_NAMES or is_import_path(value):
        return value
    raise click.BadParameter(
        f"{value!r}: expected {', '.join(MODEL_NAMES)} or package.module:function"
    )


def _plan_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--model", default="mlp64", show_default=True, callback=_model_name, help=MODEL_HELP
        ),
        click.option(
            "--optimizer", type=click.Choice(["sgd", "adam"]), default="adam", show_default=True
        ),
        click.option(
            "--lr",
            type=FiniteFloatRange(min=0, min_open=True),
            default=None,
            help="Learning rate [default: 0.001 for adam (the paper's), 0.05 for sgd].",
        ),
        click.option(
            "--epochs",
            type=click.IntRange(1),
            default=10,
            show_default=True,
            help="T (the paper: 50).",
        ),
        click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True),
        click.option(
            "--sync",
            type=click.Choice(["epoch", "batch"]),
            default="epoch",
            show_default=True,
            help="One target step per epoch (eq. 39's t) or per mini-batch (eqs. 40-41).",
        ),
        click.option("--dataset", default="digits", show_default=True, help=DATASET_HELP),
        click.option(
            "--epsilon-data",
            type=FiniteFloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
            help="Per-element DP target of each encoded sample (Theorem 1).",
        ),
        click.option(
            "--epsilon-model",
            type=FiniteFloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
            help="Per-element DP target of the encoded model (Theorem 1).",
        ),
        click.option(
            "--sensitivity-data",
            type=FiniteFloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
            help="L1 sensitivity of one sample (the paper's Delta^D).",
        ),
        click.option(
            "--sensitivity-model",
            type=FiniteFloatRange(min=0, min_open=True),
            default=1000.0,
            show_default=True,
            help="L1 sensitivity of the model (the paper's Delta^w = C).",
        ),
        click.option(
            "--keys",
            "key_kind",
            type=click.Choice(["auto", "dense", "block"]),
            default="auto",
            show_default=True,
        ),
        click.option(
            "--seed",
            type=SEED,
            default=0,
            show_default=True,
            help="Keys, noise, initial weights and batch order.",
        ),
        click.option(
            "--arithmetic",
            type=click.Choice(["float", "modular"]),
            default="float",
            show_default=True,
            help="float: seed 002's float64 coding (epsilon traded for precision); modular: "
            "fixed-point integers modulo 2^64, noise uniform (per-element epsilon 0), the "
            "decoded model bit-identical to fixed-point plain training.",
        ),
        click.option(
            "--fraction-bits",
            type=click.IntRange(0, 62),
            default=None,
            help="Fixed-point fraction bits f under --arithmetic modular (q(v) = round(v 2^f); "
            "magnitudes below 2^(63-f)) [default: 32].",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _plan_and_design(
    optimizer: str,
    lr: float | None,
    epochs: int,
    batch_size: int,
    sync: str,
    seed: int,
    epsilon_data: float,
    epsilon_model: float,
    sensitivity_data: float,
    sensitivity_model: float,
    key_kind: str,
    arithmetic: str = "float",
    fraction_bits: int | None = None,
) -> tuple[Any, Any]:
    from .dynamics import TrainingPlan
    from .job import FLOAT_ONLY, PrivacyDesign

    floats = {
        "epsilon_data": epsilon_data,
        "epsilon_model": epsilon_model,
        "sensitivity_data": sensitivity_data,
        "sensitivity_model": sensitivity_model,
    }
    if arithmetic == "modular":
        ctx = click.get_current_context()
        for name in FLOAT_ONLY:
            if name in floats and ctx.get_parameter_source(name) not in (
                click.core.ParameterSource.DEFAULT,
                None,
            ):
                option = "--" + name.replace("_", "-")
                raise click.UsageError(
                    f"{option} applies to --arithmetic float only: modular coding draws noise "
                    "uniform modulo 2^64 (per-element epsilon 0)"
                )
        floats = {}

    plan = TrainingPlan(
        optimizer=optimizer,
        lr=DEFAULT_LR[optimizer] if lr is None else lr,
        epochs=epochs,
        batch_size=batch_size,
        sync=sync,
        order_seed=seed,
    )
    design = PrivacyDesign(
        **floats, keys=key_kind, arithmetic=arithmetic, fraction_bits=fraction_bits
    )
    return plan, design


def _progress(message: str) -> None:
    click.echo(f"[siml] {message}", err=True)


@click.group("siml")
def siml_group() -> None:
    """Privacy-preserving training service by immersion (seed 002 SIML)."""


@siml_group.command("run")
@_plan_options
@click.option(
    "--compare-plain/--no-compare-plain",
    default=True,
    show_default=True,
    help="Also train plainly on the same data, weights and batch order, and compare every epoch.",
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write siml_sample.png (Fig. 2) and siml_accuracy.png (Fig. 3) here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def run_cmd(
    model: str,
    optimizer: str,
    lr: float | None,
    epochs: int,
    batch_size: int,
    sync: str,
    dataset: str,
    epsilon_data: float,
    epsilon_model: float,
    sensitivity_data: float,
    sensitivity_model: float,
    key_kind: str,
    seed: int,
    arithmetic: str,
    fraction_bits: int | None,
    compare_plain: bool,
    plot_dir: Path | None,
    as_json: bool,
) -> None:
    """Encode a dataset, train it with the target optimizer, decode the model, compare with
    plain training."""
    from .inputs import load_data
    from .run import run_siml

    plan, design = _plan_and_design(
        optimizer,
        lr,
        epochs,
        batch_size,
        sync,
        seed,
        epsilon_data,
        epsilon_model,
        sensitivity_data,
        sensitivity_model,
        key_kind,
        arithmetic,
        fraction_bits,
    )
    result = run_siml(
        model,
        load_data(dataset, seed=seed),
        plan,
        design=design,
        init_seed=seed,
        rng=seed,
        compare_plain=compare_plain,
        progress=_progress,
    )
    out = result.summary()
    if plot_dir is not None:
        from .plots import write_siml_plots

        out["plots"] = [str(p) for p in write_siml_plots(result, plot_dir)]
    if as_json:
        click.echo(json.dumps(json_safe(out)))
        return
    click.echo(
        f"SIML {model} ({out['n_params']} -> {out['n_params_encoded']} parameters), {optimizer}, "
        f"{epochs} epochs, sync per {sync}, on {out['dataset']} "
        f"({out['n_sample']} -> {out['n_sample_encoded']} per sample)"
    )
    click.echo(
        f"  accuracy {out['accuracy']:.4f}   plain {out['accuracy_plain']:.4f}   "
        f"max |w_SIML - w_plain| {out['max_abs_diff_vs_plain']:.2e}"
    )
    click.echo(f"  training time ratio SIML / plain {out['time_ratio_vs_plain']:.2f}")
    click.echo(
        f"  epsilon per element: data {out['epsilon_data']:.3g}, model {out['epsilon_model']:.3g} "
        "(against parties without the target; the service decodes both)"
    )
    for note in ("epsilon_note", "sensitivity_note"):
        if out.get(note):
            click.echo(f"  {note}: {out[note]}")
    for p in out.get("plots", []):
        click.echo(f"  plot: {p}")


@siml_group.command("encode")
@_plan_options
@click.option(
    "--keys-out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Your secret keys (mode 0600); keep them, they decode the model.",
)
@click.option(
    "--job-out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The job file to upload to the service (encoded data, public target, plan).",
)
@click.option(
    "--secure", is_flag=True, help="Draw keys and noise from OS entropy (ignores --seed for them)."
)
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
def encode_cmd(
    model: str,
    optimizer: str,
    lr: float | None,
    epochs: int,
    batch_size: int,
    sync: str,
    dataset: str,
    epsilon_data: float,
    epsilon_model: float,
    sensitivity_data: float,
    sensitivity_model: float,
    key_kind: str,
    seed: int,
    arithmetic: str,
    fraction_bits: int | None,
    keys_out: Path,
    job_out: Path,
    secure: bool,
    force: bool,
) -> None:
    """User side: encode the training set and the initial model into a job file for the service."""
    import torch
    from immersion import save_keys

    from .inputs import load_data
    from .job import prepare_job, save_job

    plan, design = _plan_and_design(
        optimizer,
        lr,
        epochs,
        batch_size,
        sync,
        seed,
        epsilon_data,
        epsilon_model,
        sensitivity_data,
        sensitivity_model,
        key_kind,
        arithmetic,
        fraction_bits,
    )
    for option, path in (("--keys-out", keys_out), ("--job-out", job_out)):
        if path.exists() and not force:
            raise click.UsageError(f"{option}: {path} exists; pass --force to replace it")
        if (
            not path.parent.is_dir()
        ):  # checked before anything is written: no keys without their job file
            raise click.UsageError(f"{option}: folder {path.parent} does not exist")
    data = load_data(dataset, seed=seed)
    user, job, _ = prepare_job(
        model,
        torch.as_tensor(data.x_train),
        torch.as_tensor(data.y_train),
        plan,
        design=design,
        init_seed=seed,
        rng=None if secure else seed,
        secure=secure,
        n_classes=getattr(data, "n_classes", None),
    )
    save_keys(user.keys, keys_out, overwrite=force)
    save_job(job, job_out, overwrite=force)
    report = user.report()
    click.echo(
        f"wrote {job_out} ({job.encoded_dataset.shape[0]} encoded samples) and {keys_out}; "
        f"epsilon per element: data {report.epsilon_input:.3g}, model {report.epsilon_output:.3g}",
        err=True,
    )


@siml_group.command("serve")
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the encoded model w~*.",
)
@click.option("--device", default=None, help="torch device for training (cpu, cuda).")
@click.option(
    "--allow-model",
    "allowed_models",
    multiple=True,
    metavar="PACKAGE.MODULE:FUNCTION",
    help="A user's model builder this service may import and run (repeatable); a job naming "
    "user code that is not allowed is refused. The code must be installed here.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def serve_cmd(
    job_file: Path,
    out_file: Path,
    device: str | None,
    allowed_models: tuple[str, ...],
    force: bool,
) -> None:
    """Service side: train a job file with the target optimizer (eq. 44) and write the encoded
    model."""
    import time

    import torch

    from .job import load_job, save_encoded_model

    job = load_job(job_file)
    if out_file.exists() and not force:
        raise click.UsageError(f"{out_file} exists; pass --force to replace it")
    if not out_file.parent.is_dir():  # checked before training, not after
        raise click.UsageError(f"--out: folder {out_file.parent} does not exist")
    target = job.target(device=device, allowed_models=allowed_models)
    be = target.backend
    epochs = job.plan.epochs
    start = time.perf_counter()
    as_input = (lambda a: a) if target.modular else be.asarray
    encoded_model, _ = target.train(
        as_input(job.encoded_state),
        as_input(job.encoded_dataset),
        job.plan,
        on_epoch=lambda e, _x: _progress(f"epoch {e + 1}/{epochs}"),
    )
    seconds = time.perf_counter() - start
    info = {
        "model": job.model,
        "epochs": epochs,
        "train_seconds": seconds,
        "optimizer": job.plan.optimizer,
    }
    save_encoded_model(
        encoded_model if target.modular else torch.as_tensor(encoded_model).cpu().numpy(),
        out_file,
        info=info,
        overwrite=force,
    )
    click.echo(f"wrote {out_file} after {seconds:.1f} s of training", err=True)


@siml_group.command("decode")
@click.option("--keys", "keys_file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option(
    "--job",
    "job_file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The job file you uploaded (its first encoded sample unmasks the model).",
)
@click.option(
    "--model-in",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The encoded model the service returned.",
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the decoded parameter vector here (.npy).",
)
@click.option(
    "--evaluate",
    "eval_dataset",
    default=None,
    help="Report test accuracy on this dataset's test split (digits, ..., or your "
    "package.module:function returning (X, Y, X_test, Y_test)).",
)
@click.option(
    "--seed", type=SEED, default=0, show_default=True, help="Dataset split seed for --evaluate."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def decode_cmd(
    keys_file: Path,
    job_file: Path,
    model_in: Path,
    out_file: Path | None,
    eval_dataset: str | None,
    seed: int,
    as_json: bool,
) -> None:
    """User side: decode the service's encoded model with your keys (eq. 45)."""
    import numpy as np
    import torch
    from immersion import load_keys

    from .job import decode_model, key_holder, load_encoded_model, load_job

    keys, job = load_keys(keys_file), load_job(job_file)
    encoded_model, info = load_encoded_model(model_in)
    user = key_holder(keys, job)
    target = user.target
    as_input = (lambda a: a) if job.fraction_bits is not None else torch.as_tensor
    w = decode_model(user, as_input(encoded_model), as_input(job.encoded_dataset[0]))
    out: dict[str, Any] = {"model": job.model, "n_params": int(w.shape[0]), **info}
    if out_file is not None:
        np.save(out_file, w.numpy())
        out["decoded_model"] = str(out_file)
    if eval_dataset is not None:
        from .inputs import load_data

        data = load_data(eval_dataset, seed=seed)
        if data.x_test is None:
            raise click.UsageError(f"--evaluate: {eval_dataset} returned no test split")
        out["accuracy"] = target.dynamics.model.accuracy(
            w, torch.as_tensor(data.x_test, dtype=torch.float64), torch.as_tensor(data.y_test)
        )
    click.echo(json.dumps(out) if as_json else "\n".join(f"{k:14s} {v}" for k, v in out.items()))


@click.command("siml")
@click.option(
    "--model",
    default="nn-x2",
    show_default=True,
    callback=_model_name,
    help=MODEL_HELP + " CKKS runs on nn-x2 only; DP-SGD on the SDK's models only.",
)
@click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="adam", show_default=True)
@click.option(
    "--lr",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="[default: 0.001 for adam, 0.05 for sgd]",
)
@click.option("--epochs", type=click.IntRange(1), default=10, show_default=True)
@click.option("--batch-size", type=click.IntRange(1), default=32, show_default=True)
@click.option(
    "--sync",
    type=click.Choice(["epoch", "batch"]),
    default="epoch",
    show_default=True,
    help="SIML's headline sync (both are measured).",
)
@click.option("--dataset", default="digits", show_default=True, help=DATASET_HELP)
@click.option(
    "--delta",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=1e-5,
    show_default=True,
    help="DP-SGD's delta.",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--ckks-samples", type=click.IntRange(1), default=4, show_default=True)
@click.option("--no-baselines", is_flag=True, help="Plain and SIML only.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_siml_cmd(
    model: str,
    optimizer: str,
    lr: float | None,
    epochs: int,
    batch_size: int,
    sync: str,
    dataset: str,
    delta: float,
    repeats: int,
    ckks_samples: int,
    no_baselines: bool,
    seed: int,
    out_file: Path | None,
    as_json: bool,
) -> None:
    """Plain, SIML, Opacus DP-SGD (epsilon 0.1, 0.6, 2, 10) and CKKS on one model and dataset."""
    from .bench import bench_siml
    from .dynamics import TrainingPlan
    from .inputs import load_data

    plan = TrainingPlan(
        optimizer=optimizer,
        lr=DEFAULT_LR[optimizer] if lr is None else lr,
        epochs=epochs,
        batch_size=batch_size,
        sync=sync,
        order_seed=seed,
    )
    result = bench_siml(
        model=model,
        dataset=load_data(dataset, seed=seed),
        plan=plan,
        delta=delta,
        repeats=repeats,
        ckks_samples=ckks_samples,
        seed=seed,
        baselines=not no_baselines,
        progress=lambda msg: click.echo(f"[bench] {msg}", err=True),
    )
    text = json.dumps(json_safe(result))
    if out_file is not None:
        out_file.write_text(text + "\n")
    if as_json:
        click.echo(text)
        return
    click.echo(f"{model} on {result['dataset']}, {optimizer}, {epochs} epochs")
    click.echo(
        f"  plain accuracy {result['accuracy_plain']:.4f}, SIML {result['accuracy_siml']:.4f}, "
        f"max |w_SIML - w_plain| {result['siml_max_abs_diff_vs_plain']:.2e}"
    )
    for row in result["siml_by_sync"]:
        click.echo(
            f"  SIML / plain time ({row['sync']} sync): {row['time_ratio']:.2f} "
            f"(/ a torch loop of the same module: {row['time_ratio_vs_torch']:.2f})"
        )
    for row in result["dpsgd"]:
        click.echo(
            f"  DP-SGD epsilon {row['epsilon']:>4}: accuracy {row['accuracy']:.4f}, "
            f"time / plain torch {row['time_ratio']:.2f}"
        )
    if result["ckks_time_ratio_vs_siml"] is not None:
        click.echo(f"  CKKS (extrapolated) / SIML time: {result['ckks_time_ratio_vs_siml']:.0f}")
    for note in result["skipped"]:
        click.echo(f"  skipped {note}")
