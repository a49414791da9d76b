"""Loopback Flower deployments for the tests: a SuperLink, SuperNodes and ``flwr`` (flwr 1.41).

``secure=True`` is the documented way (README, "Flower"): TLS on every API of the SuperLink
(``--ssl-*``), SuperNode authentication (``--enable-supernode-auth``, keys registered with
``flwr supernode register``), SuperNodes and ``flwr`` trusting the test CA. The certificates and
node keys come from :mod:`immersion_fl.flower.tls` (``cryptography``). ``secure=False`` is the
``--insecure`` set-up the older tests use. Every process started here is stopped with its
descendants when the deployment closes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
CONNECTION = "local-deployment"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(parents.get(child, []))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class LoopbackDeployment:
    """A SuperLink on ``127.0.0.1`` and a ``FLWR_HOME`` whose default connection reaches it."""

    def __init__(self, folder: Path, *, secure: bool, extra_env: dict[str, str] | None = None):
        if not (BIN / "flower-superlink").exists():
            pytest.skip("flower-superlink is not installed beside this Python")
        self.folder, self.secure = folder, secure
        self.port = free_port()
        self.home = folder / "flwr"
        self.home.mkdir(parents=True)
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            **(extra_env or {}),
        }
        self.procs: list[subprocess.Popen] = []
        link = [str(BIN / "flower-superlink"), "--port", str(self.port)]
        if secure:
            from immersion_fl.flower.tls import write_tls_certificates

            self.tls = write_tls_certificates(folder / "tls", ["localhost", "127.0.0.1"])
            link += [
                "--ssl-ca-certfile",
                str(self.tls["ca_certificate"]),
                "--ssl-certfile",
                str(self.tls["certificate"]),
                "--ssl-keyfile",
                str(self.tls["key"]),
                "--enable-supernode-auth",
            ]
            trust = f'root-certificates = "{self.tls["ca_certificate"]}"\n'
        else:
            link.append("--insecure")
            trust = "insecure = true\n"
        self.add_connection(CONNECTION, trust, default=True)
        superlink = self._start("superlink", link)
        try:  # nothing else stops the SuperLink yet: the caller's `with` has not begun
            self._wait_for_port(self.port, superlink)
        except BaseException:
            self.close()
            raise

    def add_connection(self, name: str, trust: str, *, default: bool = False) -> None:
        """A ``[superlink.NAME]`` entry in ``config.toml`` (``trust``: its TLS lines)."""
        config = self.home / "config.toml"
        text = config.read_text() if config.exists() else ""
        if default:
            text = f'[superlink]\ndefault = "{name}"\n\n' + text
        text += f'[superlink.{name}]\naddress = "127.0.0.1:{self.port}"\n{trust}\n'
        config.write_text(text)

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        proc.log_path = self.folder / f"{name}.log"  # type: ignore[attr-defined]
        log.close()
        self.procs.append(proc)
        return proc

    @staticmethod
    def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        log = proc.log_path.read_text()[-2000:]  # type: ignore[attr-defined]
        if proc.poll() is not None:
            raise RuntimeError(f"the SuperLink exited ({proc.returncode}) before listening:\n{log}")
        raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s:\n{log}")

    def node_key(self, name: str) -> tuple[Path, Path]:
        """A SuperNode key pair (private, public) in OpenSSH format."""
        from immersion_fl.flower.tls import write_node_key

        return write_node_key(self.folder / "nodes", name)

    def flwr(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def supernode(
        self,
        name: str,
        partition: int,
        partitions: int,
        *,
        key: Path | None = None,
        insecure: bool = False,
        max_retries: int | None = None,
    ) -> subprocess.Popen:
        command = [
            str(BIN / "flower-supernode"),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--port",
            str(free_port()),
            "--node-config",
            f"partition-id={partition} num-partitions={partitions}",
        ]
        if insecure or not self.secure:
            command.append("--insecure")
        else:
            command += ["--root-certificates", str(self.tls["ca_certificate"])]
        if key is not None:
            command += ["--auth-supernode-private-key", str(key)]
        if max_retries is not None:
            command += ["--max-retries", str(max_retries)]
        return self._start(name, command)

    def run(self, app: Path, run_config: str, *, timeout_s: float = 300.0):
        """``flwr run APP`` on the default connection, streaming the logs."""
        return self.flwr(
            "run", str(app), CONNECTION, "--stream", "--run-config", run_config, timeout_s=timeout_s
        )

    def close(self) -> None:
        """SIGTERM to every process started here and to their descendants (Flower starts its
        SuperExec and app processes in sessions of their own), SIGKILL to what is left."""
        started = [p.pid for p in self.procs]
        family = started + [d for pid in started for d in _descendants(pid)]
        for pid in family:
            _signal(pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in family):
            time.sleep(0.2)
        for pid in family:
            _signal(pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def __enter__(self) -> "LoopbackDeployment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
