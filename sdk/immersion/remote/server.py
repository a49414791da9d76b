"""The cloud side as a service: ``immersion serve`` with sessions, CurveZMQ keys, limits and logs.

One ZeroMQ ROUTER socket is read by the thread that calls :meth:`Service.run`; the target work of
``setup`` and ``advance`` runs on a pool of ``workers`` threads (numpy releases the GIL in its
products), so a plant whose target is slow does not hold up the others' replies (as long as
fewer plants than ``workers`` are slow at once: each slow sample holds a worker).

* **Sessions.** Each ``setup`` builds its own target (any kind of :mod:`immersion.remote.kinds`)
  under a random 16-byte session id owned by the client's CurveZMQ key. ``advance`` names its
  session; another key naming it gets ``unknown-session``. A session ends on ``close``, or after
  ``session_idle_s`` without a request (default 600 s: ten minutes of silence from a loop that
  samples every few milliseconds means the plant is gone). At most ``max_sessions``, and at
  most ``max_sessions_per_client`` for one key (default a quarter of ``max_sessions``); when
  the table is full, a key holding fewer sessions takes the least recently used idle session
  of the key holding the most (``evicted``; its client sets it up again by itself), so no key
  is locked out by another's sessions.
* **Limits.** ZeroMQ drops a connection that sends one frame over ``max_message_bytes``
  (``ZMQ_MAXMSGSIZE``), before the bytes are read; a message whose frames add up to more is
  answered ``message-too-large``. Every refusal is a named error code (:data:`wire.ERROR_CODES`).
  Per connection at most :data:`QUEUED_REQUESTS` requests wait to be read and
  :data:`QUEUED_REPLIES` replies to be sent (``ZMQ_RCVHWM``, ``ZMQ_SNDHWM``: a client that does
  not read loses replies, not the server's memory); a peer silent for ``peer_timeout_s``
  (ZeroMQ heartbeats: a half-sent message included) or not through its handshake in
  ``handshake_timeout_s`` (``ZMQ_HANDSHAKE_IVL``) is disconnected. ZeroMQ bounds frames, not
  messages: the frames of a message a peer never ends are held while it keeps sending.
* **Connections.** At most ``max_connections`` (default 1024, checked at start-up against
  ``ulimit -n`` with :data:`FD_RESERVE` descriptors to spare) and ``connection_rate`` new ones
  per second from one source address; over the cap the newest connection of the address
  holding the most is shut down. Read from ZeroMQ's socket monitor, which also counts and logs
  every failed handshake by cause.
* **Keys.** With ``server_key`` the socket is a CurveZMQ server; the service's own ZAP handler
  (RFC 27) accepts only the public keys in ``clients`` and ``admins``. Without keys only a
  loopback address may be bound.
* **Stopping.** SIGTERM or SIGINT (or ``stop`` from an admin key): no new request is read,
  the requests in flight are finished and answered for at most ``drain_s`` (a second signal
  skips the wait), and :func:`serve` returns (exit code 0). A thread of the service that dies
  (the ZAP handler, a worker, the log writer) stops it with :class:`ServiceFailure`
  (``immersion serve`` exits :data:`EXIT_THREAD_DIED`).
* **Observability.** A log line per event (listening, set-up, refusal, denied or failed
  handshake, shed connection, session end with its samples, errors and latency percentiles,
  stop), as JSON with ``json_log=True``; ``stats`` returns the same figures to an admin. Logging
  is best effort: a failing destination (full disk, closed pipe) or a blocked one loses lines,
  counted in ``stats()["log"]``, never the service. Noisy events are rate-limited per client
  (or address) and cause, with the count of lines left out; every field is length-limited and
  escaped.

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
import math
import os
import queue
import re
import secrets
import signal
import socket
import struct
import threading
import time
import zipfile
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..errors import ImmersionError, InvalidArgumentError, OptionalDependencyError
from . import wire
from .curve import fingerprint, load_curve_public_folder, load_curve_secret
from .kinds import TARGET_KINDS, CloudTarget, TargetKind

#: Defaults of ``immersion serve`` (documented in docs/howto/serve_curvezmq.md and THREAT_MODEL.md).
DEFAULT_MAX_SESSIONS = 256
DEFAULT_SESSION_IDLE_S = 600.0
DEFAULT_MAX_MESSAGE_BYTES = 16 * 2**20
DEFAULT_WORKERS = 2
DEFAULT_LOG_EVERY_S = 300.0
DEFAULT_PEER_TIMEOUT_S = 30.0
DEFAULT_HANDSHAKE_TIMEOUT_S = 5.0
DEFAULT_DRAIN_S = 5.0
DEFAULT_CONNECTION_RATE = 100.0
#: The default ``max_connections`` (lowered to fit ``ulimit -n``).
DEFAULT_MAX_CONNECTIONS = 1024
#: Descriptors kept free besides the connections (ZeroMQ's own, the log, the accept lag).
FD_RESERVE = 128
#: Requests waiting to be read per connection (ZMQ_RCVHWM; a lock-step client has one).
QUEUED_REQUESTS = 8
#: Replies waiting to be sent per connection (ZMQ_SNDHWM): room for a burst of answers to a
#: client that pipelines and reads, none for one that never reads.
QUEUED_REPLIES = 64
#: Exit code of ``immersion serve`` when a thread of the service died (EX_SOFTWARE).
EXIT_THREAD_DIED = 70

_LATENCY_WINDOW = 4096  # per session: the latest service times kept for the percentiles
_IN_FLIGHT_PER_WORKER = 64  # requests waiting for a worker before the socket is not read
_MAX_FIELD_CHARS = 200  # any string in a log line
_MAX_REPLY_MESSAGE_CHARS = 1000  # the message of a refusal sent back
_MAX_STATS_SESSIONS = 1000  # per-session rows in a stats reply
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,99}")  # a set-up's algorithm label
_LOG_QUEUE_BYTES = 2**20  # log lines waiting for a slow destination before lines are dropped
_LOG_FLUSH_S = 1.0  # the longest a stop waits for the log to be written
_LOG_WINDOW_S = 10.0
#: Lines per window for one client (or source address) and cause; the rest are counted.
_LOG_LINES_PER_WINDOW = {
    "refused": 10,
    "denied": 10,
    "handshake-failed": 10,
    "connection-shed": 10,
    "setup": 50,
    "session-end": 50,
}
_LOG_KEYS = 4096  # rate-limit windows kept at once; beyond, keys share one per event
_ADDRESS_BUCKETS = 65536  # source addresses whose connection rate is tracked at once
_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+,\-\[\]]+")  # text-mode values written without quotes
_EVENT_ACCEPTED, _EVENT_DISCONNECTED = 0x0020, 0x0200
_EVENT_HANDSHAKE_FAILED_NO_DETAIL, _EVENT_HANDSHAKE_SUCCEEDED = 0x0800, 0x1000
_EVENT_HANDSHAKE_FAILED_PROTOCOL, _EVENT_HANDSHAKE_FAILED_AUTH = 0x2000, 0x4000
_MONITOR_BATCH = 512  # monitor events handled per turn of the loop (the rest wait)


class ServiceFailure(ImmersionError):
    """A thread of the service died or its loop failed; the service stopped (exit code 70).

    ``summary`` holds the stats at the stop (None if they could not be gathered).
    """

    def __init__(self, message: str, summary: dict[str, Any] | None = None) -> None:
        self.summary = summary
        super().__init__(message)


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


def _clip(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were cut."""
    return text if len(text) <= limit else f"{text[:limit]}...[{len(text) - limit} more]"


def _log_value(value: Any) -> Any:
    """A field as logged: strings clipped, containers' strings too (JSON mode escapes them)."""
    if isinstance(value, str):
        return _clip(value)
    if isinstance(value, dict):
        return {_clip(str(k), 64): _log_value(val) for k, val in list(value.items())[:64]}
    if isinstance(value, (list, tuple)):
        return [_log_value(val) for val in list(value)[:64]]
    return value


def _text_value(value: Any) -> str:
    """A field in a text-mode line: plain tokens as they are, anything else as a JSON literal
    (quoted and escaped: no client-supplied value can end the line or fake another field)."""
    if isinstance(value, str):
        return value if _PLAIN.fullmatch(value) else json.dumps(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), default=str)
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return json.dumps(str(value))


def format_log_line(event: str, fields: dict[str, Any], *, json_log: bool) -> str:
    """One log line: a JSON object, or ``immersion serve: EVENT key=value ...`` (logfmt-like).

    Every string is clipped to 200 characters and, in text mode, written as a JSON literal
    unless it is a plain token, so a field never holds a line break, a quote or a space that
    could forge another line or field.

    Examples
    --------
    >>> format_log_line("refused", {"message": "x\\nimmersion serve: stopping"}, json_log=False)
    'immersion serve: refused message="x\\\\nimmersion serve: stopping"'
    """
    fields = {k: _log_value(val) for k, val in fields.items()}
    if json_log:
        return json.dumps({"ts": round(time.time(), 6), "event": event, **fields}, default=str)
    if event == "listening":  # the address last: scripts read it as the line's last word
        address = fields.pop("address")
        words = " ".join(f"{k}={_text_value(val)}" for k, val in fields.items())
        return f"immersion serve: {words} listening on {address}"
    words = " ".join(f"{k}={_text_value(val)}" for k, val in fields.items())
    return f"immersion serve: {event} {words}".rstrip()


class _LogWriter:
    """Writes log lines to a file descriptor from its own thread, never blocking the caller.

    Lines wait in a queue of at most 1 MiB; a destination that fails (full disk, closed pipe)
    or blocks (a reader that stopped reading) loses lines, counted in :attr:`dropped`.
    """

    def __init__(self, fd: int, *, close_fd: bool) -> None:
        self._fd, self._close_fd = fd, close_fd
        self._lines: deque[bytes] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._closing = False
        self._writing = 0  # lines of the batch in os.write now
        self.written = self.dropped = 0
        self.thread = threading.Thread(target=self._loop, name="immersion-serve-log", daemon=True)
        self.thread.start()

    def put(self, line: str) -> bool:
        """Queue a line; False (dropped) if the queue is full or the writer is closed."""
        data = line.encode("utf-8", "replace") + b"\n"
        with self._cond:
            if self._closing or self._queued + len(data) > _LOG_QUEUE_BYTES:
                self.dropped += 1
                return False
            self._lines.append(data)
            self._queued += len(data)
            self._cond.notify()
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._lines and not self._closing:
                    self._cond.wait()
                if not self._lines:
                    return
                batch = list(self._lines)
                self._lines.clear()
                self._writing = len(batch)
            data = memoryview(b"".join(batch))
            try:
                while data:
                    data = data[os.write(self._fd, data) :]
                self.written += len(batch)
            except OSError:  # full disk, closed pipe, read-only file system: best effort
                self.dropped += len(batch)
            finally:
                with self._cond:
                    self._queued -= sum(map(len, batch))
                    self._writing = 0

    @property
    def pending(self) -> int:
        """Lines not written yet (queued, or in a write that has not returned)."""
        return len(self._lines) + self._writing

    def close(self, timeout_s: float = _LOG_FLUSH_S) -> None:
        """Write what is queued (waiting at most ``timeout_s``), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self.thread.join(timeout_s)
        if self.thread.is_alive():  # blocked in a write: whatever is left is lost
            with self._cond:
                self.dropped += len(self._lines) + self._writing
                self._lines.clear()
        elif self._close_fd:
            os.close(self._fd)


class _LogLimiter:
    """At most N lines per window for one (event, client or address, cause); counts the rest."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, ...], list[float]] = {}  # key -> [start, lines, left out]
        self.suppressed = 0

    def admit(self, key: tuple[str, ...], now: float) -> bool:
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= _LOG_KEYS:
                key = (key[0], "*")  # too many clients or causes at once: they share a window
                window = self._windows.get(key)
            if window is None:
                window = self._windows[key] = [now, 0, 0]
        if window[1] < _LOG_LINES_PER_WINDOW.get(key[0], 10):
            window[1] += 1
            return True
        window[2] += 1
        self.suppressed += 1
        return False

    def expired(self, now: float, *, everything: bool = False) -> list[tuple[tuple[str, ...], int]]:
        """Windows over (all with ``everything``): (key, lines left out) for those that left
        lines out; the windows are forgotten."""
        done = [k for k, w in self._windows.items() if everything or now - w[0] >= _LOG_WINDOW_S]
        out = [(k, int(self._windows[k][2])) for k in done if self._windows[k][2]]
        for key in done:
            del self._windows[key]
        return out


class _Workers:
    """Daemon threads running target work (a stuck target never holds up the process's exit)."""

    def __init__(self, count: int) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self.threads = [
            threading.Thread(target=self._loop, name=f"immersion-serve-worker-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, work: Callable[..., None], *args: Any) -> None:
        self._queue.put((work, args))

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            work, args = item
            work(*args)

    def shutdown(self) -> None:
        for _ in self.threads:
            self._queue.put(None)


def _dup_socket(fd: int) -> socket.socket | None:
    """A duplicate of a connection's descriptor (None if it is closed or not a socket)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None


def _peer(sock: socket.socket) -> tuple[str, Any]:
    try:
        name = sock.getpeername()
    except OSError:
        return "", None
    if isinstance(name, tuple):
        return str(name[0]), name[1]
    return "local", name  # ipc://


@dataclass
class _Connection:
    fd: int
    address: str
    port: Any
    since: float


class _Connections:
    """The open connections, from ZeroMQ's socket monitor: a cap, a rate per source address.

    libzmq reports each accepted connection with its descriptor; this keeps them by descriptor
    and shuts down (``shutdown(2)`` on a duplicate: libzmq then closes it as a peer's close)
    those over ``max_connections`` (the newest of the address holding the most) and those from
    an address opening more than ``rate`` per second (bursts of two seconds' worth).
    """

    def __init__(self, max_connections: int, rate: float) -> None:
        self.max_connections, self.rate = max_connections, rate
        self.burst = max(10.0, 2 * rate)
        self.open: dict[int, _Connection] = {}
        self.per_address: Counter[str] = Counter()
        self._buckets: dict[str, list[float]] = {}  # address -> [tokens, last refill]
        self.accepted = self.peak = 0
        self.shed: Counter[str] = Counter()

    def accepted_fd(self, fd: int, now: float) -> tuple[str, str] | None:
        """Record a new connection; (address, reason) if it was shut down."""
        self.accepted += 1
        sock = _dup_socket(fd)
        if sock is None:
            return None
        try:
            address, port = _peer(sock)
            if port is None:
                return None  # already closed
            if not self._take_token(address, now):
                self._shutdown(sock)
                self.shed["rate"] += 1
                return address, "rate"
        finally:
            sock.close()
        self._forget(fd)
        self.open[fd] = _Connection(fd, address, port, now)
        self.per_address[address] += 1
        self.peak = max(self.peak, len(self.open))
        if len(self.open) > self.max_connections:
            return self._shed_one()
        return None

    def closed_fd(self, fd: int) -> None:
        self._forget(fd)

    def _forget(self, fd: int) -> None:
        conn = self.open.pop(fd, None)
        if conn is not None:
            self.per_address[conn.address] -= 1
            if self.per_address[conn.address] <= 0:
                del self.per_address[conn.address]

    def _take_token(self, address: str, now: float) -> bool:
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= _ADDRESS_BUCKETS:
                self.prune(now)
            bucket = self._buckets[address] = [self.burst, now]
        bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if bucket[0] < 1.0:
            return False
        bucket[0] -= 1.0
        return True

    def prune(self, now: float) -> None:
        """Forget the rate of addresses whose bucket has refilled."""
        full = [
            a for a, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self.rate >= self.burst
        ]  # fmt: skip
        for address in full:
            del self._buckets[address]
        if len(self._buckets) >= _ADDRESS_BUCKETS:  # a flood from many addresses
            self._buckets.clear()

    def _shed_one(self) -> tuple[str, str] | None:
        """Shut down the newest connection of the address holding the most."""
        while len(self.open) > self.max_connections:
            heaviest = max(self.per_address, key=self.per_address.__getitem__)
            conn = max(
                (c for c in self.open.values() if c.address == heaviest), key=lambda c: c.since
            )
            sock = _dup_socket(conn.fd)
            still = sock is not None and _peer(sock) == (conn.address, conn.port)
            self._forget(conn.fd)
            if sock is not None:
                if still:
                    self._shutdown(sock)
                sock.close()
            if still:
                self.shed["cap"] += 1
                return conn.address, "cap"
        return None  # the entries over the cap had closed already

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stats(self) -> dict[str, Any]:
        return {
            "open": len(self.open),
            "peak": self.peak,
            "accepted": self.accepted,
            "shed": dict(self.shed),
            "max_connections": self.max_connections,
            "connection_rate": self.rate,
        }


def descriptor_limit(max_connections: int | None) -> int:
    """The ``max_connections`` this process can hold: checked against ``ulimit -n``.

    The soft limit is raised towards the hard one if it is short. With ``max_connections=None``
    the default (1024) is lowered to what fits; an explicit value that does not fit is refused.
    """
    try:
        import resource
    except ImportError:  # not POSIX: no descriptor limit to check
        return max_connections or DEFAULT_MAX_CONNECTIONS
    wanted = (max_connections or DEFAULT_MAX_CONNECTIONS) + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft != infinite and soft < wanted:
        raised = wanted if hard == infinite else min(hard, wanted)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    limit = wanted if soft == infinite else soft
    room = limit - FD_RESERVE
    if max_connections is None:
        if room < 1:
            raise InvalidArgumentError(
                "max_connections",
                f"ulimit -n is {limit}: no room for connections beside the {FD_RESERVE} "
                "descriptors the server keeps; raise ulimit -n",
            )
        return min(DEFAULT_MAX_CONNECTIONS, room)
    if max_connections > room:
        raise InvalidArgumentError(
            "max_connections",
            f"{max_connections} connections need {max_connections + FD_RESERVE} file "
            f"descriptors ({FD_RESERVE} kept for the server itself) but ulimit -n is {limit} "
            f"(hard limit {'unlimited' if hard == infinite else hard}): pass at most {room} "
            "or raise ulimit -n",
        )
    return max_connections


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
    #: the target's state, for kinds whose state stays on the server (None: it travels)
    state: np.ndarray | None = None
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
    max_sessions_per_client:
        Sessions one client key may hold (default ``max(1, max_sessions // 4)``; at most
        ``max_sessions``). Without keys every client is the same local user: not applied.
    max_connections:
        Open connections at once (default 1024, lowered to fit ``ulimit -n``; a value that
        does not fit is refused).
    connection_rate:
        New connections per second from one source address (bursts of twice as many).
    peer_timeout_s:
        A peer that sends nothing (no request, no heartbeat answer, or stops halfway through a
        message) for this long is disconnected.
    handshake_timeout_s:
        A connection that has not completed its handshake in this time is closed.
    drain_s:
        On a stop, the longest wait for the requests in flight.
    workers:
        Threads for target work (0: on the socket thread).
    log, json_log:
        ``log`` is called with each log line, on the service's threads (it must not block;
        what it raises is counted as a dropped line); default: stderr, written by a thread of
        its own. ``json_log=True`` makes the lines JSON.
    log_file:
        Append the log lines to this file instead (written by a thread of its own).
    log_every_s:
        Every so often, a ``session`` line for each session that served samples since the last.
    kinds:
        Target kinds served (default :data:`~immersion.remote.kinds.TARGET_KINDS`).
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        server_key: Any = None,
        clients: Any = None,
        admins: Any = None,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_sessions_per_client: int | None = None,
        session_idle_s: float = DEFAULT_SESSION_IDLE_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_connections: int | None = None,
        connection_rate: float = DEFAULT_CONNECTION_RATE,
        peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        drain_s: float = DEFAULT_DRAIN_S,
        workers: int = DEFAULT_WORKERS,
        log: Callable[[str], Any] | None = None,
        json_log: bool = False,
        log_file: str | os.PathLike[str] | None = None,
        log_every_s: float = DEFAULT_LOG_EVERY_S,
        kinds: dict[str, TargetKind] | None = None,
    ) -> None:
        try:
            import zmq
        except ImportError:
            raise OptionalDependencyError("pyzmq", "remote", "immersion serve") from None
        self._zmq = zmq
        self.max_sessions = v.positive_int("max_sessions", max_sessions)
        per_client = max(1, self.max_sessions // 4)
        if max_sessions_per_client is not None:
            per_client = v.positive_int("max_sessions_per_client", max_sessions_per_client)
            if per_client > self.max_sessions:
                raise InvalidArgumentError(
                    "max_sessions_per_client",
                    f"expected at most max_sessions ({self.max_sessions}), got {per_client}",
                )
        self.max_sessions_per_client = per_client
        self.session_idle_s = v.positive_float("session_idle_s", session_idle_s)
        self.max_message_bytes = v.positive_int(
            "max_message_bytes", max_message_bytes, minimum=1024
        )
        if max_connections is not None:
            max_connections = v.positive_int("max_connections", max_connections)
        self.connection_rate = v.positive_float("connection_rate", connection_rate)
        self.peer_timeout_s = _milliseconds("peer_timeout_s", peer_timeout_s, minimum=0.02)
        self.handshake_timeout_s = _milliseconds(
            "handshake_timeout_s", handshake_timeout_s, minimum=0.01
        )
        self.drain_s = v.positive_float("drain_s", drain_s, allow_zero=True)
        self.workers = v.positive_int("workers", workers, minimum=0)
        self.log_every_s = v.positive_float("log_every_s", log_every_s)
        self._kinds = dict(TARGET_KINDS if kinds is None else kinds)
        self._json_log = bool(json_log)
        loopback = wire.is_loopback(bind, name="bind", bind=True)
        self.max_connections = descriptor_limit(max_connections)
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
            client_keys = (
                load_curve_public_folder(clients, name="clients")
                if clients is not None
                else allowed
            )
            allowed = self._admins | client_keys
        if log is not None and log_file is not None:
            raise InvalidArgumentError("log_file", "give log or log_file, not both")
        if log is not None and not callable(log):
            raise InvalidArgumentError("log", f"expected a callable taking a line, got {log!r}")
        self.curve = pair is not None
        self._allowed = allowed
        #: listed client keys (an admin key counts under admins only, unless also a client's)
        self._n_clients = len(client_keys) if pair is not None else 0
        self._sessions: dict[bytes, _Session] = {}
        self._owned: Counter[str] = Counter()  # sessions per client key, pending set-ups included
        self._pending_setups = 0
        self._counts: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._ended: Counter[str] = Counter()
        self._handshakes: Counter[str] = Counter()  # failed handshakes by cause
        self._latency_ns: deque[int] = deque(maxlen=_LATENCY_WINDOW * 4)
        self._stop_reason: str | None = None
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # a second stop: do not wait for the requests in flight
        self._failure: str | None = None
        #: set when :meth:`start`'s thread ended with a :class:`ServiceFailure`
        self.failure: ServiceFailure | None = None
        self._done: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._in_flight = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stats_lock = threading.Lock()  # counters the ZAP thread shares
        self._log_lock = threading.Lock()
        self._limiter = _LogLimiter()
        self._log_failed = 0  # lines a log callable raised on
        self._connections = _Connections(self.max_connections, self.connection_rate)
        self._writer: _LogWriter | None = None
        self._log_sink: Callable[[str], Any] | None = log
        if log is None:
            if log_file is None:
                self._writer = _LogWriter(2, close_fd=False)  # stderr, written by its own thread
            else:
                self._writer = _LogWriter(_open_log_file(log_file), close_fd=True)

        self._ctx = zmq.Context()
        self._zap_thread: threading.Thread | None = None
        self._zap_socket: Any = None
        self._zap_stop = threading.Event()
        self._monitor: Any = None
        self._router: Any = None
        self._workers: _Workers | None = None
        self._wake_r = self._wake_w = None
        try:
            if pair is not None:
                self._start_zap()
            self._router = self._ctx.socket(zmq.ROUTER)
            for option, value in (
                (zmq.LINGER, 1000),
                (zmq.MAXMSGSIZE, self.max_message_bytes),
                (zmq.RCVHWM, QUEUED_REQUESTS),
                (zmq.SNDHWM, QUEUED_REPLIES),
                (zmq.HANDSHAKE_IVL, round(self.handshake_timeout_s * 1000)),
                (zmq.HEARTBEAT_IVL, round(self.peer_timeout_s * 500)),
                (zmq.HEARTBEAT_TIMEOUT, round(self.peer_timeout_s * 500)),
            ):
                self._router.setsockopt(option, value)
            if pair is not None:
                self._router.curve_server = True
                self._router.curve_publickey, self._router.curve_secretkey = (
                    pair.public,
                    pair.secret,
                )
            endpoint = f"inproc://immersion-serve-monitor-{secrets.token_hex(8)}"
            self._router.monitor(
                endpoint,
                _EVENT_ACCEPTED
                | _EVENT_DISCONNECTED
                | _EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | _EVENT_HANDSHAKE_SUCCEEDED
                | _EVENT_HANDSHAKE_FAILED_PROTOCOL
                | _EVENT_HANDSHAKE_FAILED_AUTH,
            )
            self._monitor = self._ctx.socket(zmq.PAIR)
            self._monitor.setsockopt(zmq.LINGER, 0)
            # unbounded: libzmq's I/O thread blocks on a full monitor queue (it sends events
            # without ZMQ_DONTWAIT); the loop reads them every turn
            self._monitor.setsockopt(zmq.RCVHWM, 0)
            self._monitor.connect(endpoint)
            try:
                self._router.bind(bind)
            except zmq.ZMQError as exc:
                raise InvalidArgumentError("bind", f"cannot bind {bind} ({exc})") from None
            self.address: str = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._workers = _Workers(self.workers) if self.workers else None
        except BaseException:
            self._release()
            raise
        self._started = time.monotonic()

    # ------------------------------------------------------------------ ZAP (RFC 27)
    def _start_zap(self) -> None:
        """Bind the context's ZAP endpoint and answer it from a thread of its own."""
        zmq = self._zmq
        zap = self._ctx.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind("inproc://zeromq.zap.01")
        self._zap_socket = zap
        self._zap_thread = threading.Thread(
            target=self._zap_loop, args=(zap,), name="immersion-serve-zap", daemon=True
        )
        self._zap_thread.start()

    def _zap_loop(self, zap: Any) -> None:
        """Answer ZAP requests until stopped. If this thread dies its socket stays bound (closed
        by :meth:`_release`): with no ZAP handler bound libzmq would let every key in, with
        one bound and silent handshakes wait and time out until the watchdog stops the
        service."""
        zmq = self._zmq
        while not self._zap_stop.is_set():
            if not zap.poll(100):
                continue
            frames = zap.recv_multipart()
            try:
                reply = self._zap_reply(frames)
            except Exception:  # noqa: BLE001 - a bad request is refused, never fatal
                reply = [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"", b"", b""]
                with self._stats_lock:
                    self._handshakes["zap-error"] += 1
            zap.send_multipart(reply, zmq.NOBLOCK)
        zap.close(linger=0)

    def _zap_reply(self, frames: list[bytes]) -> list[bytes]:
        """Accept a listed CURVE key (user id: its Z85 text); refuse anything else."""
        from zmq.utils import z85

        version, rid, _domain, address, _identity, mechanism, *credentials = frames
        if version != b"1.0" or mechanism != b"CURVE" or len(credentials) != 1:
            with self._stats_lock:
                self._handshakes["zap-malformed"] += 1
            return [b"1.0", rid, b"400", b"unsupported", b"", b""]
        key = z85.encode(credentials[0])
        if key in self._allowed:
            return [b"1.0", rid, b"200", b"OK", key, b""]
        peer = address.decode("ascii", "replace")
        with self._stats_lock:
            self._counts["handshakes_denied"] += 1
            self._handshakes["key-not-listed"] += 1
        self._log(
            "denied",
            limit=(peer, "key-not-listed"),
            client=fingerprint(key),
            address=peer,
            reason="key not listed",
        )
        return [b"1.0", rid, b"400", b"key not listed", b"", b""]

    # ------------------------------------------------------------------ logging
    def _log(self, event: str, *, limit: tuple[str, ...] | None = None, **fields: Any) -> None:
        """Best effort: rate-limited when ``limit`` names the client or address and cause;
        a line the destination cannot take is counted, never raised."""
        with self._log_lock:
            if limit is not None and not self._limiter.admit((event, *limit), time.monotonic()):
                return
            line = format_log_line(event, fields, json_log=self._json_log)
            if self._writer is not None:
                self._writer.put(line)
                return
            try:
                assert self._log_sink is not None
                self._log_sink(line)
            except Exception:  # noqa: BLE001 - a log that fails must not take the service down
                self._log_failed += 1

    def _log_suppressed(self, now: float, *, everything: bool = False) -> None:
        with self._log_lock:
            windows = self._limiter.expired(now, everything=everything)
        for key, count in windows:
            self._log(
                "suppressed", of=key[0], key=list(key[1:]), lines=count, window_s=_LOG_WINDOW_S
            )

    def _log_stats(self) -> dict[str, int]:
        writer = self._writer
        return {
            "written": writer.written if writer else None,
            "dropped": (writer.dropped if writer else 0) + self._log_failed,
            "pending": writer.pending if writer else 0,
            "suppressed": self._limiter.suppressed,
        }

    # ------------------------------------------------------------------ public control
    def stop(self, reason: str = "stop") -> None:
        """Stop after the requests in flight (thread-safe; signal handlers call it). A second
        call while stopping no longer waits for them."""
        if self._stopping.is_set():
            self._abandon.set()
        if self._stop_reason is None:
            self._stop_reason = reason
        self._stopping.set()

    def start(self) -> "Service":
        """Run in a background thread (tests, notebooks); :meth:`stop` then :meth:`join`."""
        self._thread = threading.Thread(
            target=self._run_in_thread, name="immersion-serve", daemon=True
        )
        self._thread.start()
        return self

    def _run_in_thread(self) -> None:
        try:
            self.run()
        except ServiceFailure as failure:  # kept for whoever joins the thread
            self.failure = failure

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "Service":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop("context exit")
        self.join(self.drain_s + 10)

    def stats(self) -> dict[str, Any]:
        """Counters, limits and one summary per live session (what an admin's ``stats`` gets;
        at most 1,000 session rows)."""
        now = time.monotonic()
        sessions = list(self._sessions.values())
        with self._stats_lock:
            denied = self._counts["handshakes_denied"]
            failed = dict(self._handshakes)
        return {
            "protocol": wire.PROTOCOL,
            "address": self.address,
            "curve": self.curve,
            "uptime_s": round(now - self._started, 3),
            "max_sessions": self.max_sessions,
            "max_sessions_per_client": self.max_sessions_per_client,
            "session_idle_s": self.session_idle_s,
            "max_message_bytes": self.max_message_bytes,
            "queued_per_connection": {"requests": QUEUED_REQUESTS, "replies": QUEUED_REPLIES},
            "peer_timeout_s": self.peer_timeout_s,
            "handshake_timeout_s": self.handshake_timeout_s,
            "workers": self.workers,
            "sessions": len(sessions),
            "requests": self._counts["requests"],
            "replies": self._counts["replies"],
            "samples": self._counts["samples"],
            "sessions_created": self._counts["sessions_created"],
            "sessions_peak": self._counts["sessions_peak"],
            "sessions_ended": dict(self._ended),
            "refused": dict(self._refused),
            "handshakes_denied": denied,
            "handshakes": {"succeeded": self._counts["handshakes_succeeded"], "failed": failed},
            "connections": self._connections.stats(),
            "log": self._log_stats(),
            "latency_us": _percentiles(self._latency_ns),
            "per_session": [s.summary(now) for s in sessions[:_MAX_STATS_SESSIONS]],
        }

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Serve until :meth:`stop`, answer the requests in flight, return the last stats.

        Raises
        ------
        ServiceFailure
            A thread of the service died, or the loop failed (the service stopped first).
        """
        if self._closed:
            raise InvalidArgumentError("self", "this Service has already run; make a new one")
        self._log(
            "listening",
            curve=self.curve,
            clients=self._n_clients,
            admins=len(self._admins),
            max_sessions=self.max_sessions,
            max_sessions_per_client=self.max_sessions_per_client,
            session_idle_s=self.session_idle_s,
            max_message_bytes=self.max_message_bytes,
            max_connections=self.max_connections,
            workers=self.workers,
            address=self.address,
        )
        summary: dict[str, Any] | None = None
        try:
            try:
                self._serve()
            except Exception as exc:  # noqa: BLE001 - reported as a failure, after the clean-up
                self._failure = f"the socket loop failed ({type(exc).__name__}: {exc})"
                self._log("fatal", reason=self._failure)
            summary = self._wind_down()
        finally:
            self._release()
        if self._failure is not None:
            raise ServiceFailure(f"immersion serve: {self._failure}", summary)
        return summary

    def _serve(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        wake = self._wake_r.fileno()  # zmq's poller reports plain sockets by fd
        poller.register(wake, zmq.POLLIN)
        sweep_every = min(1.0, self.session_idle_s / 4, self.log_every_s)
        next_sweep = time.monotonic() + sweep_every
        next_report = time.monotonic() + self.log_every_s
        max_in_flight = max(1, self.workers) * _IN_FLIGHT_PER_WORKER
        while not self._stopping.is_set():
            reading = self._in_flight < max_in_flight
            poller.modify(self._router, zmq.POLLIN if reading else 0)
            ready = dict(poller.poll(100))
            if self._monitor in ready:
                self._read_monitor()
            if wake in ready:
                self._finish_done()
            if reading and self._router in ready:
                self._read_requests(64)
            if (now := time.monotonic()) >= next_sweep:
                self._expire(now)
                self._check_threads()
                self._log_suppressed(now)
                self._connections.prune(now)
                next_sweep = now + sweep_every
            if now >= next_report:
                self._report(now)
                next_report = now + self.log_every_s

    def _wind_down(self) -> dict[str, Any]:
        """Answer the requests in flight (at most ``drain_s``), end the sessions. The address
        stays bound meanwhile: unbinding it would close the connections the replies go to."""
        zmq = self._zmq
        self._log("stopping", reason=self._stop_reason or self._failure, in_flight=self._in_flight)
        poller = zmq.Poller()
        poller.register(self._monitor, zmq.POLLIN)
        wake = self._wake_r.fileno()
        poller.register(wake, zmq.POLLIN)
        deadline = time.monotonic() + self.drain_s
        while self._in_flight and time.monotonic() < deadline and not self._abandon.is_set():
            if not self._workers_alive():
                break  # a dead worker's request never comes back
            ready = dict(poller.poll(100))
            if self._monitor in ready:
                self._read_monitor()
            if wake in ready:
                self._finish_done()
        for session in list(self._sessions.values()):
            self._end(session, "shutdown")
        self._log_suppressed(time.monotonic(), everything=True)
        summary = self.stats()
        self._log(
            "stopped",
            requests=summary["requests"],
            replies=summary["replies"],
            samples=summary["samples"],
            sessions_created=summary["sessions_created"],
            refused=summary["refused"],
            abandoned=self._in_flight,
            log_dropped=summary["log"]["dropped"],
        )
        return summary

    def _workers_alive(self) -> bool:
        return all(t.is_alive() for t in self._workers.threads) if self._workers else True

    def _check_threads(self) -> None:
        """A dead thread stops the service (a supervisor then restarts it): never silently."""
        threads = [("ZAP handler", self._zap_thread)]
        threads += [("worker", t) for t in (self._workers.threads if self._workers else [])]
        threads.append(("log writer", self._writer.thread if self._writer else None))
        for name, thread in threads:
            if thread is not None and not thread.is_alive():
                self._failure = f"the {name} thread ({thread.name}) died"
                self._log("fatal", reason=self._failure)
                self.stop(f"fatal: {self._failure}")
                return

    def close(self) -> None:
        """Release the socket of a service that will not :meth:`run` (``run`` releases its own)."""
        if not self._closed:
            self._release()

    def _release(self) -> None:
        self._closed = True
        if self._workers is not None:
            self._workers.shutdown()
        zap = self._zap_thread
        self._zap_stop.set()
        if zap is not None:
            zap.join(2.0)
            if not zap.is_alive() and not self._zap_socket.closed:
                self._zap_socket.close(linger=0)  # its thread died: nobody else uses it
        if self._router is not None:
            try:
                self._router.disable_monitor()
            except self._zmq.ZMQError:
                pass
        for sock in (self._monitor, self._router):
            if sock is not None:
                sock.close()
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        if zap is None or not zap.is_alive():
            self._ctx.term()  # every socket is closed: returns once the replies are sent
        if self._writer is not None:
            self._writer.close()

    def _read_requests(self, limit: int) -> None:
        zmq = self._zmq
        for _ in range(limit):
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._counts["requests"] += 1
            self._dispatch(frames)

    def _read_monitor(self) -> None:
        """Connections opened and closed, handshakes done or failed (libzmq's socket monitor)."""
        zmq = self._zmq
        events: list[tuple[int, int]] = []
        for _ in range(_MONITOR_BATCH):
            try:
                frames = self._monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) == 2 and len(frames[0]) == 6:
                events.append(struct.unpack("=HI", frames[0]))
        closed_later = {
            (i, value) for i, (event, value) in enumerate(events) if event == _EVENT_DISCONNECTED
        }
        now = time.monotonic()
        for i, (event, value) in enumerate(events):
            if event == _EVENT_ACCEPTED:
                if any(fd == value and j > i for j, fd in closed_later):
                    self._connections.accepted += 1  # already gone: nothing to look at
                    continue
                shed = self._connections.accepted_fd(value, now)
                if shed is not None:
                    address, reason = shed
                    self._log(
                        "connection-shed",
                        limit=(address, reason),
                        address=address,
                        reason=reason,
                        open=len(self._connections.open),
                    )
            elif event == _EVENT_DISCONNECTED:
                self._connections.closed_fd(value)
            elif event == _EVENT_HANDSHAKE_SUCCEEDED:
                self._counts["handshakes_succeeded"] += 1
            elif event == _EVENT_HANDSHAKE_FAILED_AUTH:
                pass  # the ZAP handler counted and logged it, with the address and key
            else:
                cause = _handshake_cause(event, value)
                with self._stats_lock:
                    self._handshakes[cause] += 1
                self._log("handshake-failed", limit=(cause,), cause=cause)

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
        user = _user_id(frames[0]) if self.curve else ""
        body = frames[1:]
        envelope = [b""] if body and len(body[0]) == 0 else []
        body = body[len(envelope) :]
        rid = body[1].bytes if len(body) >= 2 else b""
        job = _Job(identity, envelope, rid, b"", body[2:], user)
        try:
            if self.curve and not user:  # never: the ZAP handler names every key it lets in
                raise _Refusal("forbidden", "no authenticated client key on this connection")
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
            "max_sessions_per_client": self.max_sessions_per_client,
            "session_idle_s": self.session_idle_s,
            "curve": self.curve,
            "kinds": sorted(self._kinds),
        }
        job.reply = [json.dumps(info).encode()]
        self._finish(job)

    def _setup(self, job: _Job) -> None:
        if len(job.args) != 2:
            raise _Refusal("malformed", "setup: expected a JSON header and an .npz frame")
        quota = self.max_sessions_per_client if self.curve else self.max_sessions
        if self._owned[job.user] >= quota:
            raise _Refusal(
                "too-many-sessions",
                f"this client key holds its maximum of {quota} sessions "
                "(max_sessions_per_client): close one, or let one idle out",
            )
        if len(self._sessions) + self._pending_setups >= self.max_sessions and not self._evict_for(
            job.user
        ):
            raise _Refusal(
                "too-many-sessions", f"this server holds its maximum of {self.max_sessions}"
            )
        self._pending_setups += 1
        self._owned[job.user] += 1
        job.pending_setup = True
        self._submit(job, self._build)

    def _evict_for(self, owner: str) -> bool:
        """Make room for ``owner``: end the least recently used idle session of the key that
        holds the most, if it holds at least two more than ``owner`` (fair shares)."""
        held = self._owned[owner]
        others = [(n, o) for o, n in self._owned.items() if o != owner and n >= held + 2]
        for _, victim_owner in sorted(others, reverse=True):
            idle = [
                s for s in self._sessions.values() if s.owner == victim_owner and not s.in_flight
            ]
            if idle:
                self._end(min(idle, key=lambda s: s.last_seen), "evicted")
                return True
        return False

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
        if self._workers is None:
            self._execute(job, work)
            self._finish(job)
            return
        self._in_flight += 1
        self._workers.submit(self._execute_and_wake, job, work)

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
                "coding",
                f"this server runs targets {sorted(self._kinds)}, not {_clip(repr(coding))}",
            )
        label = header.get("algorithm") or coding
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise InvalidArgumentError(
                "algorithm",
                "expected a name of at most 100 letters, digits and ._:/+- , got "
                f"{_clip(repr(label), 60)}",
            )
        arrays = _unpack(
            job.args[1].buffer, what="setup", limit=self.max_message_bytes, names=kind.array_names
        )
        target = kind.build(header, arrays)
        job.digest = hashlib.sha256(job.args[1].buffer).digest()
        job.built = (kind, label, target, header)

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
        session = job.session
        if session.state is not None:  # kept here: the client sends none and gets none back
            if xt.size:
                raise _Refusal(
                    "malformed", "advance: this target keeps its state on the server; send none"
                )
            ut, session.state = session.target.advance(session.state, yt)
            job.reply = [np.ascontiguousarray(ut, dtype=dtype).tobytes(), b""]
            return
        ut, xt_next = session.target.advance(xt, yt)
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
            if job.refusal is not None:
                self._disown(job.user)
        if job.request == wire.REKEY and job.refusal is None and not job.replayed:
            self._commit_rekey(job)
        if job.refusal is not None:
            self._refused[job.refusal.code] += 1
            if session is not None:
                session.errors += 1
            client = fingerprint(job.user) if job.user else "loopback"
            self._log(
                "refused",
                limit=(client, job.refusal.code),
                code=job.refusal.code,
                request=job.request.decode(errors="replace"),
                client=client,
                session=session.sid[:4].hex() if session else None,
                message=job.refusal.message,
            )
            message = _clip(job.refusal.message, _MAX_REPLY_MESSAGE_CHARS)
            frames = [wire.ERROR, job.refusal.code.encode(), message.encode(errors="replace")]
        elif job.request == wire.REKEY:
            frames = [wire.OK, *job.reply]
        else:
            if session is not None:
                session.samples += 1
                session.latency_ns.append(job.elapsed_ns)
                self._latency_ns.append(job.elapsed_ns)
                self._counts["samples"] += 1
            frames = [wire.OK, *job.reply]
        # a client that does not read loses the reply (ZMQ_SNDHWM), the server does not wait
        self._router.send_multipart([job.identity, *job.envelope, job.rid, *frames])
        self._counts["replies"] += 1

    def _disown(self, owner: str) -> None:
        self._owned[owner] -= 1
        if self._owned[owner] <= 0:
            del self._owned[owner]

    def _open_session(self, job: _Job) -> list[bytes]:
        assert job.built is not None
        kind, label, target, header = job.built
        if len(self._sessions) >= self.max_sessions:  # set-ups reserve their place: a safety net
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
        if kind.replay_depth is not None:  # the state stays here, from zero (the run at rest)
            session.state = np.zeros(int(target.n_state_encoded), dtype=kind.wire_dtype)
        self._sessions[session.sid] = session
        self._counts["sessions_created"] += 1
        self._counts["sessions_peak"] = max(self._counts["sessions_peak"], len(self._sessions))
        dims = {
            "n_state_encoded": int(target.n_state_encoded),
            "n_input_encoded": int(target.n_input_encoded),
        }
        client = fingerprint(job.user) if job.user else "loopback"
        self._log(
            "setup",
            limit=(client,),
            session=session.sid[:4].hex(),
            client=client,
            kind=kind.name,
            algorithm=label,
            setup_ms=round(job.elapsed_ns / 1e6, 3),
            sessions=len(self._sessions),
            **dims,
        )
        return [json.dumps({**dims, "session_idle_s": self.session_idle_s}).encode(), session.sid]

    def _end(self, session: _Session, reason: str) -> None:
        del self._sessions[session.sid]
        self._disown(session.owner)
        self._ended[reason] += 1
        summary = session.summary(time.monotonic())
        self._log("session-end", limit=(summary["client"],), reason=reason, **summary)

    def _report(self, now: float) -> None:
        for session in self._sessions.values():
            if session.samples > session.logged_samples:
                session.logged_samples = session.samples
                self._log("session", **session.summary(now))

    def _expire(self, now: float) -> None:
        for session in list(self._sessions.values()):
            if not session.in_flight and now - session.last_seen > self.session_idle_s:
                self._end(session, "idle")


def _user_id(frame: Any) -> str:
    """The ZAP user id (the client's Z85 key) of a frame, "" if it has none."""
    try:
        return str(frame.get("User-Id") or "")
    except Exception:  # noqa: BLE001 - pyzmq raises ZMQError (EINVAL) for a missing property
        return ""


def _milliseconds(name: str, value: Any, *, minimum: float) -> float:
    """A positive duration in seconds, at least ``minimum`` and within ZeroMQ's int options."""
    seconds = v.positive_float(name, value)
    if not minimum <= seconds <= 86_400:
        raise InvalidArgumentError(name, f"expected {minimum:g} to 86400 seconds, got {seconds:g}")
    return seconds


def _open_log_file(path: Any) -> int:
    """A descriptor appending to ``path`` (created mode 0640), or an error naming log_file."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InvalidArgumentError("log_file", f"expected a file path, got {path!r}")
    try:
        return os.open(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        raise InvalidArgumentError(
            "log_file", f"cannot open {str(path)!r} to append to it ({exc.strerror})"
        ) from None


#: Causes of failed handshakes, from the protocol error codes libzmq reports.
_PROTOCOL_CAUSES = {
    0x11000001: "cryptographic",  # a wrong server key, or a public key without its secret key
    0x11000002: "mechanism-mismatch",  # the peer does not use CurveZMQ (or the server does not)
}


def _handshake_cause(event: int, value: int) -> str:
    """The cause a failed handshake is counted and logged under."""
    if event == _EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return "closed-or-timed-out"  # raw TCP, a peer gone mid-handshake, one shut down here
    if 0x20000000 <= value < 0x30000000:
        return "zap"
    return _PROTOCOL_CAUSES.get(value, "protocol")


def serve(
    service: Service | str = "tcp://127.0.0.1:5555", *, log: Callable[[str], Any] | None = None
) -> dict[str, Any]:
    """Run a :class:`Service` until SIGTERM/SIGINT (or an admin's ``stop``); return its final stats.

    ``service`` is a :class:`Service` built with the options wanted, or a loopback address to
    serve there with the defaults (``log`` then goes to it). Called from the main thread,
    SIGTERM and SIGINT stop the service cleanly (the requests in flight are answered, for at
    most its ``drain_s``; a second signal does not wait for them) instead of killing it.

    Raises
    ------
    ServiceFailure
        A thread of the service died (``immersion serve`` then exits
        :data:`EXIT_THREAD_DIED`, for a supervisor to restart it).
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
