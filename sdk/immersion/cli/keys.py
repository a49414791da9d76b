"""``immersion keys new|curve|inspect`` and ``immersion report``: the commands that draw keys and
report their privacy and precision (their shared options: ``_key_options``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .groups import CommandGroup
from .params import FiniteFloatRange, json_safe


def _key_options(fn: Any) -> Any:
    """Options of ``report`` and ``keys new``: dimensions, privacy targets, key kind, seed."""
    options = [
        click.option("--n-state", type=click.IntRange(1), required=True),
        click.option("--n-input", type=click.IntRange(1), required=True),
        click.option("--n-output", type=click.IntRange(1), required=True),
        click.option("--extra-state", type=click.IntRange(1), default=1, show_default=True),
        click.option("--extra-input", type=click.IntRange(1), default=2, show_default=True),
        click.option("--extra-output", type=click.IntRange(1), default=2, show_default=True),
        click.option(
            "--epsilon-input",
            type=click.FloatRange(min=0, min_open=True),
            default=1e-3,
            show_default=True,
        ),
        click.option(
            "--epsilon-output",
            type=click.FloatRange(min=0, min_open=True),
            default=1e-3,
            show_default=True,
        ),
        click.option(
            "--sensitivity-input",
            type=click.FloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
        ),
        click.option(
            "--sensitivity-output",
            type=click.FloatRange(min=0, min_open=True),
            default=1.0,
            show_default=True,
        ),
        click.option(
            "--noise",
            type=click.Choice(["laplace", "gaussian"]),
            default="laplace",
            show_default=True,
        ),
        click.option(
            "--keys",
            "key_kind",
            type=click.Choice(["auto", "dense", "block"]),
            default="auto",
            show_default=True,
        ),
        click.option("--block-size", type=click.IntRange(1), default=32, show_default=True),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _draw(params: dict[str, Any], rng: Any, secure: bool = False) -> Any:
    from ..coding.factory import draw_keys

    names = ("n_state", "n_input", "n_output")
    options = {
        k: params[k]
        for k in (
            "extra_state",
            "extra_input",
            "extra_output",
            "epsilon_input",
            "epsilon_output",
            "sensitivity_input",
            "sensitivity_output",
            "noise",
            "block_size",
        )
    }
    return draw_keys(
        *(params[k] for k in names), keys=params["key_kind"], rng=rng, secure=secure, **options
    )


@click.command("report")
@_key_options
@click.option(
    "--dtype", type=click.Choice(["float64", "float32"]), default="float64", show_default=True
)
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Compose over this many steps.",
)
@click.option(
    "--delta",
    type=FiniteFloatRange(0, 1, max_open=True),
    default=1e-6,
    show_default=True,
    help="Delta for the composition (0 <= delta < 1).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def report_cmd(
    dtype: str, steps: int, delta: float, seed: int, as_json: bool, **params: Any
) -> None:
    """Privacy and precision report for a configuration (keys drawn; unit-gain f, g, not run)."""
    import numpy as np

    from ..privacy import privacy_report

    keys = _draw(params, seed)
    report = privacy_report(keys, unit_roundoff=float(np.finfo(dtype).eps) / 2, dtype=dtype)
    out = report.as_dict()
    if steps > 1:
        out["composed"] = {"steps": steps, **report.composed(steps, delta=delta)}
    out["keys"] = repr(keys)
    if as_json:  # strict JSON: an infinite figure (e.g. no guarantee) is null
        click.echo(json.dumps(json_safe(out)))
        return
    for key, value in out.items():
        click.echo(f"{key:28s} {value}")


@click.group("keys", cls=CommandGroup)
def keys_group() -> None:
    """Create and inspect key files."""


@keys_group.command("new")
@_key_options
@click.option(
    "--out",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Key file to write (mode 0600).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@click.option("--seed", type=int, default=None, help="Reproducible keys (default: OS entropy).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def keys_new(path: Path, overwrite: bool, seed: int | None, as_json: bool, **params: Any) -> None:
    """Draw keys with a designed noise law and save them; use with immerse(keys=load_keys(FILE))."""
    from ..keys import save_keys

    keys = _draw(params, seed, secure=seed is None)
    save_keys(keys, path, overwrite=overwrite)
    info = {
        "path": str(path),
        "fingerprint": keys.fingerprint,
        "kind": keys.kind,
        **keys.dims,
        "noise": keys.noise_kind,
        "noise_scale": keys.noise_scale,
        "bytes": keys.nbytes,
    }
    click.echo(json.dumps(info) if as_json else "\n".join(f"{k:14s} {v}" for k, v in info.items()))


@keys_group.command("curve")
@click.option(
    "--out",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for NAME.key and NAME.key_secret (created 0700 if missing).",
)
@click.option("--name", default="server", show_default=True, help="File stem, e.g. plant-1.")
@click.option("--overwrite", is_flag=True, help="Replace existing files of that name.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def keys_curve(folder: Path, name: str, overwrite: bool, as_json: bool) -> None:
    """Draw a CurveZMQ key pair for `immersion serve` or one of its clients (files mode 0600)."""
    from ..remote.curve import load_curve_secret, new_curve_keys

    public, secret = new_curve_keys(folder, name, overwrite=overwrite)
    info = {
        "public": str(public),
        "secret": str(secret),
        "public_key": load_curve_secret(secret, name="secret").public.decode(),
    }
    click.echo(json.dumps(info) if as_json else "\n".join(f"{k:10s} {v}" for k, v in info.items()))


@keys_group.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def keys_inspect(path: Path, as_json: bool) -> None:
    """Check a key file's integrity and print its shapes and fingerprint (never the keys)."""
    from ..keys import load_keys

    keys = load_keys(path)
    info = {
        "fingerprint": keys.fingerprint,
        "kind": keys.kind,
        **keys.dims,
        "noise": keys.noise_kind,
        "noise_scale": keys.noise_scale,
        "bytes": keys.nbytes,
    }
    click.echo(json.dumps(info) if as_json else "\n".join(f"{k:14s} {v}" for k, v in info.items()))
