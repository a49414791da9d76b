"""The cloud side as a service: ``immersion serve`` with sessions, CurveZMQ keys, limits and logs.

One ZeroMQ ROUTER socket is read by the thread that calls :meth:`Service.run`; the target work of
``setup`` and ``advance`` runs on a pool of ``workers`` threads (numpy releases the GIL in its
products), so a plant whose target is slow does not hold up the others' replies (as long as
fewer plants than ``workers`` are slow at once: each slow sample holds a worker).

* **Sessions.** Each ``setup`` builds its own target (any kind of :mod:`immersion.remote_kinds`)
  under a random 16-byte session id owned by the client's CurveZMQ key. ``advance`` names its
  session; another key naming it gets ``unknown-session``. A session ends on ``close``, or after
  ``session_idle_s`` without a request (default 600 s: ten minutes of silence from a loop that
  samples every few milliseconds means the plant is gone). At most ``max_sessions``.
* **Limits.** ZeroMQ drops a connection that sends one frame over ``max_message_bytes``
  (``ZMQ_MAXMSGSIZE``), before the bytes are read; a message whose frames add up to more is
  answered ``message-too-large``. Every refusal is a named error code (:data:`wire.ERROR_CODES`).
* **Keys.** With ``server_key`` the socket is a CurveZMQ server; ``zmq.auth`` accepts only the
  public keys in ``clients`` and ``admins``. Without keys only a loopback address may be bound.
* **Stopping.** SIGTERM or SIGINT (or ``stop`` from an admin key): no new request is read, the
  requests in flight are finished and answered, and :func:`serve` returns (exit code 0).
* **Observability.** A log line per event (listening, set-up, refusal, denied handshake, session
  end with its samples, errors and latency percentiles, stop), as JSON with ``json_log=True``;
  ``stats`` returns the same figures to an admin.

Examples
--------
>>> with Service("tcp://127.0.0.1:*", log=lambda line: None) as service:
...     service.address.startswith("tcp://127.0.0.1:")
True
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import queue
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
import zipfile
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import _validation as v
from . import wire
from .curve import fingerprint, load_curve_public_folder, load_curve_secret
from .errors import ImmersionError, InvalidArgumentError, OptionalDependencyError
from .remote_kinds import TARGET_KINDS, CloudTarget, TargetKind

#: Defaults of ``immersion serve`` (documented in the README and THREAT_MODEL.md).
DEFAULT_MAX_SESSIONS = 256
DEFAULT_SESSION_IDLE_S = 600.0
DEFAULT_MAX_MESSAGE_BYTES = 16 * 2**20
DEFAULT_WORKERS = 2
DEFAULT_LOG_EVERY_S = 300.0

_LATENCY_WINDOW = 4096  # per session: the latest service times kept for the percentiles
_DRAIN_S = 30.0  # the longest a stop waits for the requests in flight


class _Refusal(Exception):
    """A request refused with one of :data:`wire.ERROR_CODES`."""

    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message
        super().__init__(message)


def _percentiles(latency_ns: Any) -> dict[str, float | None]:
    if not len(latency_ns):
        return {"p50_us": None, "p99_us": None}
    p50, p99 = np.percentile(np.fromiter(latency_ns, dtype=np.float64), [50, 99]) / 1e3
    return {"p50_us": round(float(p50), 1), "p99_us": round(float(p99), 1)}


@dataclass
class _Session:
    sid: bytes
    owner: str
    kind: TargetKind
    label: str
    target: CloudTarget
    created: float
    last_seen: float
    header: dict[str, Any] = field(default_factory=dict)
    #: SHA-256 of the .npz frame the target was built from (set-up or last rekey)
    arrays_digest: bytes = b""
    #: the last rekey applied: (from digest, new digest, x~ bytes, reply frames)
    last_rekey: tuple[bytes, bytes, bytes, list[bytes]] | None = None
    samples: int = 0
    rekeys: int = 0
    errors: int = 0
    in_flight: int = 0
    logged_samples: int = 0
    latency_ns: deque[int] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))

    def summary(self, now: float) -> dict[str, Any]:
        return {
            "session": self.sid[:4].hex(),
            "client": fingerprint(self.owner) if self.owner else "loopback",
            "kind": self.kind.name,
            "algorithm": self.label,
            "samples": self.samples,
            "rekeys": self.rekeys,
            "errors": self.errors,
            **_percentiles(self.latency_ns),
            "age_s": round(now - self.created, 3),
            "idle_s": round(now - self.last_seen, 3),
        }


@dataclass
class _Job:
    identity: bytes
    envelope: list[bytes]
    rid: bytes
    request: bytes
    args: list[Any]
    user: str
    session: _Session | None = None
    reply: list[bytes] = field(default_factory=list)
    refusal: _Refusal | None = None
    built: tuple[TargetKind, str, CloudTarget, dict[str, Any]] | None = None
    pending_setup: bool = False
    digest: bytes = b""  # SHA-256 of the .npz frame of a setup or rekey
    replayed: bool = False  # a rekey answered with the reply it got the first time
    elapsed_ns: int = 0


_EOCD = struct.Struct("<4s4H2LH")  # a zip file's end-of-central-directory record
_MAX_ARRAYS = 64  # members of one .npz when the target kind does not list its arrays
_MAX_ENTRY_BYTES = 1024  # a generous central-directory entry (46 bytes, a name, extras)
_MAX_NPY_HEADER = 10_000  # numpy's own max_header_size for untrusted headers

_Plan = tuple[str, zipfile.ZipInfo, int, np.dtype, tuple[int, ...], bool, int]


def _unpack(
    blob: Any, *, what: str, limit: int, names: frozenset[str] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of a ``setup`` or ``rekey`` ``.npz`` frame, read without trusting it.

    Only stored (uncompressed) ``NAME.npy`` members are read, with exactly the names in
    ``names`` (any distinct names, at most 64, if None) and no object dtype. Every member's
    header is read first: their declared sizes must add up to at most ``limit`` (the
    service's ``max_message_bytes``) and fit in the frame before any array data is read, so
    the arrays never take more memory than the frame itself (a deflate member would: 0.5 MB
    of zeros inflates to 512 MB). Refusals are ``malformed`` or ``message-too-large``.
    """
    data = memoryview(blob).cast("B")
    try:
        with zipfile.ZipFile(io.BytesIO(_bounded_directory(data, what, names))) as archive:
            plan = _npz_plan(archive, len(data), what=what, limit=limit, names=names)
            arrays: dict[str, np.ndarray] = {}
            for key, info, offset, dtype, shape, fortran, nbytes in plan:
                with archive.open(info) as member:
                    member.read(offset)
                    raw = member.read(nbytes)
                if len(raw) != nbytes:
                    raise _Refusal("malformed", f"{what}: array {key!r} is truncated")
                flat = np.frombuffer(raw, dtype=dtype, count=math.prod(shape))
                arrays[key] = flat.reshape(shape, order="F" if fortran else "C").copy()
            return arrays
    except _Refusal:
        raise
    except Exception as exc:  # noqa: BLE001 - the zip and npy parsers raise many kinds on junk
        raise _Refusal(
            "malformed", f"{what}: the arrays are not an .npz file ({type(exc).__name__}: {exc})"
        ) from None


def _bounded_directory(data: memoryview, what: str, names: frozenset[str] | None) -> memoryview:
    """``data`` if its zip directory is small; zipfile turns the whole directory into objects
    some ten times its size before anything can be checked, so its size is read first."""
    most = _MAX_ARRAYS if names is None else len(names)
    window = min(len(data), _EOCD.size + 0xFFFF)  # the end record, then a comment of <64 KiB
    end = bytes(data[len(data) - window :]).rfind(b"PK\x05\x06")
    if end < 0 or end + _EOCD.size > window:
        raise _Refusal("malformed", f"{what}: the arrays are not an .npz file (no zip end record)")
    end += len(data) - window
    entries, directory = _EOCD.unpack_from(data, end)[4:6]
    if bytes(data[max(0, end - 20) : max(0, end - 16)]) == b"PK\x06\x07":
        raise _Refusal("malformed", f"{what}: a zip64 archive (numpy writes one over 2 GiB only)")
    if entries > most or directory > most * _MAX_ENTRY_BYTES:
        raise _Refusal("malformed", f"{what}: more than {most} arrays")
    return data


_NPY_HEADER = re.compile(
    r"\{'descr': '([<>|=][a-zA-Z][0-9]{0,2})', 'fortran_order': (True|False), "
    r"'shape': \(((?:[0-9]{1,19}, ?)*[0-9]{0,19})\), \} *\n"
)


def _npy_header(member: Any, *, what: str, key: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype of one ``.npy`` member, read without :mod:`ast`.

    numpy parses the header with ``ast.literal_eval``, whose AST constructor keeps a
    per-interpreter depth counter that concurrent threads corrupt on CPython 3.11 (a spurious
    ``SystemError``, seen with two workers unpacking set-ups at once); the header numpy writes
    is one fixed dict literal, so a strict pattern reads it and refuses anything else.
    """
    magic = member.read(8)
    if magic[:6] != b"\x93NUMPY" or len(magic) < 8 or magic[6:8] not in (b"\x01\x00", b"\x02\x00"):
        raise _Refusal("malformed", f"{what}: array {key!r} is not a version 1 or 2 .npy member")
    size_bytes = 2 if magic[6] == 1 else 4
    length = int.from_bytes(member.read(size_bytes), "little")
    if length > _MAX_NPY_HEADER:
        raise _Refusal("malformed", f"{what}: array {key!r} has a {length}-byte .npy header")
    text = member.read(length)
    match = _NPY_HEADER.fullmatch(text.decode("latin-1"))
    if match is None:
        raise _Refusal("malformed", f"{what}: array {key!r} has a .npy header numpy does not write")
    descr, fortran, dims = match.groups()
    dtype = np.dtype(descr)
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    return shape, fortran == "True", dtype


def _npz_plan(
    archive: zipfile.ZipFile,
    frame_bytes: int,
    *,
    what: str,
    limit: int,
    names: frozenset[str] | None,
) -> list[_Plan]:
    """Check the members' names, compression, dtypes and declared sizes (no array data read)."""
    plan: list[_Plan] = []
    total = 0
    for info in archive.infolist():
        key = info.filename.removesuffix(".npy")
        if key == info.filename or any(key == p[0] for p in plan) or (names and key not in names):
            expected = sorted(names) if names else "distinct NAME.npy members"
            raise _Refusal(
                "malformed", f"{what}: unexpected member {info.filename!r} (expected {expected})"
            )
        if info.compress_type != zipfile.ZIP_STORED:
            raise _Refusal(
                "malformed",
                f"{what}: array {key!r} is compressed; send stored members (numpy.savez, not "
                "savez_compressed)",
            )
        with archive.open(info) as member:
            shape, fortran, dtype = _npy_header(member, what=what, key=key)
            offset = member.tell()
        if dtype.hasobject:
            raise _Refusal("malformed", f"{what}: array {key!r} has an object dtype")
        nbytes = math.prod(shape) * dtype.itemsize
        total += nbytes
        if total > limit:
            raise _Refusal(
                "message-too-large",
                f"{what}: the arrays declare {total} bytes or more, over the server's "
                f"max_message_bytes ({limit})",
            )
        if total > frame_bytes or offset + nbytes > info.file_size:
            raise _Refusal(
                "malformed", f"{what}: array {key!r} declares more data than the frame holds"
            )
        plan.append((key, info, offset, dtype, tuple(shape), bool(fortran), nbytes))
    missing = sorted(set(names or ()) - {p[0] for p in plan})
    if missing:
        raise _Refusal("malformed", f"{what}: missing arrays {missing}")
    return plan


class Service:
    """The cloud side of remote mode, bound at construction; :meth:`run` serves until stopped.

    Parameters
    ----------
    bind:
        ZeroMQ address, e.g. ``tcp://127.0.0.1:5555`` (``*`` as port picks a free one; see
        :attr:`address`). Only loopback, ``ipc://`` or ``inproc://`` without ``server_key``.
    server_key:
        The server's ``.key_secret`` file (``immersion keys curve``): turns on CurveZMQ.
    clients, admins:
        Folders of ``.key`` files: the client keys accepted, and the keys that may also ask
        ``stats`` and ``stop``. With ``server_key``, at least one of them.
    max_sessions, session_idle_s, max_message_bytes:
        The limits (module docstring).
    workers:
        Threads for target work (0: on the socket thread).
    log, json_log:
        Called with each log line (default: stderr); ``json_log=True`` makes the lines JSON.
    log_every_s:
        Every so often, a ``session`` line for each session that served samples since the last.
    kinds:
        Target kinds served (default :data:`~immersion.remote_kinds.TARGET_KINDS`).
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        server_key: Any = None,
        clients: Any = None,
        admins: Any = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        session_idle_s: float = DEFAULT_SESSION_IDLE_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        workers: int = DEFAULT_WORKERS,
        log: Callable[[str], Any] | None = None,
        json_log: bool = False,
        log_every_s: float = DEFAULT_LOG_EVERY_S,
        kinds: dict[str, TargetKind] | None = None,
    ) -> None:
        try:
            import zmq
        except ImportError:
            raise OptionalDependencyError("pyzmq", "remote", "immersion serve") from None
        self._zmq = zmq
        self.max_sessions = v.positive_int("max_sessions", max_sessions)
        self.session_idle_s = v.positive_float("session_idle_s", session_idle_s)
        self.max_message_bytes = v.positive_int(
            "max_message_bytes", max_message_bytes, minimum=1024
        )
        self.workers = v.positive_int("workers", workers, minimum=0)
        self.log_every_s = v.positive_float("log_every_s", log_every_s)
        self._kinds = dict(TARGET_KINDS if kinds is None else kinds)
        self._log_sink = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._json_log, self._log_lock = bool(json_log), threading.Lock()
        loopback = wire.is_loopback(bind, name="bind", bind=True)
        self._admins: frozenset[bytes] = frozenset()
        allowed: frozenset[bytes] = frozenset()
        pair = None
        if server_key is None:
            if clients is not None or admins is not None:
                raise InvalidArgumentError("server_key", "clients and admins need a server key")
            if not loopback:
                raise InvalidArgumentError(
                    "bind",
                    f"{bind} is not a loopback address: without keys anyone who reaches it could "
                    "use or hijack the service. Pass server_key and clients (see `immersion keys "
                    "curve`), or bind tcp://127.0.0.1:PORT",
                )
        else:
            pair = load_curve_secret(server_key, name="server_key")
            if clients is None and admins is None:
                raise InvalidArgumentError("clients", "list the accepted client keys (a folder)")
            if admins is not None:
                self._admins = load_curve_public_folder(admins, name="admins")
            allowed = self._admins | (
                load_curve_public_folder(clients, name="clients")
                if clients is not None
                else allowed
            )
        self.curve = pair is not None
        self._allowed = allowed
        self._sessions: dict[bytes, _Session] = {}
        self._pending_setups = 0
        self._counts: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._ended: Counter[str] = Counter()
        self._latency_ns: deque[int] = deque(maxlen=_LATENCY_WINDOW * 4)
        self._stop_reason: str | None = None
        self._stopping = threading.Event()
        self._done: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._in_flight = 0
        self._thread: threading.Thread | None = None
        self._closed = False

        self._ctx = zmq.Context()
        self._auth = None
        try:
            if pair is not None:
                from zmq.auth.thread import ThreadAuthenticator

                self._auth = ThreadAuthenticator(
                    self._ctx, log=logging.getLogger("immersion.service.zap")
                )
                self._auth.start()
                self._auth.configure_curve_callback("*", credentials_provider=self)
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 1000)
            self._router.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            if pair is not None:
                self._router.curve_server = True
                self._router.curve_publickey, self._router.curve_secretkey = (
                    pair.public,
                    pair.secret,
                )
            try:
                self._router.bind(bind)
            except zmq.ZMQError as exc:
                raise InvalidArgumentError("bind", f"cannot bind {bind} ({exc})") from None
            self.address: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self._release()
            raise
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pool = ThreadPoolExecutor(self.workers, "immersion-serve") if self.workers else None
        self._started = time.monotonic()

    # ------------------------------------------------------------------ ZAP (zmq.auth) callback
    def callback(self, domain: str, key: bytes) -> bool:
        """``zmq.auth`` asks whether a client's public key (Z85) may connect."""
        if key in self._allowed:
            return True
        with self._log_lock:
            self._counts["handshakes_denied"] += 1
        self._log("denied", client=fingerprint(key), reason="key not listed")
        return False

    # ------------------------------------------------------------------ logging
    def _log(self, event: str, **fields: Any) -> None:
        if self._json_log:
            line = json.dumps({"ts": round(time.time(), 6), "event": event, **fields})
        elif event == "listening":  # the address last: scripts read it as the line's last word
            address = fields.pop("address")
            line = " ".join(f"{k}={val}" for k, val in fields.items())
            line = f"immersion serve: {line} listening on {address}"
        else:
            line = f"immersion serve: {event} " + " ".join(
                f"{k}={val}" for k, val in fields.items()
            )
        with self._log_lock:
            self._log_sink(line)

    # ------------------------------------------------------------------ public control
    def stop(self, reason: str = "stop") -> None:
        """Stop after the requests in flight (thread-safe; signal handlers call it)."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stopping.set()

    def start(self) -> "Service":
        """Run in a background thread (tests, notebooks); :meth:`stop` then :meth:`join`."""
        self._thread = threading.Thread(target=self.run, name="immersion-serve", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop("context exit")
        self.join(_DRAIN_S + 5)

    def stats(self) -> dict[str, Any]:
        """Counters, limits and one summary per live session (what an admin's ``stats`` gets)."""
        now = time.monotonic()
        return {
            "protocol": wire.PROTOCOL,
            "address": self.address,
            "curve": self.curve,
            "uptime_s": round(now - self._started, 3),
            "max_sessions": self.max_sessions,
            "session_idle_s": self.session_idle_s,
            "max_message_bytes": self.max_message_bytes,
            "workers": self.workers,
            "sessions": len(self._sessions),
            "requests": self._counts["requests"],
            "replies": self._counts["replies"],
            "samples": self._counts["samples"],
            "sessions_created": self._counts["sessions_created"],
            "sessions_peak": self._counts["sessions_peak"],
            "sessions_ended": dict(self._ended),
            "refused": dict(self._refused),
            "handshakes_denied": self._counts["handshakes_denied"],
            "latency_us": _percentiles(self._latency_ns),
            "per_session": [s.summary(now) for s in self._sessions.values()],
        }

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Serve until :meth:`stop`, answer the requests in flight, return the last stats."""
        zmq = self._zmq
        if self._closed:
            raise InvalidArgumentError("self", "this Service has already run; make a new one")
        self._log(
            "listening",
            curve=self.curve,
            clients=len(self._allowed),
            admins=len(self._admins),
            max_sessions=self.max_sessions,
            session_idle_s=self.session_idle_s,
            max_message_bytes=self.max_message_bytes,
            workers=self.workers,
            address=self.address,
        )
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        wake = self._wake_r.fileno()  # zmq's poller reports plain sockets by fd
        poller.register(wake, zmq.POLLIN)
        sweep_every = min(1.0, self.session_idle_s / 4, self.log_every_s)
        next_sweep = time.monotonic() + sweep_every
        next_report = time.monotonic() + self.log_every_s
        max_in_flight = max(1, self.workers) * 64
        try:
            while not self._stopping.is_set():
                reading = self._in_flight < max_in_flight
                if reading:
                    poller.modify(self._router, zmq.POLLIN)
                else:
                    poller.modify(self._router, 0)
                ready = dict(poller.poll(100))
                if wake in ready:
                    self._finish_done()
                if reading and self._router in ready:
                    self._read_requests(64)
                if (now := time.monotonic()) >= next_sweep:
                    self._expire(now)
                    next_sweep = now + sweep_every
                if now >= next_report:
                    self._report(now)
                    next_report = now + self.log_every_s
            self._log("stopping", reason=self._stop_reason, in_flight=self._in_flight)
            deadline = time.monotonic() + _DRAIN_S
            while self._in_flight and time.monotonic() < deadline:
                if wake in dict(poller.poll(100)):
                    self._finish_done()
            for session in list(self._sessions.values()):
                self._end(session, "shutdown")
            summary = self.stats()
            self._log(
                "stopped",
                requests=summary["requests"],
                replies=summary["replies"],
                samples=summary["samples"],
                sessions_created=summary["sessions_created"],
                refused=summary["refused"],
            )
            return summary
        finally:
            self._release()

    def close(self) -> None:
        """Release the socket of a service that will not :meth:`run` (``run`` releases its own)."""
        if not self._closed:
            self._release()

    def _release(self) -> None:
        self._closed = True
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for name in ("_router",):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        for name in ("_wake_r", "_wake_w"):
            end = getattr(self, name, None)
            if end is not None:
                end.close()
        self._ctx.term()

    def _read_requests(self, limit: int) -> None:
        zmq = self._zmq
        for _ in range(limit):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._counts["requests"] += 1
            self._dispatch(frames)

    def _finish_done(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                job = self._done.get_nowait()
            except queue.Empty:
                return
            self._in_flight -= 1
            self._finish(job)

    # ------------------------------------------------------------------ requests
    def _dispatch(self, frames: list[Any]) -> None:
        identity = frames[0].bytes
        user = (frames[0].get("User-Id") or "") if self.curve else ""
        body = frames[1:]
        envelope = [b""] if body and len(body[0]) == 0 else []
        body = body[len(envelope) :]
        rid = body[1].bytes if len(body) >= 2 else b""
        job = _Job(identity, envelope, rid, b"", body[2:], user)
        try:
            if len(body) < 2 or not 0 < len(rid) <= wire.MAX_REQUEST_ID_BYTES:
                raise _Refusal(
                    "malformed", "expected frames [b'', kind, request_id (1-16 bytes), ...]"
                )
            job.request = body[0].bytes[:16]
            size = sum(len(f) for f in frames[1:])
            if size > self.max_message_bytes:
                raise _Refusal(
                    "message-too-large",
                    f"{size} bytes, over the server's max_message_bytes ({self.max_message_bytes})",
                )
            handler = self._handlers.get(job.request)
            if handler is None:
                raise _Refusal("unknown-request", f"unknown request {job.request!r}")
            handler(self, job)
        except _Refusal as refusal:
            job.refusal = refusal
            self._finish(job)

    def _session(self, job: _Job, arity: int) -> _Session:
        if len(job.args) != arity:
            raise _Refusal("malformed", f"{job.request.decode()}: expected {arity} frames")
        session = self._sessions.get(job.args[0].bytes)
        if session is None or session.owner != job.user:
            raise _Refusal("unknown-session", "no such session for this client; send setup")
        return session

    def _admin(self, job: _Job) -> None:
        if not (self.curve and job.user.encode() in self._admins):
            raise _Refusal("forbidden", f"{job.request.decode()} needs an admin key")

    def _hello(self, job: _Job) -> None:
        info = {
            "protocol": wire.PROTOCOL,
            "max_message_bytes": self.max_message_bytes,
            "max_sessions": self.max_sessions,
            "session_idle_s": self.session_idle_s,
            "curve": self.curve,
            "kinds": sorted(self._kinds),
        }
        job.reply = [json.dumps(info).encode()]
        self._finish(job)

    def _setup(self, job: _Job) -> None:
        if len(job.args) != 2:
            raise _Refusal("malformed", "setup: expected a JSON header and an .npz frame")
        if len(self._sessions) + self._pending_setups >= self.max_sessions:
            raise _Refusal(
                "too-many-sessions", f"this server holds its maximum of {self.max_sessions}"
            )
        self._pending_setups += 1
        job.pending_setup = True
        self._submit(job, self._build)

    def _session_work(
        self, job: _Job, work: Callable[[_Job], None], session: _Session | None = None
    ) -> None:
        session = session or self._session(job, 3)
        session.last_seen = time.monotonic()
        session.in_flight += 1
        job.session = session
        self._submit(job, work)

    def _advance(self, job: _Job) -> None:
        self._session_work(job, self._compute)

    def _rekey(self, job: _Job) -> None:
        session = self._session(job, 4)
        if len(job.args[1]) != wire.DIGEST_BYTES:
            raise _Refusal(
                "malformed", "rekey: the second frame is the SHA-256 of the arrays it rotates from"
            )
        self._session_work(job, self._rebuild, session)

    def _close(self, job: _Job) -> None:
        self._end(self._session(job, 1), "closed")
        self._finish(job)

    def _stats(self, job: _Job) -> None:
        self._admin(job)
        job.reply = [json.dumps(self.stats()).encode()]
        self._finish(job)

    def _stop_request(self, job: _Job) -> None:
        self._admin(job)
        self._finish(job)
        self.stop(f"stop from admin {fingerprint(job.user)}")

    _handlers: dict[bytes, Callable[["Service", _Job], None]] = {
        wire.HELLO: _hello,
        wire.SETUP: _setup,
        wire.ADVANCE: _advance,
        wire.REKEY: _rekey,
        wire.CLOSE: _close,
        wire.STATS: _stats,
        wire.STOP: _stop_request,
    }

    # ------------------------------------------------------------------ target work (workers)
    def _submit(self, job: _Job, work: Callable[[_Job], None]) -> None:
        if self._pool is None:
            self._execute(job, work)
            self._finish(job)
            return
        self._in_flight += 1
        self._pool.submit(self._execute_and_wake, job, work)

    def _execute_and_wake(self, job: _Job, work: Callable[[_Job], None]) -> None:
        self._execute(job, work)
        self._done.put(job)
        try:
            self._wake_w.send(b"!")
        except (BlockingIOError, OSError):  # the socket thread is awake already / shutting down
            pass

    def _execute(self, job: _Job, work: Callable[[_Job], None]) -> None:
        start = time.perf_counter_ns()
        try:
            with np.errstate(all="ignore"):  # the targets check finiteness and name the culprit
                work(job)
        except _Refusal as refusal:
            job.refusal = refusal
        except (ImmersionError, ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
            job.refusal = _Refusal("invalid-argument", str(exc))
        except Exception as exc:  # noqa: BLE001 - a target must never take the service down
            job.refusal = _Refusal("internal", f"the target raised {type(exc).__name__}")
        job.elapsed_ns = time.perf_counter_ns() - start

    def _build(self, job: _Job) -> None:
        try:
            header = json.loads(job.args[0].bytes)
        except (ValueError, UnicodeDecodeError):
            raise _Refusal("malformed", "setup: the header is not JSON") from None
        if not isinstance(header, dict):
            raise _Refusal("malformed", "setup: the header is not a JSON object")
        coding = header.get("coding", "immersion")
        kind = self._kinds.get(coding) if isinstance(coding, str) else None
        if kind is None:
            raise InvalidArgumentError(
                "coding", f"this server runs targets {sorted(self._kinds)}, not {coding!r}"
            )
        arrays = _unpack(
            job.args[1].buffer, what="setup", limit=self.max_message_bytes, names=kind.array_names
        )
        target = kind.build(header, arrays)
        job.digest = hashlib.sha256(job.args[1].buffer).digest()
        job.built = (kind, str(header.get("algorithm") or coding), target, header)

    def _compute(self, job: _Job) -> None:
        assert job.session is not None
        dtype = job.session.kind.wire_dtype
        try:
            xt = np.frombuffer(job.args[1].bytes, dtype=dtype)
            yt = np.frombuffer(job.args[2].bytes, dtype=dtype)
        except ValueError:
            raise _Refusal(
                "malformed", f"advance: vectors must be raw {np.dtype(dtype).name} bytes"
            ) from None
        ut, xt_next = job.session.target.advance(xt, yt)
        job.reply = [
            np.ascontiguousarray(ut, dtype=dtype).tobytes(),
            np.ascontiguousarray(xt_next, dtype=dtype).tobytes(),
        ]

    def _rebuild(self, job: _Job) -> None:
        """``rekey``: the session's target under the new public arrays, and ``x~`` moved to it.

        The new target is built as at set-up (same kind, algorithm and parameters) and must have
        the old one's sizes; the socket thread swaps it in when the reply is sent. A rekey names
        the arrays it rotates from (their SHA-256): sent again after the session moved on (a
        reply lost, the request resent), it gets the first reply again, never a second
        re-encoding; from any other arrays it is refused (``stale-rekey``).
        """
        session = job.session
        assert session is not None
        origin, state = job.args[1].bytes, job.args[2].bytes
        job.digest = hashlib.sha256(job.args[3].buffer).digest()
        if origin != session.arrays_digest:
            self._repeat_rekey(job)
            return
        old = session.target
        if not hasattr(old, "reencode_state"):
            raise InvalidArgumentError(
                "rekey", f"a {session.kind.name!r} target has no key rotation"
            )
        arrays = _unpack(
            job.args[3].buffer,
            what="rekey",
            limit=self.max_message_bytes,
            names=session.kind.array_names,
        )
        new = session.kind.build(session.header, arrays)
        for size in ("n_state_encoded", "n_input_encoded", "n_output_encoded"):
            if getattr(new, size, None) != getattr(old, size, None):
                raise InvalidArgumentError(
                    "rekey",
                    f"the new keys change {size} ({getattr(old, size, None)} -> "
                    f"{getattr(new, size, None)}): a rotation keeps the session's sizes",
                )
        try:
            xt = np.frombuffer(state, dtype=session.kind.wire_dtype)
        except ValueError:
            raise _Refusal("malformed", "rekey: the state must be raw float64 bytes") from None
        moved = old.reencode_state(xt, new)
        job.reply = [np.ascontiguousarray(moved, dtype=session.kind.wire_dtype).tobytes()]
        job.built = (session.kind, session.label, new, session.header)

    def _repeat_rekey(self, job: _Job) -> None:
        """A rekey that does not start from the session's arrays: the last one sent again
        (answered as the first time), or a named refusal."""
        session = job.session
        assert session is not None
        last = session.last_rekey
        if last is not None and last[:3] == (job.args[1].bytes, job.digest, job.args[2].bytes):
            job.reply, job.replayed = list(last[3]), True
            return
        raise _Refusal(
            "stale-rekey",
            "rekey: the session does not run the keys this rotation starts from (apply every "
            "rotation once, in order; a rekey repeated unchanged gets its first answer again)",
        )

    def _commit_rekey(self, job: _Job) -> None:
        """Swap in a rekey's new target (socket thread), unless another rekey of the session
        from the same keys was committed while this one was computed."""
        session = job.session
        assert session is not None and job.built is not None
        if session.arrays_digest != job.args[1].bytes:
            try:
                self._repeat_rekey(job)
            except _Refusal as refusal:
                job.refusal = refusal
            return
        session.target = job.built[2]
        session.arrays_digest = job.digest
        session.last_rekey = (job.args[1].bytes, job.digest, job.args[2].bytes, list(job.reply))
        session.rekeys += 1
        self._counts["rekeys"] += 1

    # ------------------------------------------------------------------ replies and bookkeeping
    def _finish(self, job: _Job) -> None:
        session = job.session
        if session is not None:
            session.in_flight -= 1
        if job.request == wire.SETUP and job.refusal is None:
            job.reply = self._open_session(job)
        if job.pending_setup:
            self._pending_setups -= 1
        if job.request == wire.REKEY and job.refusal is None and not job.replayed:
            self._commit_rekey(job)
        if job.refusal is not None:
            self._refused[job.refusal.code] += 1
            if session is not None:
                session.errors += 1
            self._log(
                "refused",
                code=job.refusal.code,
                request=job.request.decode(errors="replace"),
                client=fingerprint(job.user) if job.user else "loopback",
                session=session.sid[:4].hex() if session else None,
                message=job.refusal.message[:300],
            )
            frames = [wire.ERROR, job.refusal.code.encode(), job.refusal.message.encode()]
        elif job.request == wire.REKEY:
            frames = [wire.OK, *job.reply]
        else:
            if session is not None:
                session.samples += 1
                session.latency_ns.append(job.elapsed_ns)
                self._latency_ns.append(job.elapsed_ns)
                self._counts["samples"] += 1
            frames = [wire.OK, *job.reply]
        self._router.send_multipart([job.identity, *job.envelope, job.rid, *frames])
        self._counts["replies"] += 1

    def _open_session(self, job: _Job) -> list[bytes]:
        assert job.built is not None
        kind, label, target, header = job.built
        if len(self._sessions) >= self.max_sessions:
            job.refusal = _Refusal(
                "too-many-sessions", f"this server holds its maximum of {self.max_sessions}"
            )
            return []
        now = time.monotonic()
        session = _Session(
            secrets.token_bytes(wire.SESSION_BYTES),
            job.user,
            kind,
            label,
            target,
            now,
            now,
            header,
            arrays_digest=job.digest,
        )
        self._sessions[session.sid] = session
        self._counts["sessions_created"] += 1
        self._counts["sessions_peak"] = max(self._counts["sessions_peak"], len(self._sessions))
        dims = {
            "n_state_encoded": int(target.n_state_encoded),
            "n_input_encoded": int(target.n_input_encoded),
        }
        self._log(
            "setup",
            session=session.sid[:4].hex(),
            client=fingerprint(job.user) if job.user else "loopback",
            kind=kind.name,
            algorithm=label,
            setup_ms=round(job.elapsed_ns / 1e6, 3),
            sessions=len(self._sessions),
            **dims,
        )
        return [json.dumps({**dims, "session_idle_s": self.session_idle_s}).encode(), session.sid]

    def _end(self, session: _Session, reason: str) -> None:
        del self._sessions[session.sid]
        self._ended[reason] += 1
        self._log("session-end", reason=reason, **session.summary(time.monotonic()))

    def _report(self, now: float) -> None:
        for session in self._sessions.values():
            if session.samples > session.logged_samples:
                session.logged_samples = session.samples
                self._log("session", **session.summary(now))

    def _expire(self, now: float) -> None:
        for session in list(self._sessions.values()):
            if not session.in_flight and now - session.last_seen > self.session_idle_s:
                self._end(session, "idle")


def serve(
    service: Service | str = "tcp://127.0.0.1:5555", *, log: Callable[[str], Any] | None = None
) -> dict[str, Any]:
    """Run a :class:`Service` until SIGTERM/SIGINT (or an admin's ``stop``); return its final stats.

    ``service`` is a :class:`Service` built with the options wanted, or a loopback address to
    serve there with the defaults (``log`` then goes to it). Called from the main thread,
    SIGTERM and SIGINT stop the service cleanly (the requests in flight are answered) instead
    of killing it.
    """
    if isinstance(service, str):
        service = Service(service, log=log)
    elif log is not None:
        raise InvalidArgumentError("log", "give log= to the Service, not to serve()")
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(
                sig, lambda signum, frame: service.stop(signal.Signals(signum).name)
            )
    try:
        return service.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
