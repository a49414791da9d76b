"""``immersion demo reactor``: the seed 002 SI-NCS case study, plain and immersed side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
from immersion.cli.params import FiniteFloatRange

#: Parameters eqs. 47-48 divide by.
_DIVISORS = ("theta1", "theta2", "V1", "V2")


def _parameters(overrides: tuple[str, ...]) -> Any:
    """``ReactorParameters`` with ``NAME=VALUE`` overrides (``x1_0``, ``x2_0``: initial state)."""
    import dataclasses

    from .model import ReactorParameters

    fields = {f.name for f in dataclasses.fields(ReactorParameters)} - {"initial_state"}
    values: dict[str, float] = {}
    for item in overrides:
        name, sep, raw = item.partition("=")
        if not sep or (name not in fields and name not in ("x1_0", "x2_0")):
            raise click.BadParameter(
                f"{item!r}: expected NAME=VALUE with NAME in {sorted(fields | {'x1_0', 'x2_0'})}",
                param_hint="--set",
            )
        try:
            values[name] = float(raw)
        except ValueError:
            raise click.BadParameter(
                f"{item!r}: {raw!r} is not a number", param_hint="--set"
            ) from None
        if not math.isfinite(values[name]) or (name in _DIVISORS and values[name] == 0):
            raise click.BadParameter(
                f"{item!r}: expected a finite number{' other than 0' * (name in _DIVISORS)}",
                param_hint="--set",
            )
    defaults = ReactorParameters()
    initial = (
        values.pop("x1_0", defaults.initial_state[0]),
        values.pop("x2_0", defaults.initial_state[1]),
    )
    return ReactorParameters(initial_state=initial, **values)


def _remote_factory(
    address: str, dt: float, timeout_s: float, keys: dict[str, Any], opened: list[Any]
) -> Any:
    from immersion.remote.client import RemoteTarget

    def factory(imm: Any) -> Any:
        cloud = RemoteTarget(
            address,
            imm,
            algorithm="reactor-controller",
            params={"dt": dt},
            timeout_s=timeout_s,
            **keys,
        )
        opened.append(cloud)
        return cloud

    return factory


@click.command("reactor")
@click.option(
    "--steps",
    type=click.IntRange(1),
    default=2000,
    show_default=True,
    help="Controller samples (2000 = 20 s at dt 0.01).",
)
@click.option(
    "--dt",
    type=FiniteFloatRange(min=0, min_open=True, max=1.0),
    default=0.01,
    show_default=True,
    help="Sampling period h of the controller [s].",
)
@click.option(
    "--substeps",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Plant Euler sub-steps per sample.",
)
@click.option(
    "--epsilon-input", type=FiniteFloatRange(min=0, min_open=True), default=1e-3, show_default=True
)
@click.option(
    "--epsilon-output", type=FiniteFloatRange(min=0, min_open=True), default=1e-3, show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write the PNGs of Figs. 8-12 into this folder.",
)
@click.option(
    "--remote",
    is_flag=True,
    help="Run the cloud side in a separate `immersion serve` process (loopback).",
)
@click.option(
    "--connect",
    default=None,
    metavar="ADDRESS",
    help="Use an `immersion serve` already running at ADDRESS (e.g. tcp://10.0.0.5:5555).",
)
@click.option(
    "--server-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --connect: the server's public NAME.key (CurveZMQ; needed beyond loopback).",
)
@click.option(
    "--client-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --connect: this client's NAME.key_secret, listed in the server's --clients.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a plant parameter of eqs. 47-48, e.g. --set theta1=3 --set x1_0=-0.2.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def reactor_command(
    steps: int,
    dt: float,
    substeps: int,
    epsilon_input: float,
    epsilon_output: float,
    seed: int,
    plot_dir: Path | None,
    remote: bool,
    connect: str | None,
    server_key: Path | None,
    client_key: Path | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Two-stage reactor with delayed recycle, its adaptive controller run through immerse(f, g)."""
    from .simulation import run_reactor, summary

    params = _parameters(overrides)
    if connect is not None and "://" not in connect:
        raise click.BadParameter(
            f"{connect!r}: expected a ZeroMQ address such as tcp://HOST:PORT",
            param_hint="--connect",
        )

    if (server_key is not None or client_key is not None) and connect is None:
        raise click.BadParameter("keys go with --connect ADDRESS", param_hint="--server-key")
    server = None
    address = connect
    if remote and connect is None:
        from immersion.remote.process import ServerProcess

        server = ServerProcess("tcp://127.0.0.1:*")  # loopback: no keys needed
        address = server.address
    opened: list[Any] = []
    try:
        keys = {"server_key": server_key, "client_key": client_key}
        factory = None if address is None else _remote_factory(address, dt, 30.0, keys, opened)
        run = run_reactor(
            steps=steps,
            dt=dt,
            substeps=substeps,
            epsilon_input=epsilon_input,
            epsilon_output=epsilon_output,
            seed=seed,
            params=params,
            cloud_factory=factory,
        )
    finally:
        for cloud in opened:
            cloud.close()  # ends the session on the server
        if server is not None:
            server.stop()  # SIGTERM: the server answers what is in flight and exits 0
    result = summary(run, remote=address is not None)
    if address is not None:
        result["address"] = address
    if plot_dir is not None:
        from .plots import write_plots

        result["plots"] = [str(p) for p in write_plots(run, plot_dir)]
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(
        f"Two-stage reactor, {result['steps']} samples of {dt} s, plain vs immersed controller"
        + (f" (cloud at {address})" if address else "")
    )
    headings = {
        "drift_max_abs_u": "drift of the decoded closed loop against its plain twin over the run "
        "(measured, no bound claimed):",
        "decode_error_estimate": "rounding of each single decode (exact error against its "
        "rigorous bound), after the probe-point estimate of a whole step (decode_error_note):",
        "step_time_ratio": "time per step:",
    }
    for key, value in result.items():
        if key in headings:
            click.echo(f"  {headings[key]}")
        if key not in ("steps", "keys", "plots", "remote", "address"):
            click.echo(
                f"  {key:32s} {value:.4g}" if isinstance(value, float) else f"  {key:32s} {value}"
            )
    click.echo(f"  keys: {result['keys']}")
    for p in result.get("plots", []):
        click.echo(f"  plot: {p}")
