"""`immersion serve` stays up (issue 26): failing logs, log floods, memory, quotas, connections.

Every server listens on loopback only; every loop is bounded in count and time. No test asserts
a duration: waits have generous deadlines, and the soak benchmark (benchmarks/soak_service.py)
measures the timings.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

zmq = pytest.importorskip("zmq")

from immersion import InvalidArgumentError  # noqa: E402
from immersion.bench.remote import (  # noqa: E402
    curve_key_folder,
    make_plants,
    relative_error,
    run_plant,
)
from immersion.remote.client import (  # noqa: E402
    AuthenticationError,
    DisconnectedError,
    MessageTooLargeError,
    RemoteError,
    RemoteTarget,
    RemoteTimeoutError,
    SessionLimitError,
    _Channel,
)
from immersion.remote.curve import CurveKeyPair, load_curve_public, load_curve_secret  # noqa: E402
from immersion.remote.kinds import TARGET_KINDS, TargetKind  # noqa: E402
from immersion.remote.process import ServerProcess  # noqa: E402
from immersion.remote.server import (  # noqa: E402
    EXIT_THREAD_DIED,
    FD_RESERVE,
    QUEUED_REPLIES,
    QUEUED_REQUESTS,
    Service,
    ServiceFailure,
    _LogWriter,
    format_log_line,
)

REACTOR = {"algorithm": "reactor-controller", "params": {"dt": 0.01}}
RTOL = 1e-12


def _wait_for(what: str, check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:g} s")
        time.sleep(0.02)


def _exact(plant: Any, cloud: Any) -> None:
    """Run the plant through ``cloud``; its outputs must equal its own local target's."""
    remote, _ = run_plant(cloud, plant)
    local, _ = run_plant(plant.imm.target, plant)
    assert relative_error(remote, local) <= RTOL


def _curve_of(keys: dict[str, Any], index: int) -> tuple[bytes, CurveKeyPair]:
    entry = keys["clients"][index]
    return load_curve_public(entry["server_key"]), load_curve_secret(entry["client_key"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _child(script: str, *args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], **popen)


def _wait_until_serving(address: str, timeout_s: float = 60.0) -> None:
    def answers() -> bool:
        channel = _Channel(address, timeout_s=0.5, attempts=1, curve=None)
        try:
            return bool(channel.request(b"hello"))
        except RemoteError:
            return False
        finally:
            channel.close()

    _wait_for("the server did not answer hello", answers, timeout_s)


# ------------------------------------------------------------------------------------ log format
def test_log_fields_are_clipped_and_escaped_in_both_modes():
    forged = "x\nimmersion serve: stopping reason=admin-stop-FORGED " + "y" * 10_000
    text = format_log_line("refused", {"message": forged, "code": "malformed"}, json_log=False)
    assert "\n" not in text and len(text) < 400
    assert text.startswith('immersion serve: refused message="x\\nimmersion serve: stopping')
    assert text.endswith(" code=malformed") and f"[{len(forged) - 200} more]" in text
    line = format_log_line("refused", {"message": forged, "n": 3}, json_log=True)
    event = json.loads(line)
    assert "\n" not in line and event["message"].startswith("x\nimmersion") and event["n"] == 3
    assert len(event["message"]) < 250
    spaced = format_log_line(
        "setup", {"algorithm": "a b=c", "ok": "reactor-controller"}, json_log=False
    )
    assert spaced == 'immersion serve: setup algorithm="a b=c" ok=reactor-controller'


# ------------------------------------------------------------------------------ failing logs
def test_the_log_writer_never_blocks_and_counts_the_lines_it_loses(tmp_path):
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: one page, filled at once
    writer = _LogWriter(write_end, close_fd=False)
    done = threading.Event()

    def flood() -> None:
        for i in range(20_000):
            writer.put(f"line {i} " + "x" * 100)
        done.set()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    assert done.wait(30), "put() blocked on a pipe nobody reads"
    writer.close(timeout_s=0.2)  # the writer is stuck in write(): close gives up on it
    assert writer.dropped > 10_000 and writer.written < 100
    os.close(read_end)  # now the pipe is closed: the stuck write fails (EPIPE), nothing raises
    writer.thread.join(10)
    os.close(write_end)

    full = _LogWriter(os.open("/dev/full", os.O_WRONLY), close_fd=True)
    for i in range(50):
        assert full.put(f"line {i}")
    full.close()
    assert (full.written, full.dropped) == (0, 50)


def test_a_log_callable_that_raises_never_stops_the_service():
    def broken(line: str) -> None:
        raise OSError(28, "No space left on device")

    (plant,) = make_plants(1, 30, **REACTOR)
    with Service("tcp://127.0.0.1:*", log=broken) as service:
        with RemoteTarget(service.address, plant.imm, **REACTOR) as cloud:
            _exact(plant, cloud)
        stats = service.stats()
    assert stats["log"]["dropped"] >= 2  # listening, setup, session-end at least
    assert stats["samples"] == 30


def test_a_log_file_that_cannot_be_opened_is_refused_by_name(tmp_path):
    for kwargs in (
        {"log_file": tmp_path / "missing-folder" / "serve.log"},
        {"log_file": tmp_path, "json_log": True},  # a folder
        {"log_file": tmp_path / "serve.log", "log": print},
    ):
        with pytest.raises(InvalidArgumentError) as info:
            Service("tcp://127.0.0.1:*", **kwargs)
        assert info.value.argument == "log_file", kwargs


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a full disk)")
def test_serve_on_a_full_disk_log_serves_and_exits_0():
    address = f"tcp://127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "immersion", "serve", "--bind", address, "--json"]
    server = subprocess.Popen(
        [*command, "--log-file", "/dev/full"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _wait_until_serving(address)
        (plant,) = make_plants(1, 30, **REACTOR)
        with RemoteTarget(address, plant.imm, **REACTOR) as cloud:
            _exact(plant, cloud)
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, err
    stats = json.loads(out)
    assert stats["log"]["written"] == 0 and stats["log"]["dropped"] >= 3
    assert stats["samples"] == 30


@pytest.mark.slow
def test_serve_with_its_stderr_pipe_closed_serves_and_exits_0():
    """A log collector that goes away: stderr is a pipe whose reader closed it."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "immersion", "serve", "--bind", address, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        server.stderr.close()  # the reader is gone: every later write gets EPIPE
        _wait_until_serving(address)
        (plant,) = make_plants(1, 30, **REACTOR)
        with RemoteTarget(address, plant.imm, **REACTOR) as cloud:  # set-up: a log line
            _exact(plant, cloud)
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0
    stats = json.loads(out)
    assert stats["log"]["dropped"] >= 2 and stats["samples"] == 30


# ------------------------------------------------------------------------------ dead threads
ZAP_DIES = """
    import sys
    import immersion.remote.server as service

    def die(self, frames):
        raise SystemExit("the ZAP thread exits without a trace (threading ignores SystemExit)")

    service.Service._zap_reply = die
    from immersion.cli.main import main
    main(sys.argv[1:])
"""


@pytest.mark.slow
def test_a_dead_zap_thread_stops_the_process_with_exit_code_70(tmp_path):
    keys = curve_key_folder(tmp_path, 1)
    address = f"tcp://127.0.0.1:{_free_port()}"
    args = ["serve", "--bind", address, "--json", "--server-key", str(keys["server"]["server_key"])]
    args += ["--clients", str(keys["server"]["clients"]), "--handshake-timeout", "1"]
    server = _child(ZAP_DIES, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pair = _curve_of(keys, 0)
        deadline = time.monotonic() + 60
        while server.poll() is None and time.monotonic() < deadline:
            channel = _Channel(address, timeout_s=0.5, attempts=1, curve=pair)
            try:
                channel.request(b"hello")  # its handshake asks the ZAP thread, which dies
            except RemoteError:
                pass
            finally:
                channel.close()
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == EXIT_THREAD_DIED
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    fatal = [e for e in events if e["event"] == "fatal"]
    assert fatal and "ZAP handler" in fatal[0]["reason"]
    assert "ZAP handler" in err.splitlines()[-1]  # the last stderr line says why


class _Dies:
    """A target kind whose set-up kills the worker thread that runs it (a bug's stand-in)."""

    @staticmethod
    def build(header: dict[str, Any], arrays: dict[str, Any]) -> Any:
        raise SystemExit("worker gone")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_worker_stops_the_service_with_a_named_failure():
    dies = TargetKind("dies", np.float64, lambda imm: {}, _Dies.build)
    logs: list[str] = []
    service = Service(
        "tcp://127.0.0.1:*", workers=1, kinds={**TARGET_KINDS, "dies": dies}, log=logs.append
    ).start()
    channel = _Channel(service.address, timeout_s=1.0, attempts=1, curve=None)
    try:
        with pytest.raises(RemoteTimeoutError):
            channel.request(b"setup", b'{"coding": "dies"}', _empty_npz())
    finally:
        channel.close()
    service.join(30)
    assert not service._thread.is_alive()
    assert isinstance(service.failure, ServiceFailure) and "worker" in str(service.failure)
    assert any("fatal" in line and "worker" in line for line in logs)


SLOW_SERVER = """
    import json, sys, time
    import numpy as np
    from immersion.remote.kinds import TARGET_KINDS, TargetKind
    from immersion.remote.server import Service, serve

    class Stuck:
        n_state_encoded = n_input_encoded = 1

        def advance(self, xt, yt):
            time.sleep(600)  # a target that never finishes

    stuck = TargetKind("stuck", np.float64, lambda imm: {}, lambda h, a: Stuck())
    service = Service(sys.argv[1], kinds={**TARGET_KINDS, "stuck": stuck}, json_log=True,
                      drain_s=float(sys.argv[2]))
    print(json.dumps(serve(service)), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_exits_0_with_a_stuck_worker_and_a_log_nobody_reads(signals):
    """One SIGTERM: the drain gives up after ``drain_s``; with a 600 s drain a second SIGTERM
    ends it. The log goes to a one-page pipe nobody reads, so the log writer is stuck too."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    drain = "0.5" if signals == 1 else "600"
    server = _child(SLOW_SERVER, address, drain, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fcntl.fcntl(server.stderr.fileno(), 1031, 4096)  # F_SETPIPE_SZ: the log fills it at once
    try:
        _wait_until_serving(address)
        channel = _Channel(address, timeout_s=5.0, attempts=1, curve=None)
        info, session = channel.request(b"setup", b'{"coding": "stuck"}', _empty_npz())
        channel._sock.send_multipart([b"", b"advance", b"1", session, b"\0" * 8, b"\0" * 8])
        for request in ([b"stop"], [b"bogus"], [b"close", b"0" * 16], [b"setup", b"{"]):
            for i in range(10):  # 40 refusals, 10 per cause (the rate limit): 4 KiB and more
                channel._sock.send_multipart([b"", request[0], b"r%d" % i, *request[1:]])
        time.sleep(0.5)  # the advance is in the worker; the log fills the pipe
        for _ in range(signals):
            server.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        out = server.stdout.read()  # the final stats, then EOF at the exit
        server.wait(timeout=60)
        channel.close()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0
    stats = json.loads(out)  # written before the log writer gave up on its pipe
    assert stats["log"]["pending"] + stats["log"]["dropped"] > 0


def _empty_npz() -> bytes:
    from immersion.files import npz_bytes

    return npz_bytes({})


# ------------------------------------------------------------------------------ log floods
@pytest.fixture
def keyed(tmp_path):
    keys = curve_key_folder(tmp_path, 4)
    logs: list[str] = []
    service = Service(
        "tcp://127.0.0.1:*",
        max_message_bytes=2**21,
        max_sessions=6,
        max_sessions_per_client=3,
        log=logs.append,
        json_log=True,
        **keys["server"],
    )
    with service:
        yield service, keys, logs


def _events(logs: list[str], name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, list(logs)) if e["event"] == name]


def _pipelined(address: str, curve: Any, requests: list[list[bytes]]) -> list[list[bytes]]:
    """Send every request on one connection, then read every reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    server_public, pair = curve
    sock.curve_serverkey, sock.curve_publickey = server_public, pair.public
    sock.curve_secretkey = pair.secret
    sock.connect(address)
    try:
        replies = []
        for request in requests:
            sock.send_multipart(request)
            while sock.poll(0):
                replies.append(sock.recv_multipart())
        while len(replies) < len(requests) and sock.poll(10_000):
            replies.append(sock.recv_multipart())
        return replies
    finally:
        sock.close()


def test_a_flood_of_refusals_logs_ten_lines_and_counts_the_rest(keyed):
    service, keys, logs = keyed
    junk = [[b"", b"advance", struct.pack("<I", i), b"short"] for i in range(300)]
    replies = _pipelined(service.address, _curve_of(keys, 0), junk)
    assert len(replies) == 300 and all(r[3] == b"malformed" for r in replies)
    stats = service.stats()
    assert stats["refused"]["malformed"] == 300
    assert stats["log"]["suppressed"] >= 290
    service.stop()
    service.join(30)
    assert len(_events(logs, "refused")) == 10
    (left_out,) = _events(logs, "suppressed")
    assert left_out["of"] == "refused" and left_out["lines"] == 290
    assert left_out["key"] == [keys_fingerprint(keys, 0), "malformed"]


def keys_fingerprint(keys: dict[str, Any], index: int) -> str:
    return _curve_of(keys, index)[1].fingerprint


def test_a_set_up_label_is_length_limited_and_cannot_forge_log_lines(tmp_path):
    logs: list[str] = []
    forged = "x\nimmersion serve: stopping reason=admin-stop-FORGED"
    (plant,) = make_plants(1, 5, **REACTOR)
    with Service("tcp://127.0.0.1:*", max_message_bytes=2**23, log=logs.append) as service:
        channel = _Channel(service.address, timeout_s=5.0, attempts=1, curve=None)
        cloud = RemoteTarget(service.address, plant.imm, **REACTOR)
        arrays = cloud._setup_frames[1]
        for header in (
            {"algorithm": forged},
            {"algorithm": "a" * 4_000_000},
            {"coding": "c" * 4_000_000},
        ):
            with pytest.raises(RemoteError) as info:
                channel.request(b"setup", json.dumps(header).encode(), arrays)
            assert info.value.code == "invalid-argument", header.keys()
            assert len(str(info.value)) < 1_200
        channel.close()
        stats_bytes = len(json.dumps(service.stats()))
        cloud.close()
    assert all("\n" not in line for line in logs)
    assert not any(line.startswith("immersion serve: stopping reason=admin") for line in logs)
    assert sum(map(len, logs)) < 20_000 and stats_bytes < 20_000


# ------------------------------------------------------------------------------ memory bounds
def _zmtp_null(port: int, *, source: str = "127.0.0.1") -> socket.socket:
    """A raw TCP peer that completes ZMTP 3.0's NULL handshake as a DEALER (no keys)."""
    peer = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32
    peer.sendall(greeting)
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    peer.sendall(b"\x04" + bytes([len(body)]) + body)
    seen = b""  # the server's greeting and READY: only then may messages follow
    while b"READY" not in seen or not seen.endswith((b"ROUTER", b"Identity\0\0\0\0")):
        chunk = peer.recv(4096)
        assert chunk, f"the server closed the handshake: {seen!r}"
        seen += chunk
    return peer


def _until_closed(peer: socket.socket, timeout_s: float = 30.0) -> bool:
    """Read (and drop) what the server sends until it closes the connection."""
    peer.settimeout(0.5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not peer.recv(65536):
                return True
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True
    return False


def test_a_half_sent_message_is_cut_after_the_peer_timeout():
    with Service(
        "tcp://127.0.0.1:*", peer_timeout_s=0.4, max_message_bytes=2**20, log=lambda line: None
    ) as service:
        port = int(service.address.rsplit(":", 1)[1])
        peer = _zmtp_null(port)
        peer.sendall(b"\x01\x00" + b"\x01\x05hello" + b"\x00\x02r1")  # a whole request first
        reply = b""
        while b"protocol" not in reply:  # the hello reply: the framing is right
            chunk = peer.recv(65536)
            assert chunk, "the server closed a well-formed connection"
            reply += chunk
        peer.sendall(b"\x01\x00")  # an empty first frame (more follows) ...
        peer.sendall(b"\x02" + struct.pack(">Q", 2**20 - 8) + b"\0" * 100_000)  # ... and stops
        try:
            assert _until_closed(peer), "the half-sent message was kept"
        finally:
            peer.close()
        _wait_for(
            "the connection was not forgotten", lambda: not service.stats()["connections"]["open"]
        )
        (plant,) = make_plants(1, 10, **REACTOR)
        with RemoteTarget(service.address, plant.imm, **REACTOR) as cloud:
            _exact(plant, cloud)


def test_a_peer_that_never_completes_its_handshake_is_cut(tmp_path):
    keys = curve_key_folder(tmp_path, 1)
    with Service(
        "tcp://127.0.0.1:*", handshake_timeout_s=0.3, log=lambda line: None, **keys["server"]
    ) as service:
        port = int(service.address.rsplit(":", 1)[1])
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            assert _until_closed(idle), "an idle raw connection was kept"
        finally:
            idle.close()
        _wait_for(
            "the failed handshake was not counted",
            lambda: service.stats()["handshakes"]["failed"].get("closed-or-timed-out", 0) >= 1,
        )


class _Echo:
    """A target whose reply is as large as the request (for the reply-queue test)."""

    n_state_encoded = n_input_encoded = 1

    def advance(self, xt, yt):
        return xt, yt


def test_a_client_that_never_reads_loses_replies_not_server_memory():
    echo = TargetKind("echo", np.float64, lambda imm: {}, lambda h, a: _Echo())
    with Service(
        "tcp://127.0.0.1:*",
        max_message_bytes=2**23,
        kinds={**TARGET_KINDS, "echo": echo},
        log=lambda line: None,
    ) as service:
        assert service._router.getsockopt(zmq.SNDHWM) == QUEUED_REPLIES
        assert service._router.getsockopt(zmq.RCVHWM) == QUEUED_REQUESTS
        channel = _Channel(service.address, timeout_s=5.0, attempts=1, curve=None)
        _, session = channel.request(b"setup", b'{"coding": "echo"}', _empty_npz())
        channel.close()
        reader = zmq.Context.instance().socket(zmq.DEALER)
        reader.setsockopt(zmq.LINGER, 0)
        reader.setsockopt(zmq.RCVHWM, 1)  # its own ZeroMQ does not read ahead for it either
        reader.connect(service.address)
        vector = b"\0" * 2**16  # a 128 KiB reply per request
        for i in range(300):
            reader.send_multipart([b"", b"advance", struct.pack("<I", i), session, vector, vector])
        _wait_for("the server did not answer all 300", lambda: service.stats()["samples"] == 300)
        time.sleep(0.5)
        received = 0
        while reader.poll(500):
            reader.recv_multipart()
            received += 1
        reader.close()
        assert service.stats()["replies"] == 301  # the set-up's and every advance's: none waits
    # what it gets: the replies queued for it (64), and what fitted in the kernel's buffers
    assert received < 250


# ------------------------------------------------------------------------------ session quotas
def test_a_key_holds_at_most_its_quota_and_a_full_table_makes_room_for_another_key(keyed):
    service, keys, logs = keyed  # max_sessions 6, 3 per key
    plants = make_plants(7, 5, **REACTOR)
    squatter = [
        RemoteTarget(service.address, p.imm, **REACTOR, **keys["clients"][0]) for p in plants[:3]
    ]
    with pytest.raises(SessionLimitError, match="max_sessions_per_client"):
        RemoteTarget(service.address, plants[3].imm, **REACTOR, **keys["clients"][0])
    second = [
        RemoteTarget(service.address, p.imm, **REACTOR, **keys["clients"][1]) for p in plants[3:6]
    ]
    assert service.stats()["sessions"] == 6  # full: two keys at their quota
    with RemoteTarget(service.address, plants[6].imm, **REACTOR, **keys["clients"][2]) as plant:
        _exact(plants[6], plant)  # a third key still gets in: a squatter's session was evicted
    assert service.stats()["sessions_ended"].get("evicted") == 1
    ends = [e for e in _events(logs, "session-end") if e["reason"] == "evicted"]
    assert ends and ends[0]["client"] in (keys_fingerprint(keys, 0), keys_fingerprint(keys, 1))
    for cloud in squatter + second:
        cloud.close()


@pytest.mark.slow
def test_after_a_restart_a_squatter_reconnecting_first_cannot_lock_out_a_plant(tmp_path):
    """The issue's race: SIGKILL, restart, an attacker's two keys grab every session they can
    before the plant resumes; the plant resumes anyway and stays exact."""
    keys = curve_key_folder(tmp_path, 3)
    options = {"max_sessions": 8, "max_sessions_per_client": 4, **keys["server"]}
    server = ServerProcess(**options)
    address = server.address
    plants = make_plants(9, 30, **REACTOR)
    victim = plants[0]
    cloud = RemoteTarget(
        address, victim.imm, **REACTOR, timeout_s=2.0, attempts=30, **keys["clients"][0]
    )
    squatting: list[RemoteTarget] = []
    state = {"server": server}

    def kill_restart_squat(k: int) -> None:
        if k == 10:
            state["server"].kill()
            state["server"] = ServerProcess(address, **options)
            for i, plant in enumerate(plants[1:]):
                try:
                    squatting.append(
                        RemoteTarget(address, plant.imm, **REACTOR, **keys["clients"][1 + i % 2])
                    )
                except SessionLimitError:
                    pass

    try:
        outputs, _ = run_plant(cloud, victim, after_sample=kill_restart_squat)
        assert cloud.resumed == 1 and len(squatting) == 8  # the table was full when it resumed
        local, _ = run_plant(victim.imm.target, victim)
        assert relative_error(outputs, local) <= RTOL
        cloud.close()
        for squat in squatting:
            squat.close()
    finally:
        summary = state["server"].stop()
    assert summary["sessions_ended"].get("evicted", 0) >= 1  # 2 if a set-up was sent twice


# ------------------------------------------------------------------------------ handshakes
def test_every_refused_handshake_is_counted_by_cause_and_logged(keyed, tmp_path):
    service, keys, logs = keyed
    server_public, pair = _curve_of(keys, 0)
    stranger = zmq.curve_keypair()
    strange = CurveKeyPair(public=stranger[0], secret=stranger[1])
    forged = CurveKeyPair(public=pair.public, secret=stranger[1])  # a listed key, not its secret
    for curve in ((stranger[0], pair), (server_public, strange), (server_public, forged), None):
        channel = _Channel(service.address, timeout_s=3.0, attempts=3, curve=curve)
        with pytest.raises(AuthenticationError):
            channel.request(b"hello")
        channel.close()
    # Which side of a NULL-to-CURVE handshake sees the mismatch first is a race (a client that
    # hangs up first leaves the server a "closed" event), so also greet it in ZMTP 3.0 with
    # mechanism NULL from a raw socket that waits for the server to hang up.
    _greet_with_null_mechanism(service.address)

    def counted() -> bool:
        failed = service.stats()["handshakes"]["failed"]
        return (
            failed.get("cryptographic", 0) >= 2
            and failed.get("mechanism-mismatch", 0) >= 1
            and failed.get("key-not-listed", 0) >= 1
        )

    _wait_for(f"the failed handshakes were not counted: {service.stats()['handshakes']}", counted)
    causes = {e["cause"] for e in _events(logs, "handshake-failed")}
    assert {"cryptographic", "mechanism-mismatch"} <= causes
    (denied, *_) = _events(logs, "denied")
    assert denied["address"] == "127.0.0.1" and denied["client"] == strange.fingerprint


def _greet_with_null_mechanism(address: str) -> None:
    """Send a ZMTP 3.0 greeting with mechanism NULL and wait until the server hangs up."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
    greeting += bytes(1 + 31)  # as-server = 0, filler
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(greeting)
        while raw.recv(4096):  # the server's greeting, then end of stream when it hangs up
            pass


def test_after_a_stop_the_client_error_names_the_stop_not_the_message_size():
    (plant,) = make_plants(1, 3, **REACTOR)
    service = Service("tcp://127.0.0.1:*", log=lambda line: None).start()
    cloud = RemoteTarget(service.address, plant.imm, **REACTOR, timeout_s=1.0, attempts=2)
    xt = plant.imm.encode_state(plant.initial_state)
    with pytest.raises(MessageTooLargeError, match="max_message_bytes"):  # refused before sending
        cloud.advance(np.zeros(2**21 + 1), plant.encoded_inputs[0])
    cloud.advance(xt, plant.encoded_inputs[0])
    service.stop()
    service.join(30)
    with pytest.raises((DisconnectedError, RemoteTimeoutError)) as info:
        cloud.advance(xt, plant.encoded_inputs[1])
    assert "max_message_bytes" not in str(info.value)
    cloud._channel.close()


# ------------------------------------------------------------------------------ connections
CHECK_ULIMIT = """
    import json, resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
    from immersion import InvalidArgumentError
    from immersion.remote.server import Service
    try:
        Service("tcp://127.0.0.1:*", max_connections=500, log=print)
    except InvalidArgumentError as exc:
        refused = [exc.argument, str(exc)]
    service = Service("tcp://127.0.0.1:*", log=print)
    print(json.dumps({"refused": refused, "default": service.max_connections}))
    service.close()
"""


def test_the_connection_cap_is_checked_against_ulimit_at_start_up():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHECK_ULIMIT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    argument, message = result["refused"]
    assert argument == "max_connections" and "ulimit -n is 300" in message
    assert f"at most {300 - FD_RESERVE}" in message
    assert result["default"] == 300 - FD_RESERVE
    with pytest.raises(InvalidArgumentError) as info:
        Service("tcp://127.0.0.1:*", max_sessions=4, max_sessions_per_client=5, log=print)
    assert info.value.argument == "max_sessions_per_client"


def test_connections_over_the_cap_or_rate_are_shed_from_the_flooding_address():
    (plant,) = make_plants(1, 20, **REACTOR)
    logs: list[str] = []
    with Service(
        "tcp://127.0.0.1:*", max_connections=16, connection_rate=10, log=logs.append
    ) as service:
        port = int(service.address.rsplit(":", 1)[1])
        flood = []
        for _ in range(60):  # idle raw TCP connections from another loopback address
            flood.append(
                socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
            )
        _wait_for(
            "the flood was not shed",
            lambda: sum(service.stats()["connections"]["shed"].values()) >= 60 - 16,
        )
        with RemoteTarget(service.address, plant.imm, **REACTOR) as cloud:
            _exact(plant, cloud)  # from 127.0.0.1: its connection is never the one shed
        connections = service.stats()["connections"]
        for peer in flood:
            peer.close()
    assert connections["shed"].get("rate", 0) >= 30  # 60 at once: over a burst of 20
    assert connections["open"] <= 16
    shed_lines = [line for line in logs if "connection-shed" in line]
    assert shed_lines and all("127.0.0.2" in line for line in shed_lines)
    assert len(shed_lines) <= 20  # 10 per window per (address, reason)
