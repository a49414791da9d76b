"""``immersion serve`` as a child process: started, address read from its log, stopped by signal.

Used by the reactor demo's ``--remote``, by ``immersion bench remote`` and by the fault tests
(SIGKILL and restart on the same port). The child logs JSON lines (``--json``); they are kept
in :attr:`ServerProcess.events`, and its final stats (stdout) come back from :meth:`stop`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import ImmersionError


class ServerProcess:
    """Start ``python -m immersion serve --json`` and wait until it listens.

    Parameters
    ----------
    bind:
        As ``immersion serve --bind``; ``tcp://127.0.0.1:*`` takes a free port (see
        :attr:`address`), which a restart can then bind explicitly.
    server_key, clients, admins, workers, max_sessions, session_idle_s, max_message_bytes:
        As the ``immersion serve`` options (None: the default).
    max_sessions_per_client, max_connections, connection_rate, peer_timeout_s:
        As the ``immersion serve`` options (None: the default).
    handshake_timeout_s, drain_s:
        As ``--handshake-timeout`` and ``--drain`` (None: the default).
    log_file:
        As ``--log-file``: the log goes to this file and :attr:`events` are read from it. For
        a file that is not a regular one (``/dev/full``) nothing is read: ``bind`` must then
        name its port, and the server counts as started once the port accepts connections.
    open_files:
        The child's ``ulimit -n`` (soft and hard), e.g. to check the connection cap against it.
    start_timeout_s:
        How long to wait for the ``listening`` line.

    Examples
    --------
    ``with ServerProcess() as server: RemoteTarget(server.address, imm, algorithm=...)``; leaving
    the block sends SIGTERM and waits for a clean exit.
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:*",
        *,
        server_key: str | os.PathLike[str] | None = None,
        clients: str | os.PathLike[str] | None = None,
        admins: str | os.PathLike[str] | None = None,
        workers: int | None = None,
        max_sessions: int | None = None,
        session_idle_s: float | None = None,
        max_message_bytes: int | None = None,
        max_sessions_per_client: int | None = None,
        max_connections: int | None = None,
        connection_rate: float | None = None,
        peer_timeout_s: float | None = None,
        handshake_timeout_s: float | None = None,
        drain_s: float | None = None,
        log_file: str | os.PathLike[str] | None = None,
        open_files: int | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        command = [sys.executable, "-m", "immersion", "serve", "--bind", bind, "--json"]
        for flag, value in (
            ("--server-key", server_key),
            ("--clients", clients),
            ("--admins", admins),
            ("--workers", workers),
            ("--max-sessions", max_sessions),
            ("--session-idle", session_idle_s),
            ("--max-message-bytes", max_message_bytes),
            ("--max-sessions-per-client", max_sessions_per_client),
            ("--max-connections", max_connections),
            ("--connection-rate", connection_rate),
            ("--peer-timeout", peer_timeout_s),
            ("--handshake-timeout", handshake_timeout_s),
            ("--drain", drain_s),
            ("--log-file", log_file),
        ):
            if value is not None:
                command += [
                    flag,
                    str(Path(value)) if isinstance(value, os.PathLike) else str(value),
                ]
        self.events: list[dict[str, Any]] = []
        self.other_lines: list[str] = []
        self._listening = threading.Event()
        self._stopped = threading.Event()
        self.log_file = None if log_file is None else Path(log_file)
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=None if open_files is None else _open_files_limit(open_files),
        )
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        self._tail: threading.Thread | None = None
        regular = self.log_file is None or not self.log_file.exists() or self.log_file.is_file()
        if self.log_file is not None and regular:
            self._tail = threading.Thread(target=self._tail_log_file, daemon=True)
            self._tail.start()
        if regular:
            started = self._listening.wait(start_timeout_s)
        else:  # e.g. /dev/full: no log to read, the port must be given and answer
            started = _port_open(bind, start_timeout_s, self.proc)
        if not started or self.proc.poll() is not None:
            self.kill()
            tail = "\n".join(self.other_lines[-20:])
            raise ImmersionError(f"immersion serve did not start:\n{tail}")
        self.address: str = (
            bind
            if not regular
            else next(e["address"] for e in self.events if e["event"] == "listening")
        )

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._line(line)

    def _line(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            self.other_lines.append(line.rstrip())
            return
        if isinstance(event, dict) and "event" in event:
            self.events.append(event)
            if event["event"] == "listening":
                self._listening.set()
        else:
            self.other_lines.append(line.rstrip())

    def _tail_log_file(self) -> None:
        """Read the lines of ``--log-file`` as they come, until the child has exited."""
        assert self.log_file is not None
        partial = ""
        while not self.log_file.exists():
            if self.proc.poll() is not None or self._stopped.wait(0.02):
                return
        with open(self.log_file, encoding="utf-8", errors="replace") as stream:
            while True:
                exited = self.proc.poll() is not None
                chunk = stream.readline()
                if chunk:
                    partial += chunk
                    if partial.endswith("\n"):
                        self._line(partial)
                        partial = ""
                elif exited or self._stopped.wait(0.02):
                    return

    def stop(
        self, sig: signal.Signals = signal.SIGTERM, *, timeout_s: float = 60.0
    ) -> dict[str, Any] | None:
        """Send ``sig``, wait for the exit; return the final stats it printed (None if none).

        After :meth:`kill` it only waits and returns None (the stats were never printed).

        Parameters
        ----------
        sig:
            The signal (SIGTERM or SIGINT stop the server cleanly).
        timeout_s:
            How long to wait for the exit before killing it.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout_s)  # its stdout is one JSON object: no pipe fills up
        except subprocess.TimeoutExpired:
            self.kill()
            raise ImmersionError(f"immersion serve did not stop within {timeout_s:g} s") from None
        stdout = self.proc.stdout  # closed by kill(): a killed server printed no stats
        out = stdout.read() if stdout is not None and not stdout.closed else ""
        self._reader.join(5)
        if self._tail is not None:
            self._tail.join(5)
        try:
            return dict(json.loads(out.strip().splitlines()[-1])) if out.strip() else None
        except ValueError:
            return None

    def kill(self) -> None:
        """SIGKILL: no clean-up, no final stats (what a crash looks like to the clients)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        self._stopped.set()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.stop()


def _open_files_limit(count: int) -> Any:
    """A ``preexec_fn`` setting the child's ``ulimit -n`` to ``count``."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))

    return limit


def _port_open(bind: str, timeout_s: float, proc: subprocess.Popen) -> bool:
    """Wait until ``tcp://HOST:PORT`` accepts a TCP connection (False: time out, or exited)."""
    import socket
    import time

    from .wire import endpoint_host

    host = endpoint_host(bind, name="bind")
    port = bind.rsplit(":", 1)[1]
    if host is None or not port.isdigit():
        raise ImmersionError(
            f"a log file that is not a regular file needs bind with a port: {bind}"
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False
