"""Command-line interface: ``immersion ...`` and ``python -m immersion ...`` (click).

``--json`` always prints exactly one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .. import __version__
from ..errors import ImmersionError
from .params import FiniteFloatRange, json_safe


class _Group(click.Group):
    """A click group that turns the SDK's own errors into a one-line message and exit code 2.

    Errors of the machine (a file that cannot be written, memory that cannot be had) get a
    one-line message and exit code 1; anything else is a bug and keeps its traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImmersionError as exc:
            raise click.UsageError(str(exc)) from None
        except (OSError, MemoryError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="immersion")
def main() -> None:
    """Privacy in cloud computing through immersion-based coding."""


@main.group(cls=_Group)
def demo() -> None:
    """Runnable demos (added by plugins)."""


@main.group(cls=_Group)
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


@main.command("serve")
@click.option(
    "--bind",
    default="tcp://127.0.0.1:5555",
    show_default=True,
    help="ZeroMQ address to listen on. Other than loopback only with --server-key and --clients.",
)
@click.option(
    "--server-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The server's NAME.key_secret (immersion keys curve): CurveZMQ on.",
)
@click.option(
    "--clients",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of the accepted clients' .key files.",
)
@click.option(
    "--admins",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder of .key files that may also ask stats and stop.",
)
@click.option("--max-sessions", type=click.IntRange(1), default=256, show_default=True)
@click.option(
    "--max-sessions-per-client",
    type=click.IntRange(1),
    default=None,
    help="Sessions one client key may hold (default: a quarter of --max-sessions).",
)
@click.option(
    "--session-idle",
    "session_idle_s",
    type=FiniteFloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="Seconds without a request after which a session ends.",
)
@click.option(
    "--max-message-bytes",
    type=click.IntRange(1024),
    default=16 * 2**20,
    show_default=True,
    help="Largest request (a frame over it closes the connection).",
)
@click.option(
    "--workers",
    type=click.IntRange(0),
    default=2,
    show_default=True,
    help="Threads for target work (0: on the socket thread).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    default=None,
    help="Open connections at once (default 1024, lowered to fit ulimit -n).",
)
@click.option(
    "--connection-rate",
    type=FiniteFloatRange(min=0, min_open=True),
    default=100.0,
    show_default=True,
    help="New connections per second from one source address (bursts of twice as many).",
)
@click.option(
    "--peer-timeout",
    "peer_timeout_s",
    type=FiniteFloatRange(min=0.02, max=86400),
    default=30.0,
    show_default=True,
    help="Seconds a peer may send nothing (heartbeats, a half-sent message) before it is cut.",
)
@click.option(
    "--handshake-timeout",
    "handshake_timeout_s",
    type=FiniteFloatRange(min=0.01, max=86400),
    default=5.0,
    show_default=True,
    help="Seconds a connection has to complete its handshake.",
)
@click.option(
    "--drain",
    "drain_s",
    type=FiniteFloatRange(min=0),
    default=5.0,
    show_default=True,
    help="On SIGTERM, the longest wait for the requests in flight (a second signal: none).",
)
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append the log lines to this file instead of stderr (best effort, never blocks).",
)
@click.option(
    "--log-every",
    "log_every_s",
    type=FiniteFloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Seconds between progress lines of the active sessions.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON log lines on stderr, final stats on stdout."
)
def serve_cmd(as_json: bool, **options: Any) -> None:
    """Run the cloud side: sessions of encoded targets, until SIGTERM/SIGINT (extra: remote).

    Exit code 0 after a stop, 70 if a thread of the service died (for a supervisor to restart
    it); stdout and stderr that fail (a closed pipe) never change it.
    """
    from ..remote.server import EXIT_THREAD_DIED, Service, ServiceFailure, serve

    try:
        summary = serve(Service(options.pop("bind"), json_log=as_json, **options))
    except ServiceFailure as failure:
        _write_quietly(sys.stderr, f"{failure}\n")
        raise SystemExit(EXIT_THREAD_DIED) from None
    if as_json:
        _write_quietly(sys.stdout, json.dumps(summary) + "\n")


def _write_quietly(stream: Any, text: str) -> None:
    """Write to stdout or stderr, ignoring a closed pipe or a full disk (the exit code stands):
    straight to the descriptor, so nothing stays buffered for a flush at exit to fail on."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (click's test runner)
        click.echo(text, file=stream, nl=False)
        return
    data = memoryview(text.encode())
    try:
        stream.flush()
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


@main.group("remote", cls=_Group)
def remote_group() -> None:
    """Ask a running `immersion serve` for its stats, or stop it (admin key)."""


def _admin_options(fn: Any) -> Any:
    options = [
        click.argument("address"),
        click.option(
            "--server-key",
            required=True,
            type=click.Path(dir_okay=False, path_type=Path),
            help="The server's public NAME.key.",
        ),
        click.option(
            "--admin-key",
            required=True,
            type=click.Path(dir_okay=False, path_type=Path),
            help="An admin's NAME.key_secret (listed in the server's --admins).",
        ),
        click.option(
            "--timeout", "timeout_s", type=FiniteFloatRange(min=0, min_open=True), default=5.0
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@remote_group.command("stats")
@_admin_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def remote_stats_cmd(
    address: str, server_key: Path, admin_key: Path, timeout_s: float, as_json: bool
) -> None:
    """Sessions, counters and latency percentiles of a running server."""
    from ..remote.client import remote_stats

    stats = remote_stats(address, server_key=server_key, admin_key=admin_key, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(stats))
        return
    for key, value in stats.items():
        if key != "per_session":
            click.echo(f"{key:20s} {value}")
    for row in stats["per_session"]:
        click.echo("  " + " ".join(f"{k}={v}" for k, v in row.items()))


@remote_group.command("stop")
@_admin_options
def remote_stop_cmd(address: str, server_key: Path, admin_key: Path, timeout_s: float) -> None:
    """Stop a running server after its requests in flight (or send it SIGTERM)."""
    from ..remote.client import stop_server

    stop_server(address, server_key=server_key, admin_key=admin_key, timeout_s=timeout_s)
    click.echo(f"{address}: stopping")


@main.command("audit")
@click.option(
    "--scheme", default=None, help="Only attacks on this scheme (e.g. immerse, sifl-m1, mpdp)."
)
@click.option("--attack", default=None, help="Only this attack (e.g. subspace).")
@click.option("--quick", is_flag=True, help="Smaller settings (a smoke run).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit_cmd(
    scheme: str | None, attack: str | None, quick: bool, seed: int, as_json: bool
) -> None:
    """Run the known attacks against each scheme and report what they measure (THREAT_MODEL.md)."""
    from ..audit.runner import run_audit

    result = run_audit(
        scheme=scheme,
        attack=attack,
        quick=quick,
        seed=seed,
        progress=lambda msg: click.echo(f"[audit] {msg}", err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    header = ("attack", "scheme", "mitigation", "metric", "value", "baseline", "verdict")
    click.echo(" | ".join(header))
    for r in result["attacks"]:
        click.echo(
            f"{r['attack']} | {r['scheme']} | {r['mitigation'] or '-'} | {r['metric']} | "
            f"{r['value']:.4g} | {r['baseline']:.4g} | {r['verdict']}"
        )


@main.command("docs")
@click.option(
    "--source", type=click.Path(path_type=Path), default=None, help="The folder of conf.py."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the HTML goes [default: SOURCE/_build/html].",
)
@click.option("--no-open", is_flag=True, help="Build only; do not open a browser.")
def docs_cmd(source: Path | None, out: Path | None, no_open: bool) -> None:
    """Build the documentation site (warnings are errors) and open it in a browser."""
    import webbrowser

    from .docsite import build_docs, find_docs_source

    folder = find_docs_source(source)
    index = build_docs(folder, out if out is not None else folder / "_build" / "html")
    click.echo(str(index))
    if not no_open:
        webbrowser.open(index.resolve().as_uri())


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plugins_cmd(as_json: bool) -> None:
    """List registered plugins, backends, algorithms and commands."""
    from ..plugins.manager import registry

    reg = registry()
    info = {
        "plugins": reg.plugin_names(),
        "backends": {k: s.description for k, s in sorted(reg.backends.items())},
        "algorithms": {k: s.description for k, s in sorted(reg.algorithms.items())},
        **{  # registrations of plugins' own hooks: immersion_fl's fl_schemes and optimizers
            hook.removeprefix("immersion_register_"): {
                k: s.description for k, s in sorted(reg.collect(hook, hook).items())
            }
            for hook in reg.plugin_hooks()
        },
        "commands": sorted(f"{c.parent} {c.name}".strip() for c in reg.commands()),
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    for section, items in info.items():
        click.echo(f"{section}:")
        for item in items.items() if isinstance(items, dict) else ((i, "") for i in items):
            click.echo(f"  {item[0]:24s} {item[1]}")


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
    from ..coding.keygen import draw_keys

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


@main.command("report")
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


@main.group("keys", cls=_Group)
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


def _mount_plugin_commands() -> None:
    from ..plugins.manager import registry

    groups = {"": main, "demo": demo, "bench": bench, "keys": keys_group}
    try:
        specs = registry().commands()
    except ImmersionError as exc:  # a broken plugin must not take the whole CLI down
        print(f"warning: plugin commands unavailable: {exc}", file=sys.stderr)
        return
    for spec in specs:
        parent = groups.get(spec.parent)
        if parent is None:
            parent = groups[spec.parent] = click.Group(spec.parent, help=f"{spec.parent} commands")
            main.add_command(parent)
        parent.add_command(spec.command, spec.name)


_mount_plugin_commands()
