"""Soak benchmark of `immersion serve` (issue 26): a paced plant beside each attack, one at a time.

Run:  .venv/bin/python benchmarks/soak_service.py [--seconds 20] [--out PATH]
      (one JSON object on stdout; with --out also written to PATH, e.g.
      docs/figures/remote/soak_service.json; about 25 s per phase, 8 phases)

Each phase starts its own server process (CurveZMQ keys, ``ulimit -n`` 1024, a 1 MiB
``--max-message-bytes``, 64 sessions, 16 per key, 256 connections, 5 s peer and 2 s handshake
time-outs, the log in a file), starts one attack in a process of its own, and once it is in full
force (a second; for squatting and connection attacks, once the session table or the connection
cap is full) a legitimate plant that sets up a new session: a reactor controller sampled every
10 ms for ``--seconds`` (a round trip that overruns its period skips the ticks it missed).
Reported per phase, with the no-attack phase of the same run as the reference: the plant's
samples (and their ratio to the reference), its round-trip p50/p99, whether every decoded output
equals its own local target's, the server's peak RSS and CPU, the log bytes written, and the
server's own counters.

Attacks (all on loopback; the attacker's addresses are other loopback addresses, 127.0.0.2 and
up, so that per-address limits can tell it from the plant at 127.0.0.1):

* ``malformed-flood``: a listed key sends malformed requests as fast as it can (log amplification).
* ``malformed-flood-full-disk``: the same, with the log on ``/dev/full`` (every write fails).
* ``handshake-flood``: new connections as fast as one process makes them, with an unlisted key
  (half), a wrong server key (a quarter) or no CurveZMQ (a quarter).
* ``idle-connections``: 1,100 raw TCP connections from 20 addresses, reopened when cut.
* ``half-sent``: 128 raw connections from 4 addresses, each sending half of a 1 MiB frame in its
  handshake, then nothing; reopened when cut.
* ``non-reading-client``: a listed key pipelines 256 KiB requests and never reads a reply.
* ``session-squatting``: four listed keys open every session they can, and retry.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ATTACKS = (
    "none",
    "malformed-flood",
    "malformed-flood-full-disk",
    "handshake-flood",
    "idle-connections",
    "half-sent",
    "non-reading-client",
    "session-squatting",
)
REACTOR = {"algorithm": "reactor-controller", "params": {"dt": 0.01}}
PERIOD_S = 0.01
SERVER = {
    "max_message_bytes": 2**20,
    "max_sessions": 64,
    "max_sessions_per_client": 16,
    "max_connections": 256,
    "peer_timeout_s": 5.0,
    "handshake_timeout_s": 2.0,
    "open_files": 1024,
}


# ------------------------------------------------------------------------------------ attacks
def _curve_socket(zmq: Any, ctx: Any, server_public: bytes, pair: Any, kind: int) -> Any:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey, sock.curve_publickey = server_public, pair.public
    sock.curve_secretkey = pair.secret
    return sock


def attack(name: str, address: str, keys: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Run one attack for ``seconds``; return what it did (counts)."""
    import zmq
    from immersion.remote.curve import CurveKeyPair, load_curve_public, load_curve_secret

    ctx = zmq.Context()
    server_public = load_curve_public(keys["server_public"])
    listed = [load_curve_secret(entry["client_key"]) for entry in keys["clients"]]
    host, port = address.rsplit(":", 1)[0][len("tcp://") :], int(address.rsplit(":", 1)[1])
    end = time.monotonic() + seconds
    done: dict[str, Any] = {"attack": name}
    if name.startswith("malformed-flood"):
        sock = _curve_socket(zmq, ctx, server_public, listed[1], zmq.DEALER)
        sock.connect(address)
        sent = received = 0
        while time.monotonic() < end:
            for _ in range(64):
                sock.send_multipart([b"", b"advance", struct.pack("<Q", sent), b"short"])
                sent += 1
            while sock.poll(0 if received + 256 > sent else 10):
                sock.recv_multipart()
                received += 1
        done.update(sent=sent, answered=received)
    elif name == "handshake-flood":
        stranger = CurveKeyPair(*zmq.curve_keypair())
        attempts = 0
        while time.monotonic() < end:
            batch = []
            for i in range(32):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                if i % 4 < 2:  # an unlisted key
                    sock.curve_serverkey, sock.curve_publickey = server_public, stranger.public
                    sock.curve_secretkey = stranger.secret
                elif i % 4 == 2:  # a wrong server key
                    sock.curve_serverkey, sock.curve_publickey = stranger.public, stranger.public
                    sock.curve_secretkey = stranger.secret
                sock.connect(f"tcp://127.0.0.2:0;{host}:{port}")
                batch.append(sock)
            time.sleep(0.03)
            for sock in batch:
                sock.close()
            attempts += len(batch)
        done.update(connections=attempts)
    elif name in ("idle-connections", "half-sent"):
        count, sources = (1100, 20) if name == "idle-connections" else (128, 4)
        greeting = (
            b"\xff" + b"\0" * 7 + b"\x01\x7f\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" * 32
        )
        half = b"\x06" + struct.pack(">Q", 2**20 - 16) + b"\0" * 2**19  # a command frame, half
        peers: list[socket.socket | None] = [None] * count
        opened = 0
        while time.monotonic() < end:
            for i, peer in enumerate(peers):
                if peer is not None:
                    try:
                        if peer.recv(65536, socket.MSG_DONTWAIT) == b"":
                            raise ConnectionResetError
                        continue
                    except BlockingIOError:
                        continue
                    except OSError:
                        peer.close()
                try:
                    peer = socket.create_connection(
                        (host, port), timeout=2, source_address=(f"127.0.0.{2 + i % sources}", 0)
                    )
                    if name == "half-sent":
                        peer.sendall(greeting)
                        peer.setblocking(False)
                        try:
                            peer.send(half)
                        except BlockingIOError:
                            pass
                    peers[i] = peer
                    opened += 1
                except OSError:
                    peers[i] = None
            time.sleep(0.25)
        for peer in peers:
            if peer is not None:
                peer.close()
        done.update(connections_opened=opened)
    elif name == "non-reading-client":
        from immersion.bench.remote import make_plants
        from immersion.files import npz_bytes
        from immersion.remote.kinds import kind_of

        (plant,) = make_plants(1, 1, **REACTOR, seed=99)
        header = json.dumps({"coding": "immersion", **REACTOR}).encode()
        arrays = npz_bytes(kind_of(plant.imm).public_arrays(plant.imm))
        setup = _curve_socket(zmq, ctx, server_public, listed[2], zmq.DEALER)
        setup.connect(address)
        setup.send_multipart([b"", b"setup", b"s", header, arrays])
        session = setup.recv_multipart()[-1] if setup.poll(10_000) else b"0" * 16
        sock = _curve_socket(zmq, ctx, server_public, listed[2], zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)  # its ZeroMQ does not read ahead for it either
        sock.connect(address)
        vector = b"\0" * 2**18
        sent = 0
        while time.monotonic() < end:
            try:
                sock.send_multipart(
                    [b"", b"advance", struct.pack("<Q", sent), session, vector, vector],
                    zmq.NOBLOCK,
                )
                sent += 1
            except zmq.Again:
                time.sleep(0.001)
        done.update(sent=sent)
    elif name == "session-squatting":
        from immersion.bench.remote import make_plants
        from immersion.files import npz_bytes
        from immersion.remote.client import RemoteError, _Channel
        from immersion.remote.kinds import kind_of

        (plant,) = make_plants(1, 1, **REACTOR, seed=98)
        header = json.dumps({"coding": "immersion", **REACTOR}).encode()
        arrays = npz_bytes(kind_of(plant.imm).public_arrays(plant.imm))
        channels = [
            _Channel(address, timeout_s=5.0, attempts=1, curve=(server_public, listed[k]))
            for k in (1, 2, 3, 4)
        ]
        held = refused = 0
        while time.monotonic() < end:
            for channel in channels:
                try:
                    channel.request(b"setup", header, arrays)
                    held += 1
                except RemoteError:
                    refused += 1
            time.sleep(0.02)
        done.update(sessions_opened=held, refused=refused)
    elif name != "none":
        raise ValueError(f"unknown attack {name!r}")
    ctx.destroy(linger=0)
    return done


# ------------------------------------------------------------------------------------ the plant
def paced_plant(address: str, plant: Any, keys: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The plant sampled every 10 ms for ``seconds``: round trips, and its decoded outputs."""
    from immersion.remote.client import RemoteTarget

    set_up = time.perf_counter()
    cloud = RemoteTarget(address, plant.imm, **REACTOR, timeout_s=2.0, attempts=10, **keys)
    set_up = time.perf_counter() - set_up
    xt = plant.imm.encode_state(plant.initial_state)
    trips, outputs = [], []
    start = next_tick = time.perf_counter()
    missed = 0
    for yt in plant.encoded_inputs:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if now < next_tick:
            time.sleep(next_tick - now)
        began = time.perf_counter()
        ut, xt = cloud.advance(xt, yt)
        trips.append(time.perf_counter() - began)
        outputs.append(plant.imm.decode_output(ut, yt))
        next_tick += PERIOD_S
        late = int((time.perf_counter() - next_tick) // PERIOD_S)
        if late > 0:  # a real-time loop drops the ticks it overran
            missed += late
            next_tick += late * PERIOD_S
    resumed = cloud.resumed
    cloud.close()
    return {
        "trips": np.array(trips),
        "outputs": np.array(outputs),
        "missed_ticks": missed,
        "setup_s": set_up,
        "resumed": resumed,
    }


class _Sampler:
    """Peak RSS (every 0.25 s) and CPU time of a process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib = pid, 0
        self._stop = threading.Event()
        self.cpu_start = self.cpu()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.peak_kib = max(self.peak_kib, self.rss_kib())
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        return self.cpu() - self.cpu_start


#: What each attack must have reached before the plant starts (at most 20 s of warm-up).
_IN_FORCE = {
    "session-squatting": lambda stats: stats["sessions"] >= SERVER["max_sessions"],
    "idle-connections": lambda stats: stats["connections"]["open"] >= SERVER["max_connections"],
    "half-sent": lambda stats: stats["connections"]["open"] >= 100,
}


def _wait_for_attack(name: str, address: str, keys: dict[str, Any]) -> float:
    """Seconds until the attack is in full force (the session table or connection cap full);
    one second for the floods."""
    from immersion.remote.client import RemoteError, remote_stats

    start = time.monotonic()
    time.sleep(1.0)
    check = _IN_FORCE.get(name)
    while check is not None and time.monotonic() - start < 20:
        try:
            stats = remote_stats(address, server_key=keys["server_public"], admin_key=keys["admin"])
            if check(stats):
                break
        except RemoteError:
            pass
        time.sleep(0.2)
    return time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def phase(name: str, keys: dict[str, Any], plant: Any, local: np.ndarray, seconds: float,
          folder: Path) -> dict[str, Any]:  # fmt: skip
    """One attack beside the paced plant, against a fresh server."""
    from immersion.bench.remote import relative_error
    from immersion.remote.client import remote_stats
    from immersion.remote.process import ServerProcess

    full_disk = name.endswith("full-disk")
    log_file = Path("/dev/full") if full_disk else folder / f"{name}.log"
    bind = f"tcp://127.0.0.1:{_free_port()}" if full_disk else "tcp://127.0.0.1:*"
    server = ServerProcess(bind, **keys["server"], **SERVER, log_file=log_file)
    try:
        sampler = _Sampler(server.proc.pid)
        rss_start = sampler.rss_kib()
        attacker = subprocess.Popen(
            [sys.executable, __file__, "--attack", name, "--address", server.address,
             "--keys", str(folder / "keys.json"), "--seconds", str(seconds + 2)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        warm_up = _wait_for_attack(name, server.address, keys)
        run = paced_plant(server.address, plant, keys["clients"][0], seconds)
        done = json.loads(attacker.communicate(timeout=seconds + 60)[0] or "{}")
        stats = remote_stats(server.address, server_key=keys["server_public"],
                             admin_key=keys["admin"])  # fmt: skip
        cpu_s = sampler.stop()
    finally:
        summary = server.stop()
    samples = len(run["trips"])
    p50, p99 = np.percentile(run["trips"], [50, 99]) * 1e3
    return {
        "attack": name,
        "plant": {
            "samples": samples,
            "missed_ticks": run["missed_ticks"],
            "p50_ms": round(float(p50), 3),
            "p99_ms": round(float(p99), 3),
            "setup_ms": round(run["setup_s"] * 1e3, 1),
            "resumed": run["resumed"],
            "max_rel_error_vs_local": relative_error(run["outputs"], local[:samples]),
        },
        "server": {
            "rss_start_mib": round(rss_start / 1024, 1),
            "rss_peak_mib": round(sampler.peak_kib / 1024, 1),
            "cpu_s": round(cpu_s, 2),
            "exit_code": server.returncode,
            "log_bytes": 0 if full_disk else log_file.stat().st_size,
            "log": stats["log"],
            "refused": stats["refused"],
            "handshakes": stats["handshakes"],
            "connections": stats["connections"],
            "sessions_ended": (summary or {}).get("sessions_ended"),
        },
        "attacker": done,
        "warm_up_s": round(warm_up, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, help="also write the JSON object to this file")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated subset")
    parser.add_argument("--attack", help=argparse.SUPPRESS)  # the attacker process
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        keys = json.loads(args.keys.read_text())
        print(json.dumps(attack(args.attack, args.address, keys, args.seconds)), flush=True)
        return
    from immersion.bench.remote import curve_key_folder, make_plants, run_plant

    attacks = args.attacks.split(",")
    if attacks[0] != "none":
        attacks.insert(0, "none")
    ticks = int(args.seconds / PERIOD_S) + 10
    (plant,) = make_plants(1, ticks, **REACTOR, seed=7)
    local, _ = run_plant(plant.imm.target, plant)
    phases = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        keys = curve_key_folder(folder, 5)
        (folder / "keys.json").write_text(json.dumps(keys, default=str))
        for name in attacks:
            print(f"[soak] {name}", file=sys.stderr, flush=True)
            phases.append(phase(name, keys, plant, local, args.seconds, folder))
    base = phases[0]["plant"]
    for row in phases:
        row["plant"]["samples_vs_no_attack"] = round(row["plant"]["samples"] / base["samples"], 3)
        row["plant"]["p50_vs_no_attack"] = round(row["plant"]["p50_ms"] / base["p50_ms"], 2)
        row["plant"]["p99_vs_no_attack"] = round(row["plant"]["p99_ms"] / base["p99_ms"], 2)
    result = {
        "benchmark": "soak-service",
        "command": " ".join(["benchmarks/soak_service.py", *sys.argv[1:]]),
        "seconds_per_phase": args.seconds,
        "plant_period_ms": PERIOD_S * 1e3,
        "server_options": SERVER,
        "cpu_count": os.cpu_count(),
        "phases": phases,
    }
    text = json.dumps(result, default=float)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(text)


if __name__ == "__main__":
    main()
