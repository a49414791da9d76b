"""`immersion serve` as a service (issue 19): sessions, keys, limits, faults, signals, logs.

Every test runs on loopback, with a bounded number of samples and time-outs, and stops its
servers itself. Exactness is checked sample by sample against each plant's own local target.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

zmq = pytest.importorskip("zmq")

from immersion import InvalidArgumentError, KeyFileError  # noqa: E402
from immersion.bench.remote import (  # noqa: E402
    bench_remote,
    curve_key_folder,
    make_plants,
    relative_error,
    run_plant,
    run_plants_concurrently,
)
from immersion.cli.main import main  # noqa: E402
from immersion.files import npz_bytes  # noqa: E402
from immersion.remote import wire  # noqa: E402
from immersion.remote.client import (  # noqa: E402
    AuthenticationError,
    DisconnectedError,
    ForbiddenError,
    MalformedRequestError,
    MessageTooLargeError,
    RemoteError,
    RemoteTarget,
    SessionLimitError,
    StaleRekeyError,
    UnknownSessionError,
    _Channel,
    remote_stats,
    stop_server,
)
from immersion.remote.curve import CurveKeyPair, load_curve_secret, new_curve_keys  # noqa: E402
from immersion.remote.kinds import (  # noqa: E402
    TARGET_KINDS,
    TargetKind,
    public_target_matrices,
)
from immersion.remote.process import ServerProcess  # noqa: E402
from immersion.remote.server import Service, _Refusal, _unpack  # noqa: E402
from immersion.remote.wire import (  # noqa: E402
    CLIENT_ERROR_CODES,
    ERROR_CODES,
    endpoint_host,
    is_loopback,
)

REACTOR = {"algorithm": "reactor-controller", "params": {"dt": 0.01}}
RTOL = 1e-12


def _quiet(line: str) -> None:
    """A log sink that drops the lines."""


def _assert_equal_to_local(plants, outputs) -> None:
    for plant, out in zip(plants, outputs, strict=True):
        local, _ = run_plant(plant.imm.target, plant)
        assert relative_error(out, local) <= RTOL, plant.index


def _raw(address: str, frames: list[bytes], *, curve=None, timeout_s: float = 5.0):
    """Send raw frames on a fresh DEALER; the reply frames, or None without one in time."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve is not None:
        server_public, pair = curve
        sock.curve_serverkey, sock.curve_publickey = server_public, pair.public
        sock.curve_secretkey = pair.secret
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart() if sock.poll(int(timeout_s * 1000)) else None
    finally:
        sock.close()


def _channel(address: str, curve=None, *, timeout_s: float = 5.0) -> _Channel:
    return _Channel(address, timeout_s=timeout_s, attempts=1, curve=curve)


def _pair(secret_path: Path) -> CurveKeyPair:
    return load_curve_secret(secret_path)


def _curve_of(keys: dict[str, Any], index: int):
    """(server public key, client pair) of client ``index`` in a :func:`curve_key_folder`."""
    from immersion.remote.curve import load_curve_public

    entry = keys["clients"][index]
    return load_curve_public(entry["server_key"]), _pair(entry["client_key"])


# ------------------------------------------------------------------------------------ addresses
def test_loopback_addresses_are_told_apart_from_others():
    assert is_loopback("tcp://127.0.0.1:5555") and is_loopback("tcp://127.3.2.1:5555")
    assert is_loopback("tcp://[::1]:5555") and is_loopback("tcp://localhost:5555")
    assert is_loopback("ipc:///tmp/immersion.sock") and is_loopback("tcp://lo:5555")
    assert is_loopback("tcp://127.0.0.1:*", bind=True)
    for other in ("tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.0.0.5:5555", "tcp://eth0:1"):
        assert not is_loopback(other, bind=True), other
    for bad in ("", "nope://x", "tcp://", "tcp://host", "tcp://h:0", "tcp://h:70000", "tcp://h:*"):
        with pytest.raises(InvalidArgumentError) as info:
            endpoint_host(bad)
        assert info.value.argument == "address"


def test_without_keys_only_loopback_is_served_or_reached():
    with pytest.raises(InvalidArgumentError) as info:
        Service("tcp://0.0.0.0:*", log=_quiet)
    assert info.value.argument == "bind" and "loopback" in str(info.value)
    result = CliRunner().invoke(main, ["serve", "--bind", "tcp://0.0.0.0:5555"])
    assert result.exit_code == 2 and "loopback" in result.output
    (plant,) = make_plants(1, 1, **REACTOR)
    with pytest.raises(InvalidArgumentError) as info:  # refused before any connection
        RemoteTarget("tcp://192.0.2.7:5555", plant.imm, **REACTOR)
    assert info.value.argument == "server_key"


def test_every_error_code_is_documented_once_with_its_class():
    import immersion.remote.client as remote

    classes = {
        cls.code: cls
        for cls in vars(remote).values()
        if isinstance(cls, type) and issubclass(cls, RemoteError) and cls is not RemoteError
    }
    assert not set(ERROR_CODES) & set(CLIENT_ERROR_CODES)
    assert set(classes) <= set(ERROR_CODES) | set(CLIENT_ERROR_CODES)
    assert set(CLIENT_ERROR_CODES) <= set(classes)  # each client-side code has its class
    for code, text in CLIENT_ERROR_CODES.items():
        assert classes[code].__name__ in text, code
    assert set(remote._ERRORS) <= set(ERROR_CODES)


# ------------------------------------------------------------------------------------ key files
def test_keys_curve_writes_owner_only_files_and_refuses_bad_ones(tmp_path):
    runner = CliRunner()
    out = runner.invoke(
        main, ["keys", "curve", "--out", str(tmp_path / "k"), "--name", "plant-1", "--json"]
    )
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    for path in (info["public"], info["secret"]):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "k").st_mode) == 0o700
    pair = load_curve_secret(info["secret"])
    assert pair.public.decode() == info["public_key"] and "secret" not in repr(pair).replace(
        "secret=<hidden>", ""
    )
    again = runner.invoke(
        main, ["keys", "curve", "--out", str(tmp_path / "k"), "--name", "plant-1"]
    )
    assert again.exit_code == 2 and "exists" in again.output
    bad = runner.invoke(main, ["keys", "curve", "--out", str(tmp_path), "--name", "../x"])
    assert bad.exit_code == 2 and "name" in bad.output
    os.chmod(info["secret"], 0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_curve_secret(info["secret"])
    _, other = new_curve_keys(tmp_path / "k", "other")
    mixed = tmp_path / "mixed.key_secret"  # one key's public line with another's secret line
    lines = Path(info["secret"]).read_text().splitlines()
    mixed.write_text("\n".join([*lines[:-1], Path(other).read_text().splitlines()[-1]]) + "\n")
    os.chmod(mixed, 0o600)
    with pytest.raises(KeyFileError, match="does not belong"):
        load_curve_secret(mixed)
    with pytest.raises(KeyFileError, match="no secret key"):
        load_curve_secret(info["public"])


# ------------------------------------------------------------------------------------ sessions
def test_twelve_plants_and_a_rogue_client_each_get_their_own_target():
    """The issue's run: 12 plants with their own keys and a rogue client on the same port."""
    plants = make_plants(12, 120, **REACTOR)
    logs: list[str] = []
    with Service("tcp://127.0.0.1:*", log=logs.append) as service:
        rogue_errors: list[BaseException] = []

        def rogue() -> None:
            channel = _channel(service.address)
            try:
                for request in (
                    (b"stop",),
                    (b"setup", b"{not json", b"x"),
                    (b"setup", b'{"coding": "immersion", "algorithm": "reactor-controller"}', b"x"),
                    (b"advance", b"0" * 16, b"\0" * 32, b"\0" * 24),
                    (b"advance", b"short"),
                ):
                    with pytest.raises(RemoteError) as info:
                        channel.request(*request)
                    rogue_errors.append(info.value)
            finally:
                channel.close()

        thread = threading.Thread(target=rogue)
        thread.start()
        outputs, _, resumed, _ = run_plants_concurrently(service.address, plants, **REACTOR)
        thread.join(10)
        assert service.stats()["sessions"] == 0  # every plant closed its own session
    assert [type(e) for e in rogue_errors] == [
        ForbiddenError,
        MalformedRequestError,
        MalformedRequestError,
        UnknownSessionError,
        MalformedRequestError,
    ]
    assert resumed == [0] * 12
    _assert_equal_to_local(plants, outputs)
    assert sum(line.startswith("immersion serve: setup ") for line in logs) == 12


def test_an_idle_session_expires_and_the_client_sets_it_up_again():
    (plant,) = make_plants(1, 10, **REACTOR)
    logs: list[str] = []
    with Service("tcp://127.0.0.1:*", session_idle_s=0.2, log=logs.append) as service:
        cloud = RemoteTarget(service.address, plant.imm, **REACTOR)
        gap = {"done": False}

        def wait_for_expiry(k: int) -> None:
            if k == 4 and not gap["done"]:
                deadline = time.monotonic() + 10
                while not any("reason=idle" in line for line in logs):
                    assert time.monotonic() < deadline, "the session did not expire"
                    time.sleep(0.05)
                gap["done"] = True

        outputs, _ = run_plant(cloud, plant, after_sample=wait_for_expiry)
        assert cloud.resumed == 1
        cloud.close()
    _assert_equal_to_local([plant], [outputs])


def test_json_log_has_a_progress_line_per_active_session():
    (plant,) = make_plants(1, 25, **REACTOR)
    logs: list[str] = []
    with Service("tcp://127.0.0.1:*", log=logs.append, json_log=True, log_every_s=0.05) as service:
        with RemoteTarget(service.address, plant.imm, **REACTOR) as cloud:
            run_plant(cloud, plant)
            deadline = time.monotonic() + 10
            while not any('"samples": 25' in line and '"session"' in line for line in logs):
                assert time.monotonic() < deadline, logs
                time.sleep(0.05)
    events = [json.loads(line) for line in logs]
    progress = [e for e in events if e["event"] == "session"]
    assert progress[-1]["samples"] == 25 and progress[-1]["errors"] == 0
    assert progress[-1]["p50_us"] <= progress[-1]["p99_us"]
    assert len({e["samples"] for e in progress}) == len(progress)  # only when samples moved on
    assert [e["event"] for e in events][-2:] == ["stopping", "stopped"]


def test_the_session_cap_is_a_named_error_and_frees_up_on_close():
    plants = make_plants(3, 2, **REACTOR)
    with Service("tcp://127.0.0.1:*", max_sessions=2, log=_quiet) as service:
        first, second = (RemoteTarget(service.address, p.imm, **REACTOR) for p in plants[:2])
        with pytest.raises(SessionLimitError, match="maximum of 2"):
            RemoteTarget(service.address, plants[2].imm, **REACTOR)
        first.close()
        third = RemoteTarget(service.address, plants[2].imm, **REACTOR)
        assert (
            relative_error(
                run_plant(third, plants[2])[0], run_plant(plants[2].imm.target, plants[2])[0]
            )
            == 0
        )
        second.close()
        third.close()


class _SlowTarget:
    """A target kind for tests: sleeps (releasing the GIL) before answering."""

    n_state_encoded = n_input_encoded = 1

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def advance(self, xt, yt):
        time.sleep(self.seconds)
        return np.asarray(xt) + 1, np.asarray(yt) + 1


class _SlowHandle:
    coding = "slow"


SLOW = TargetKind(
    "slow",
    np.float64,
    public_arrays=lambda imm: {"seconds": np.array([1.5])},
    build=lambda header, arrays: _SlowTarget(float(arrays["seconds"][0])),
)


@pytest.mark.parametrize("workers", [2, 0])
def test_a_slow_plant_does_not_hold_up_the_others(workers, monkeypatch):
    """With worker threads, 50 fast samples finish while one slow sample is computed; with
    workers=0 (everything on the socket thread) they wait behind it (the control)."""
    monkeypatch.setitem(TARGET_KINDS, "slow", SLOW)
    (plant,) = make_plants(1, 50, **REACTOR)
    with Service("tcp://127.0.0.1:*", workers=workers, kinds=TARGET_KINDS, log=_quiet) as svc:
        slow = RemoteTarget(svc.address, _SlowHandle(), timeout_s=10)
        fast = RemoteTarget(svc.address, plant.imm, **REACTOR)
        slow_answered = threading.Event()
        sent = threading.Event()

        def slow_sample() -> None:
            sent.set()
            assert slow.advance([1.0], [2.0])[0].tolist() == [2.0]
            slow_answered.set()

        thread = threading.Thread(target=slow_sample, daemon=True)
        thread.start()
        assert sent.wait(10)
        time.sleep(0.2)  # the slow request is in the server before the fast plant starts
        outputs, _ = run_plant(fast, plant)
        fast_first = not slow_answered.is_set()
        thread.join(10)
        slow.close()
        fast.close()
    assert fast_first is (workers > 0)
    _assert_equal_to_local([plant], [outputs])


# ------------------------------------------------------------------------ keys and intruders
@pytest.fixture
def keyed_service(tmp_path):
    keys = curve_key_folder(tmp_path, 3)
    logs: list[str] = []
    service = Service(
        "tcp://127.0.0.1:*",
        max_message_bytes=2**20,
        log=logs.append,
        json_log=True,
        **keys["server"],
    )
    with service:
        yield service, keys, logs


def test_intruders_and_bad_input_are_refused_by_name_and_change_no_session(keyed_service, tmp_path):
    service, keys, logs = keyed_service
    address = service.address
    (victim, other) = make_plants(2, 60, **REACTOR)
    cloud = RemoteTarget(address, victim.imm, **REACTOR, **keys["clients"][0])
    first, _ = run_plant(cloud, victim)  # 60 samples before the intruders
    before = {s["session"]: s for s in service.stats()["per_session"]}
    listed = _curve_of(keys, 1)
    server_public = listed[0]

    # unknown session, and a listed client naming the victim's session (hijack)
    channel = _channel(address, listed)
    with pytest.raises(UnknownSessionError):
        channel.request(b"advance", os.urandom(16), b"\0" * 32, b"\0" * 24)
    with pytest.raises(UnknownSessionError):
        channel.request(b"advance", cloud._session, b"\0" * 32, b"\0" * 24)
    with pytest.raises(UnknownSessionError):
        channel.request(b"close", cloud._session)
    # anonymous-to-the-admin requests: a listed client is not an admin
    with pytest.raises(ForbiddenError):
        channel.request(b"stop")
    with pytest.raises(ForbiddenError):
        channel.request(b"stats")
    # oversized: a set-up over max_message_bytes (the client checks the server's limit) ...
    with pytest.raises(MessageTooLargeError):
        channel.request(b"setup", b"{}", b"\0" * (2**19), b"\0" * (2**19))
    # ... and one frame over it: ZeroMQ drops the connection before reading it
    with pytest.raises(DisconnectedError) as info:
        _Channel(address, timeout_s=1.0, attempts=2, curve=listed).request(
            b"setup", b"{}", b"\0" * (2**20 + 1)
        )
    assert info.value.code == "disconnected" and "max_message_bytes" in str(info.value)
    # malformed frames, each with its code and what its message names
    for frames, code, names in (
        ([b"advance"], "malformed", "expected frames"),
        ([b"", b"advance"], "malformed", "expected frames"),
        ([b"", b"advance", b"r" * 17], "malformed", "request_id (1-16 bytes)"),
        ([b"", b"bogus", b"rid"], "unknown-request", "unknown request b'bogus'"),
        ([b"", b"setup", b"rid", b"{}"], "malformed", "setup: expected a JSON header"),
        ([b"", b"setup", b"rid", b"[1, 2]", b"x"], "malformed", "not a JSON object"),
        ([b"", b"setup", b"rid", b'{"algorithm": "reactor-controller"}', b"not an npz"],
         "malformed", "setup: the arrays are not an .npz file"),
        ([b"", b"advance", b"rid", cloud._session], "malformed", "advance: expected 3 frames"),
    ):  # fmt: skip
        reply = _raw(address, frames, curve=listed)
        assert reply is not None and reply[-3] == b"error", frames
        assert reply[-2].decode() == code and names in reply[-1].decode(), (frames, reply)
    # wrong keys: unlisted pair, listed public key with another secret, wrong server key, none
    _, stranger = new_curve_keys(tmp_path / "strangers", "stranger")
    stranger_pair = _pair(stranger)
    impostor = CurveKeyPair(public=listed[1].public, secret=stranger_pair.secret)
    for curve, why in (
        ((server_public, stranger_pair), "refused this client's public key"),
        ((server_public, impostor), "handshake"),
        ((stranger_pair.public, listed[1]), "handshake"),
        (None, "handshake"),
    ):
        with pytest.raises(AuthenticationError, match=why):
            _channel(address, curve, timeout_s=3.0).request(b"hello")
    channel.close()

    # the victim's session is unchanged and goes on exactly
    after = {s["session"]: s for s in service.stats()["per_session"]}
    assert list(after) == list(before)
    (sid,) = after
    assert (after[sid]["samples"], after[sid]["errors"]) == (before[sid]["samples"], 0)
    second, _ = run_plant(cloud, victim)
    cloud.close()
    local, _ = run_plant(victim.imm.target, victim)
    assert relative_error(first, local) <= RTOL and relative_error(second, local) <= RTOL
    # a second listed client still works, and the refusals were logged by name
    with RemoteTarget(address, other.imm, **REACTOR, **keys["clients"][2]) as cloud2:
        assert (
            relative_error(run_plant(cloud2, other)[0], run_plant(other.imm.target, other)[0])
            <= RTOL
        )
    events = [json.loads(line) for line in logs]
    refused = {e["code"] for e in events if e["event"] == "refused"}
    assert {"unknown-session", "forbidden", "message-too-large", "malformed"} <= refused
    assert any(e["event"] == "denied" for e in events)
    assert service.stats()["handshakes_denied"] >= 1


def _npy(shape: tuple[int, ...], descr: str = "<f8", data: bytes = b"") -> bytes:
    """The bytes of a ``.npy`` file whose header declares ``shape`` (``data`` may lie about it)."""
    out = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue() + data


def _zip(members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return out.getvalue()


def _deflate_bomb(shape: tuple[int, int]) -> bytes:
    """A ``savez_compressed`` file of zeros of ``shape``, written in pieces (never in memory)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("Pi1_left.npy", "w", force_zip64=True) as member:
            member.write(_npy(shape))
            zeros = bytes(2**20)
            for _ in range(shape[0] * shape[1] * 8 // len(zeros)):
                member.write(zeros)
    return out.getvalue()


def test_a_setup_or_rekey_archive_is_read_within_the_message_cap():
    """The arrays of a set-up or a rekey never take more memory than the frame: compressed
    members, headers declaring more than the cap or the frame, foreign names and object dtypes
    are refused by name before any array data is read; the server and the other session go on."""
    import tracemalloc

    (victim, intruder) = make_plants(2, 30, **REACTOR)
    matrices = public_target_matrices(intruder.imm.keys)
    compressed = io.BytesIO()
    np.savez_compressed(compressed, **matrices)  # the right matrices, deflated
    cap = 2**20
    bomb = _deflate_bomb((4096, 2048))  # 64 MiB of float64 zeros in about 64 kB
    assert len(bomb) < cap // 8
    cases = {
        "compressed members": (compressed.getvalue(), "malformed", "'Pi1_left' is compressed"),
        "deflate bomb": (bomb, "malformed", "is compressed"),
        "a header over the cap": (_zip({"Pi1_left.npy": _npy((2**40,), data=b"\0" * 16)}),
                                  "message-too-large", r"declare \d+ bytes or more, over"),
        "a header over the frame": (_zip({"Pi1_left.npy": _npy((100_000,), data=b"\0" * 16)}),
                                    "malformed", "more data than the frame holds"),
        "an unknown member": (_zip({"evil.npy": _npy((1,), data=b"\0" * 8)}),
                              "malformed", "unexpected member 'evil.npy'"),
        "an object dtype": (_zip({"Pi2.npy": _npy((1,), descr="|O", data=b"\0" * 8)}),
                            "malformed", "'Pi2' has an object dtype"),
        "a missing matrix": (npz_bytes({k: m for k, m in matrices.items() if k != "Pi4"}),
                             "malformed", r"missing arrays \['Pi4'\]"),
        "not a zip": (b"not an npz", "malformed", "not an .npz file"),
    }  # fmt: skip
    with Service("tcp://127.0.0.1:*", max_message_bytes=cap, log=_quiet) as service:
        cloud = RemoteTarget(service.address, victim.imm, **REACTOR)
        first, _ = run_plant(cloud, victim)
        own = RemoteTarget(service.address, intruder.imm, **REACTOR)
        state = intruder.imm.encode_state(intruder.initial_state).tobytes()
        origin = hashlib.sha256(own._setup_frames[1]).digest()
        channel = _channel(service.address, timeout_s=30.0)
        header = json.dumps(REACTOR).encode()
        for name, (blob, code, message) in cases.items():
            for request, frames in (
                ("setup", (wire.SETUP, header, blob)),
                ("rekey", (wire.REKEY, own._session, origin, state, blob)),
            ):
                tracemalloc.start()
                try:
                    with pytest.raises(RemoteError) as info:
                        channel.request(*frames)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                assert info.value.code == code, (name, request, info.value)
                assert re.search(f"remote: {request}: .*{message}", str(info.value)), info.value
                assert peak < 8 * 2**20, (name, request, peak)  # the bomb would take 64 MiB
                assert channel.request(wire.HELLO)  # still up
        channel.close()
        rows = {r["session"]: r for r in service.stats()["per_session"]}
        victim_row = rows[cloud._session[:4].hex()]
        intruder_row = rows[own._session[:4].hex()]
        assert (victim_row["samples"], victim_row["rekeys"], victim_row["errors"]) == (30, 0, 0)
        assert (intruder_row["rekeys"], intruder_row["errors"]) == (0, len(cases))
        assert service.stats()["sessions"] == 2  # no refused set-up opened a session
        second, _ = run_plant(cloud, victim)
        mine, _ = run_plant(own, intruder)  # the intruder's own session still runs its old keys
        cloud.close()
        own.close()
    local, _ = run_plant(victim.imm.target, victim)
    assert relative_error(first, local) <= RTOL and relative_error(second, local) <= RTOL
    assert relative_error(mine, run_plant(intruder.imm.target, intruder)[0]) <= RTOL


def test_unpack_reads_stored_arrays_of_any_layout_exactly():
    arrays = {
        "Pi1_left": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "Pi2": np.arange(6, dtype=">f8").reshape(2, 3),
        "Pi2_left": np.zeros((0, 3)),
        "Pi3": np.array([[1.5]]),
        "Pi4": np.arange(4, dtype=np.uint64).reshape(2, 2),
    }
    names = frozenset(arrays)
    out = _unpack(npz_bytes(arrays), what="setup", limit=2**20, names=names)
    assert sorted(out) == sorted(arrays)
    for key, value in arrays.items():
        assert out[key].dtype == value.dtype and np.array_equal(out[key], value), key
        assert out[key].flags.writeable
    with pytest.raises(_Refusal) as info:  # the declared sizes count, not the frame's
        _unpack(npz_bytes(arrays), what="rekey", limit=100, names=names)
    assert info.value.code == "message-too-large" and info.value.message.startswith("rekey: ")


def test_unpack_parses_npy_headers_without_ast(monkeypatch):
    """CPython 3.11's AST constructor is not thread-safe (a spurious SystemError when two
    workers unpack set-ups at once), so headers are read by a strict pattern, never by ast."""
    import ast

    def no_ast(*args, **kwargs):
        raise AssertionError("ast used")

    monkeypatch.setattr(ast, "literal_eval", no_ast)  # what numpy's header parser calls
    arrays = {"Pi3": np.arange(6.0).reshape(2, 3), "Pi4": np.float64(2.5)}
    out = _unpack(npz_bytes(arrays), what="setup", limit=2**20, names=frozenset(arrays))
    assert all(np.array_equal(out[k], v) for k, v in arrays.items())
    odd = io.BytesIO()  # a header numpy's ast parser would read: fortran_order None
    np.lib.format.write_array_header_1_0(
        odd, {"descr": "<f8", "fortran_order": None, "shape": (2,)}
    )
    blob = _zip({"Pi3.npy": odd.getvalue() + b"\0" * 16})
    with pytest.raises(_Refusal) as info:
        _unpack(blob, what="setup", limit=2**20, names=frozenset({"Pi3"}))
    assert info.value.code == "malformed" and "header numpy does not write" in info.value.message


@given(frames=st.lists(st.binary(max_size=40), max_size=6))
def test_any_frames_get_a_named_answer_and_the_server_stays_up(frames, loopback_service):
    reply = _raw(loopback_service.address, [b"", *frames], timeout_s=5)
    assert reply is not None
    status = reply[2] if len(reply) > 2 else b""
    if status == b"error":
        assert reply[3].decode() in ERROR_CODES
    else:
        assert status == b"ok" and frames[0] in (b"hello", b"close", b"advance")
    assert _channel(loopback_service.address).request(b"hello")


@pytest.fixture(scope="module")
def loopback_service():
    with Service("tcp://127.0.0.1:*", log=_quiet) as service:
        yield service


def test_admin_stats_and_stop_need_an_admin_key(keyed_service):
    service, keys, logs = keyed_service
    (plant,) = make_plants(1, 20, **REACTOR)
    with RemoteTarget(service.address, plant.imm, **REACTOR, **keys["clients"][0]) as cloud:
        run_plant(cloud, plant)
        stats = remote_stats(
            service.address, server_key=keys["server_public"], admin_key=keys["admin"]
        )
        (row,) = stats["per_session"]
        assert row["samples"] == 20 and row["errors"] == 0 and row["p50_us"] <= row["p99_us"]
        assert stats["requests"] == stats["replies"] + 1  # this stats request is the one in flight
    admin = ["--server-key", str(keys["server_public"]), "--admin-key", str(keys["admin"])]
    out = CliRunner().invoke(main, ["remote", "stats", service.address, *admin, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["sessions_ended"] == {"closed": 1}
    client_key = keys["clients"][0]["client_key"]
    with pytest.raises(ForbiddenError):  # a listed client key is not an admin key
        stop_server(service.address, server_key=keys["server_public"], admin_key=client_key)
    with pytest.raises(InvalidArgumentError) as info:
        stop_server(service.address, server_key=keys["server_public"], admin_key=None)
    assert info.value.argument == "admin_key"
    out = CliRunner().invoke(main, ["remote", "stop", service.address, *admin])
    assert out.exit_code == 0, out.output
    service.join(30)  # generous: CI machines may be loaded
    assert not service._thread.is_alive()
    events = [json.loads(line) for line in logs]
    ends = [e for e in events if e["event"] == "session-end"]
    assert ends[0]["samples"] == 20 and ends[0]["reason"] == "closed"
    assert events[-2]["event"] == "stopping" and events[-2]["reason"].startswith("stop from admin")


# ------------------------------------------------------------------ faults (child processes)
@pytest.mark.slow
def test_sigkill_and_restart_every_client_resumes_and_ends_equal_to_an_uninterrupted_run(tmp_path):
    keys = curve_key_folder(tmp_path, 4)
    plants = make_plants(4, 150, **REACTOR)
    server = ServerProcess(**keys["server"])
    address = server.address
    state = {"server": server, "killed": False}

    def kill_and_restart(plant: int, k: int) -> None:
        if plant == 0 and k == 30 and not state["killed"]:
            state["server"].kill()  # no clean-up: the other plants' requests are in flight
            state["killed"] = True
            assert state["server"].returncode == -signal.SIGKILL
            state["server"] = ServerProcess(address, **keys["server"])

    try:
        outputs, _, resumed, _ = run_plants_concurrently(
            address, plants, **REACTOR, keys=keys["clients"], timeout_s=2.0, attempts=60,
            after_sample=kill_and_restart,
        )  # fmt: skip
    finally:
        summary = state["server"].stop()
    assert state["killed"] and resumed == [1, 1, 1, 1]
    _assert_equal_to_local(plants, outputs)
    assert state["server"].returncode == 0
    assert summary["sessions_created"] == 4 and summary["requests"] == summary["replies"]


@pytest.mark.slow
def test_stop_after_kill_waits_and_returns_no_stats():
    """The fault test's clean-up: stop() on a killed server must not raise (it would hide the
    error that made the test stop)."""
    server = ServerProcess()
    server.kill()
    assert server.stop() is None and server.returncode == -signal.SIGKILL


KILLED_CLIENT = textwrap.dedent(
    """
    import os, signal, sys
    import zmq
    from immersion.remote.client import RemoteTarget
    from immersion.bench.remote import make_plants
    address, how = sys.argv[1], sys.argv[2]
    (plant,) = make_plants(1, 5, algorithm="reactor-controller", params={"dt": 0.01}, seed=9)
    cloud = RemoteTarget(address, plant.imm, algorithm="reactor-controller", params={"dt": 0.01})
    xt = plant.imm.encode_state(plant.initial_state)
    for yt in plant.encoded_inputs[:3]:
        ut, xt = cloud.advance(xt, yt)
    sock = cloud._channel._sock
    if how == "waiting":  # the request reached the server; the client dies before the reply
        sock.send_multipart([b"", b"advance", b"12345678", cloud._session, xt.tobytes(),
                             plant.encoded_inputs[3].tobytes()])
    else:  # a 12 MB set-up (under the cap), the client dies while ZeroMQ still sends it
        sock.send_multipart([b"", b"setup", b"12345678", b"{}", os.urandom(12 * 2**20)])
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.slow
def test_a_client_killed_mid_request_leaves_the_server_and_other_sessions_unharmed():
    (victim,) = make_plants(1, 40, **REACTOR)
    with Service("tcp://127.0.0.1:*", log=_quiet) as service:
        cloud = RemoteTarget(service.address, victim.imm, **REACTOR)
        first, _ = run_plant(cloud, victim)
        for how in ("waiting", "sending"):
            done = subprocess.run(
                [sys.executable, "-c", KILLED_CLIENT, service.address, how], timeout=120
            )
            assert done.returncode == -signal.SIGKILL
        second, _ = run_plant(cloud, victim)
        stats = service.stats()
        assert stats["sessions"] == 3  # the victim's and the two dead clients' (until idle expiry)
        victim_row = next(
            r for r in stats["per_session"] if r["session"] == cloud._session[:4].hex()
        )
        assert victim_row["samples"] == 80 and victim_row["errors"] == 0
        cloud.close()
    local, _ = run_plant(victim.imm.target, victim)
    assert relative_error(first, local) <= RTOL and relative_error(second, local) <= RTOL


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_anonymous_stop_is_refused_and_a_signal_stops_cleanly(sig):
    (plant,) = make_plants(1, 100_000, **REACTOR)
    server = ServerProcess()
    try:
        with pytest.raises(ForbiddenError):
            _channel(server.address).request(b"stop")
        assert _channel(server.address).request(b"hello")  # still up
        cloud = RemoteTarget(server.address, plant.imm, **REACTOR, timeout_s=1.0, attempts=1)
        served: dict[str, Any] = {"n": 0, "error": None}

        def stream() -> None:
            try:
                run_plant(cloud, plant, after_sample=lambda k: served.__setitem__("n", k + 1))
            except RemoteError as exc:
                served["error"] = exc  # the server is gone (expected once it is stopped)

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while served["n"] < 50:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail(
                    f"{served['n']} samples served before the signal, 50 expected "
                    f"(client error: {served['error']!r}; server log: {server.events[-5:]})"
                )
            time.sleep(0.01)
    finally:
        summary = server.stop(sig)
    thread.join(10)
    assert not thread.is_alive(), "the client did not notice the server's exit"
    assert server.returncode == 0
    assert summary["requests"] == summary["replies"] and summary["samples"] >= 50
    stopping = next(e for e in server.events if e["event"] == "stopping")
    assert stopping["reason"] == sig.name
    assert summary["refused"] == {"forbidden": 1}


SLOW_SERVER = textwrap.dedent(
    """
    import json, pathlib, sys, time
    import numpy as np
    from immersion.remote.kinds import TARGET_KINDS, TargetKind
    from immersion.remote.server import Service, serve

    started = pathlib.Path(sys.argv[1])

    class Slow:
        n_state_encoded = n_input_encoded = 1

        def __init__(self, seconds):
            self.seconds = seconds

        def advance(self, xt, yt):
            started.touch()  # the request is in a worker now
            time.sleep(self.seconds)
            return np.asarray(xt) + 1, np.asarray(yt) + 1

    slow = TargetKind("slow", np.float64, lambda imm: {}, lambda h, a: Slow(float(a["seconds"][0])))
    service = Service("tcp://127.0.0.1:*", kinds={**TARGET_KINDS, "slow": slow}, json_log=True)
    print(service.address, flush=True)
    print(json.dumps(serve(service)), flush=True)
    """
)


def _wait_for(what: str, check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:g} s")
        time.sleep(0.01)


@pytest.mark.slow
def test_a_signal_lets_the_request_in_a_worker_finish_and_exits_0(tmp_path, monkeypatch):
    """SIGTERM while a 1.5 s sample sits in a worker thread: it is answered, then exit code 0."""
    import select

    monkeypatch.setitem(TARGET_KINDS, "slow", SLOW)
    started = tmp_path / "started"
    server = subprocess.Popen(
        [sys.executable, "-c", SLOW_SERVER, str(started)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([server.stdout], [], [], 120)[0], "the server did not start"
        address = server.stdout.readline().strip()
        cloud = RemoteTarget(address, _SlowHandle(), timeout_s=30, attempts=1)
        result: dict[str, Any] = {}

        def sample() -> None:
            try:
                result["reply"] = [v.tolist() for v in cloud.advance([1.0], [2.0])]
            except RemoteError as exc:
                result["error"] = exc

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        _wait_for("the slow sample did not reach a worker", started.exists)
        server.send_signal(signal.SIGTERM)
        thread.join(30)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert result == {"reply": [[2.0], [3.0]]}
    assert server.returncode == 0
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    stopping = next(e for e in events if e["event"] == "stopping")
    assert (stopping["reason"], stopping["in_flight"]) == ("SIGTERM", 1)
    summary = json.loads(out.splitlines()[-1])
    assert summary["samples"] == 1 and summary["requests"] == summary["replies"] == 3
    cloud.close()


# ------------------------------------------------------------------------------------ load
@pytest.mark.slow
def test_load_eight_plants_each_equal_to_its_own_local_target():
    """The benchmark at 8 plants x 200 samples (the 50 x 2,000 run is `immersion bench remote`)."""
    result = bench_remote(plants=8, samples=200)
    assert result["max_rel_error_vs_local"] <= RTOL
    requests = 9 * (200 + 3) + 1  # hello, setup, advances, close per plant; one admin stats
    assert result["server_exit"] == {
        "code": 0,
        "requests": requests,
        "replies": requests,
        "samples": 9 * 200,
    }
    assert result["resumed_sessions"] == 0
    for part in ("single_plant", "concurrent"):
        assert 0 < result[part]["p50_us"] <= result[part]["p99_us"]
    assert result["server_service_us"]["p50_us"] > 0


@pytest.mark.slow
def test_bench_remote_writes_its_json_to_out(tmp_path):
    out = tmp_path / "figures" / "remote" / "bench.json"
    args = ["bench", "remote", "--plants", "2", "--samples", "20", "--no-curve", "--json"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved == json.loads(result.stdout.splitlines()[-1])
    assert saved["max_rel_error_vs_local"] <= RTOL and saved["server_exit"]["code"] == 0


# ------------------------------------------------------------------------------------ key rotation
def _rotating_loop(cloud_of: Any, samples: int = 12) -> tuple[np.ndarray, np.ndarray, int]:
    """A reactor controller with keys rotated every 2 samples; ``cloud_of(rot)`` is the cloud.

    Returns the decoded inputs, the decoded controller states and the last key period.
    """
    from immersion.coding.rotation import RotatingImmersion, RotatingTarget
    from immersion_reactor.model import ReactorController

    ctrl = ReactorController(dt=0.01)
    rot = RotatingImmersion(
        ctrl.f,
        ctrl.g,
        3,
        1,
        1,
        rotate_keys_every=2,
        keys="dense",
        rng=5,
        probe=(ctrl.initial_state, np.array([0.3])),
    )
    cloud = cloud_of(rot)
    xt = rot.encode_state(ctrl.initial_state)
    us, xs = [], []
    for k in range(samples):
        yt = rot.encode_input(np.array([0.3 * np.cos(0.4 * k)]))
        ut, xt = cloud.advance(xt, yt)
        us.append(rot.decode_output(ut, yt))
        rotation = rot.tick()
        if rotation is not None:
            if isinstance(cloud, RotatingTarget):
                xt = cloud.rekey(rotation, xt)
            else:
                xt = cloud.rekey(rot.current, xt)
        xs.append(rot.decode_state(xt))
    return np.array(us), np.array(xs), rot.period


def test_rekey_rotates_a_remote_session_exactly_and_only_for_its_owner(keyed_service):
    service, keys, logs = keyed_service
    clouds: list[RemoteTarget] = []

    def remote(rot: Any) -> RemoteTarget:
        clouds.append(RemoteTarget(service.address, rot.current, **REACTOR, **keys["clients"][0]))
        return clouds[0]

    u_remote, x_remote, periods = _rotating_loop(remote)
    u_local, x_local, _ = _rotating_loop(lambda rot: rot.cloud)
    assert periods == 6
    # the same keys and noise in both loops: the remote rotation is the in-process one
    assert relative_error(u_remote, u_local) <= RTOL and relative_error(x_remote, x_local) <= RTOL
    cloud = clouds[0]
    (entry,) = service.stats()["per_session"]
    assert (entry["rekeys"], entry["samples"], entry["errors"]) == (6, 12, 0)

    # another listed client cannot rotate (or learn of) the session; a bad rekey changes nothing
    channel = _channel(service.address, _curve_of(keys, 1))
    state = np.zeros(cloud.n_state_encoded).tobytes()
    npz = cloud._setup_frames[1]
    origin = hashlib.sha256(npz).digest()  # the arrays the session runs
    with pytest.raises(UnknownSessionError):
        channel.request(b"rekey", cloud._session, origin, state, npz)
    channel.close()
    owner = _channel(service.address, _curve_of(keys, 0))
    other = make_plants(1, 1, **REACTOR)[0].imm.keys
    bigger = {k: np.pad(m, 1) for k, m in public_target_matrices(other).items()}
    with pytest.raises(RemoteError) as info:  # wrong sizes: keys of another design
        owner.request(b"rekey", cloud._session, origin, state, npz_bytes(bigger))
    assert info.value.code == "invalid-argument"
    with pytest.raises(RemoteError) as info:  # a non-finite state
        owner.request(
            b"rekey", cloud._session, origin, np.full(cloud.n_state_encoded, np.nan).tobytes(), npz
        )
    assert info.value.code == "invalid-argument"
    owner.close()
    (entry,) = service.stats()["per_session"]
    assert (entry["rekeys"], entry["errors"]) == (6, 2)
    cloud.close()


def _rotating_reactor(rotate_keys_every: int = 2) -> tuple[Any, Any]:
    from immersion.coding.rotation import RotatingImmersion
    from immersion_reactor.model import ReactorController

    ctrl = ReactorController(dt=0.01)
    rot = RotatingImmersion(
        ctrl.f,
        ctrl.g,
        3,
        1,
        1,
        rotate_keys_every=rotate_keys_every,
        keys="dense",
        rng=5,
        probe=(ctrl.initial_state, np.array([0.3])),
    )
    return rot, ctrl


def test_a_rekey_resent_after_a_lost_reply_rotates_once(keyed_service):
    """RemoteTarget resends a request whose reply does not come; for a rekey the server answers
    the resend with the first reply (it names the keys it rotates from), so the loop stays
    equal to the in-process rotation."""
    service, keys, _ = keyed_service
    lost: list[bytes] = []
    resent: list[bytes] = []

    def remote(rot: Any) -> RemoteTarget:
        cloud = RemoteTarget(service.address, rot.current, **REACTOR, **keys["clients"][0])
        channel, wait = cloud._channel, cloud._channel._wait

        def lossy_wait(rid: bytes) -> Any:
            outcome = wait(rid)
            if isinstance(outcome, list) and len(outcome) == 2:  # a rekey's reply: ok, x~
                if len(lost) < 3 and not resent:  # the first 3 rotations: the server rotated,
                    lost.append(rid)  # but the client never sees the reply: it resends
                    resent.append(rid)
                    return "timeout"
                resent.clear()
            return outcome

        channel._wait = lossy_wait
        return cloud

    u_remote, x_remote, periods = _rotating_loop(remote)
    u_local, x_local, _ = _rotating_loop(lambda rot: rot.cloud)
    assert len(lost) == 3 and periods == 6
    assert relative_error(u_remote, u_local) <= RTOL and relative_error(x_remote, x_local) <= RTOL
    (entry,) = service.stats()["per_session"]
    assert (entry["rekeys"], entry["samples"], entry["errors"]) == (6, 12, 0)


def test_a_repeated_rekey_gets_its_first_reply_and_a_stale_one_is_refused(loopback_service):
    rot, ctrl = _rotating_reactor()
    address = loopback_service.address
    cloud = RemoteTarget(address, rot.current, **REACTOR)
    xt = rot.encode_state(ctrl.initial_state)
    xt_local = xt
    for _ in range(2):
        yt = rot.encode_input(np.array([0.3]))
        ut, xt = cloud.advance(xt, yt)
        ut_local, xt_local = rot.cloud.advance(xt_local, yt)
        rotation = rot.tick()
    assert rotation is not None  # the keys of period 1 (every 2 samples)
    arrays = npz_bytes(TARGET_KINDS["immersion"].public_arrays(rot.current))
    origin = hashlib.sha256(cloud._setup_frames[1]).digest()
    rekey = (wire.REKEY, cloud._session, origin, xt.tobytes(), arrays)
    channel = _channel(address)
    first = channel.request(*rekey)
    assert channel.request(*rekey) == first  # sent again: the same reply, not a second rotation
    moved_local = rot.cloud.rekey(rotation, xt_local)
    assert relative_error(np.frombuffer(first[0]), moved_local) <= RTOL
    stale = {
        "another state from the old keys": (cloud._session, origin, (2 * xt).tobytes(), arrays),
        "keys the session never ran": (cloud._session, os.urandom(32), xt.tobytes(), arrays),
    }
    for frames in stale.values():
        with pytest.raises(StaleRekeyError, match="rekey: the session does not run the keys"):
            channel.request(wire.REKEY, *frames)
    with pytest.raises(MalformedRequestError, match="SHA-256"):  # a digest of the wrong size
        channel.request(wire.REKEY, cloud._session, origin[:16], xt.tobytes(), arrays)
    with pytest.raises(MalformedRequestError, match="expected 4 frames"):  # protocol 2's rekey
        channel.request(wire.REKEY, cloud._session, xt.tobytes(), arrays)
    channel.close()
    row = next(
        r
        for r in loopback_service.stats()["per_session"]
        if r["session"] == cloud._session[:4].hex()
    )
    assert (row["rekeys"], row["errors"]) == (1, 2)  # malformed frames count for no session
    # the client's own rekey of the same rotation (its first reply was never seen) is a repeat
    moved = cloud.rekey(rot.current, xt)
    assert moved.tobytes() == first[0]
    yt = rot.encode_input(np.array([0.3]))
    ut, _ = cloud.advance(moved, yt)
    ut_local, _ = rot.cloud.advance(moved_local, yt)
    assert relative_error(rot.decode_output(ut, yt), rot.decode_output(ut_local, yt)) <= RTOL
    cloud.close()


def test_a_rekey_whose_state_overflows_is_refused_in_process_and_remotely(loopback_service):
    from immersion.errors import NonFiniteError

    rot, ctrl = _rotating_reactor(rotate_keys_every=1)
    cloud = RemoteTarget(loopback_service.address, rot.current, **REACTOR)
    xt = rot.encode_state(ctrl.initial_state)
    rotation = rot.tick()
    huge = np.full(xt.size, 1.7e308)  # finite, but not once decoded
    with np.errstate(all="ignore"), pytest.raises(NonFiniteError) as info:
        rot.cloud.target.reencode_state(huge, rotation.target)
    assert info.value.argument == "encoded_state" and "overflows" in str(info.value)
    with np.errstate(all="ignore"), pytest.raises(NonFiniteError):
        rot.cloud.rekey(rotation, huge)
    assert rot.cloud.period == 0  # nothing rotated
    with pytest.raises(RemoteError) as remote_info:
        cloud.rekey(rot.current, huge)
    assert remote_info.value.code == "invalid-argument"
    assert "encoded_state: is too large" in str(remote_info.value)
    moved = cloud.rekey(rot.current, xt)  # the session was not rotated: the real rekey applies
    assert relative_error(moved, rot.cloud.rekey(rotation, xt)) <= RTOL
    cloud.close()


def test_a_reply_that_arrives_with_the_servers_close_is_taken(monkeypatch):
    """A server that answers and then closes (a clean stop) signals both at once: the client
    takes the answer instead of calling the connection dropped."""
    import zmq

    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    channel = _channel(f"tcp://127.0.0.1:{port}")
    poll = channel._poller.poll

    def late_poll(timeout: int) -> list:  # both events are queued before the client looks
        time.sleep(0.5)
        return poll(timeout)

    monkeypatch.setattr(channel._poller, "poll", late_poll)

    def answer_then_close() -> None:
        identity, empty, kind, rid, *_ = router.recv_multipart()
        router.send_multipart([identity, empty, rid, wire.OK, b"answer"])
        router.close(linger=1000)

    server = threading.Thread(target=answer_then_close)
    server.start()
    try:
        assert channel.request(wire.HELLO) == [b"answer"]
    finally:
        server.join(10)
        channel.close()


def test_one_failed_handshake_is_retried_and_a_persistent_one_blames_the_keys(
    keyed_service, monkeypatch
):
    """A server killed mid-handshake fails one handshake (retried); a wrong server key fails
    every one (AuthenticationError after a few quick attempts, not a timeout)."""
    service, keys, _ = keyed_service
    server_public, pair = _curve_of(keys, 0)
    real = _Channel._connection_event
    calls = {"n": 0}

    def first_fails(self) -> str | None:
        calls["n"] += 1
        return "handshake" if calls["n"] == 1 else real(self)

    monkeypatch.setattr(_Channel, "_connection_event", first_fails)
    channel = _Channel(service.address, timeout_s=5.0, attempts=3, curve=(server_public, pair))
    try:
        assert channel.request(wire.HELLO)
    finally:
        channel.close()
    monkeypatch.setattr(_Channel, "_connection_event", real)
    impostor = _pair(Path(keys["clients"][1]["client_key"]))  # not the server's key pair
    wrong = _Channel(service.address, timeout_s=30.0, attempts=5, curve=(impostor.public, pair))
    start = time.monotonic()
    try:
        with pytest.raises(AuthenticationError, match="handshake"):
            wrong.request(wire.HELLO)
    finally:
        wrong.close()
    assert time.monotonic() - start < 30.0  # refused on the handshakes, not after timeouts
