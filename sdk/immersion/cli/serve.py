"""``immersion serve`` and ``immersion remote stats|stop``: the cloud side as a service
(:mod:`immersion.remote`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from .groups import CommandGroup
from .params import FiniteFloatRange


@click.command("serve")
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


@click.group("remote", cls=CommandGroup)
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
