"""``immersion bench core|codec|remote|control``: side-by-side benchmarks
(:mod:`immersion.bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .groups import CommandGroup
from .params import FiniteFloatRange, json_safe


@click.group("bench", cls=CommandGroup)
def bench() -> None:
    """Side-by-side benchmarks that print ratios."""


@bench.command("core")
@click.option("--steps", type=click.IntRange(5), default=200, show_default=True)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--quick", is_flag=True, help="Only n_state 3 and 100 (a smoke run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_core_cmd(steps: int, repeats: int, quick: bool, as_json: bool) -> None:
    """encode + target + decode per step versus plain f, g (n_state 3, 100, 1000, 100000 block).

    For block keys it also times the structured transforms (``Q v``, ``Q^T x``) inside the step:
    their share of it, and their time over a numpy copy of the bytes they read (1 = streaming the
    keys at copy speed).
    """
    from ..bench.core import DEFAULT_SIZES, bench_core

    sizes = DEFAULT_SIZES[:2] if quick else DEFAULT_SIZES
    result = bench_core(
        sizes=sizes,
        steps=steps,
        repeats=repeats,
        progress=lambda msg: click.echo(f"[bench] {msg}", err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    header = "n_state keys workload plain_us immersed_us ratio key_MB Q_share Q/copy".split()
    widths = (8, 6, 13, 10, 12, 8, 8, 8, 9)
    click.echo(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    for r in result["results"]:
        q = r["transforms"]  # block keys: the transforms' share and their time over a copy's
        click.echo(
            f"{r['n_state']:>8} {r['keys']:>6} {r['workload']:>13} "
            f"{r['plain_step_s'] * 1e6:>10.1f} {r['immersed_step_s'] * 1e6:>12.1f} "
            f"{r['step_time_ratio']:>8.2f} {r['key_bytes'] / 1e6:>8.2f} "
            + (
                f"{q['transform_share']:>8.0%} {q['transform_over_copy']:>9.2f}"
                if q
                else f"{'-':>8} {'-':>9}"
            )
        )


@bench.command("codec")
@click.option("--repeats", type=click.IntRange(1), default=7, show_default=True)
@click.option("--quick", is_flag=True, help="Only n = 199,210 (a smoke run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_codec_cmd(repeats: int, quick: bool, as_json: bool) -> None:
    """Modular codec (integers mod 2^64) versus float codec: encode + decode of one flat vector."""
    from ..bench.core import CODEC_SIZES, bench_codec

    result = bench_codec(
        sizes=CODEC_SIZES[:1] if quick else CODEC_SIZES,
        repeats=repeats,
        progress=lambda msg: click.echo(f"[bench] {msg}", err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{'n':>10} {'float ms':>9} {'modular ms':>11} {'ratio':>6} {'key MB':>7}")
    for r in result["results"]:
        click.echo(
            f"{r['n']:>10} {r['float_round_trip_s'] * 1e3:>9.2f} "
            f"{r['modular_round_trip_s'] * 1e3:>11.2f} {r['modular_over_float']:>6.2f} "
            f"{r['modular_key_bytes'] / 1e6:>7.1f}"
        )


#: ``--out PATH`` of the benchmark commands (:func:`_save_json` writes it).
_json_out = click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON object to this file (its folder is created).",
)


def _save_json(out_path: Path | None, result: dict) -> None:
    """Write a benchmark's JSON object to ``--out`` (nothing without it)."""
    if out_path is None:
        return
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(json_safe(result), indent=1) + "\n")
    click.echo(f"[bench] saved {out_path}", err=True)


def _int_list(option: str, text: str) -> tuple[int, ...]:
    """``"10,64,128"`` as integers, or an error naming ``option``."""
    from ..errors import InvalidArgumentError

    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidArgumentError(
            option, f"expected comma-separated integers, got {text!r}"
        ) from None


@bench.command("remote")
@click.option("--plants", type=click.IntRange(1), default=50, show_default=True)
@click.option("--samples", type=click.IntRange(1), default=2000, show_default=True)
@click.option(
    "--algorithm",
    default="reactor-controller",
    show_default=True,
    help="A registered algorithm (immersion plugins).",
)
@click.option(
    "--coding",
    type=click.Choice(["immersion", "lwe"]),
    default="immersion",
    show_default=True,
    help="lwe: the encrypted four-tank loop (gains encrypted, history kept by the server), "
    "remote beside local (not --plants, --algorithm).",
)
@click.option(
    "--precision",
    "precisions",
    default="1e-4",
    show_default=True,
    help="--coding lwe: the precision= of each row (comma-separated).",
)
@click.option("--workers", type=click.IntRange(0), default=2, show_default=True)
@click.option("--no-curve", is_flag=True, help="Plain loopback transport instead of CurveZMQ.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_json_out
@click.pass_context
def bench_remote_cmd(
    ctx: click.Context,
    plants: int,
    samples: int,
    algorithm: str,
    coding: str,
    precisions: str,
    workers: int,
    no_curve: bool,
    seed: int,
    as_json: bool,
    out_path: Path | None,
) -> None:
    """Concurrent plants against one `immersion serve`: exactness, round trips, ratios.

    With --coding lwe: the encrypted four-tank loop through the server (which keeps the encrypted
    history) and with the local target, side by side (round-trip percentiles, bytes each way per
    sample, ratio remote / local).
    """
    from ..bench.remote import bench_remote, bench_remote_lwe
    from ..errors import InvalidArgumentError

    say = lambda msg: click.echo(f"[bench] {msg}", err=True)  # noqa: E731
    explicit = {
        name
        for name in ("plants", "algorithm", "precisions")
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    }
    if coding == "lwe":
        if explicit & {"plants", "algorithm"}:
            name = sorted(explicit & {"plants", "algorithm"})[0]
            raise InvalidArgumentError(
                f"--{name}", "applies to --coding immersion (--coding lwe runs one LQG plant)"
            )
        try:
            values = tuple(float(p) for p in precisions.split(","))
        except ValueError:
            values = ()
        if not values or any(not 0 < p < 1 for p in values):
            raise InvalidArgumentError(
                "--precision", f"expected numbers in (0, 1), comma-separated, got {precisions!r}"
            )
        result = bench_remote_lwe(
            samples=samples,
            precisions=values,
            workers=workers,
            curve=not no_curve,
            seed=seed,
            progress=say,
        )
    else:
        if "precisions" in explicit:
            raise InvalidArgumentError("--precision", "applies to --coding lwe only")
        result = bench_remote(
            plants=plants,
            samples=samples,
            algorithm=algorithm,
            workers=workers,
            curve=not no_curve,
            seed=seed,
            progress=say,
        )
    _save_json(out_path, result)
    if as_json:
        click.echo(json.dumps(result))
        return
    for key, value in result.items():
        click.echo(f"{key:42s} {value}")


@bench.command("control")
@click.option("--steps", type=click.IntRange(10), default=1000, show_default=True)
@click.option(
    "--precision",
    type=FiniteFloatRange(1e-12, 0.5),
    default=1e-4,
    show_default=True,
    help="One-step error of u allowed, relative to output_range (it picks the ring).",
)
@click.option(
    "--eclib-dims",
    default="2,4,8",
    show_default=True,
    help="LWE dimensions of ECLib's GSW-LWE controller, ascending, while the budget lasts "
    "(comma-separated; '' for none).",
)
@click.option(
    "--eclib-budget",
    type=FiniteFloatRange(0.0, 3600),
    default=150.0,
    show_default=True,
    help="Seconds ECLib may take in all (its GSW set-up dominates).",
)
@click.option("--quick", is_flag=True, help="100 steps, 50 per frontier point, ECLib at n = 2.")
@_json_out
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_control_cmd(
    steps: int,
    precision: float,
    eclib_dims: str,
    eclib_budget: float,
    quick: bool,
    out_path: Path | None,
    as_json: bool,
) -> None:
    """CDSL's four-tank controller encrypted (gains too): plant offline, plant online and cloud
    time per sample, bytes, the precision frontier, the order sweep, plain and ECLib beside."""
    from ..bench.control import bench_control
    from ..errors import InvalidArgumentError

    dims = _int_list("--eclib-dims", eclib_dims)
    if any(d < 2 for d in dims) or list(dims) != sorted(dims):
        raise InvalidArgumentError(
            "--eclib-dims", f"expected ascending dimensions >= 2, got {dims}"
        )
    frontier_steps = order_steps = 200
    if quick:
        steps, frontier_steps, order_steps, dims = 100, 50, 50, dims[:1]
    result = bench_control(
        steps=steps,
        precision=precision,
        frontier_steps=frontier_steps,
        order_steps=order_steps,
        eclib_dimensions=tuple(dims),
        eclib_budget_s=eclib_budget,
        progress=lambda msg: click.echo(f"[bench] {msg}", err=True),
    )
    _save_json(out_path, result)
    if as_json:
        click.echo(json.dumps(json_safe(result)))
        return
    row = result["lwe"]
    us = 1e6
    click.echo(f"{result['controller']}, {steps} samples")
    click.echo(f"  plain controller          {result['plain_s'] * us:10.1f} us")
    click.echo(
        f"  encrypted (N={row['degree']}, log2 Q={row['modulus_bits']}, 128-bit)  "
        f"total {row['total_s'] * us:.0f} us = plant offline {row['plant_offline_s'] * us:.0f} "
        f"+ plant online {row['plant_online_s'] * us:.0f} + cloud {row['cloud_s'] * us:.0f}; "
        f"x{result['ratio_lwe_total_over_plain']:.0f} plain"
    )
    click.echo(
        f"  bytes up/down {row['bytes_up']}/{row['bytes_down']}; precision proven "
        f"{row['precision_proven']:.1e}, measured one-step {row['one_step_error_measured']:.1e}; "
        f"twin bit-identical: {row['bit_identical_to_twin']}"
    )
    for point in result["frontier"]:
        if "refused" in point:
            click.echo(f"  precision {point['requested']:g}: refused")
            continue
        click.echo(
            f"  precision {point['requested']:g}: N={point['degree']}, proven "
            f"{point['precision_proven']:.1e}, {point['total_s'] * us:.0f} us per sample"
        )
    for o in result["orders"]:
        click.echo(
            f"  {o['n_state']} states: plant {o['plant_s'] * us:.0f} us, cloud "
            f"{o['cloud_s'] * us:.0f} us"
        )
    for e in result["eclib_gsw_lwe"]:
        click.echo(
            f"  ECLib GSW-LWE n={e['dimension']}: {e['total_s'] * 1e3:.1f} ms per sample "
            f"(set-up {e['setup_s']:.0f} s)"
        )
    if result["note"]:
        click.echo(f"  {result['note']}")
