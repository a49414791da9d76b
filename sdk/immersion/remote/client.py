"""Remote target: run the cloud side in another process or machine, exchanging encoded vectors only.

Transport: ZeroMQ (pyzmq, extra ``remote``). Chosen over gRPC because a control loop is one small
request and one small reply per sample: ZeroMQ needs no schema compilation, adds no HTTP/2
framing, and its loopback round trip is tens of microseconds; pyzmq is a small, widely used,
actively maintained binding. The server is :mod:`immersion.remote.server` (``immersion serve``), the
protocol :mod:`immersion.remote.wire`, the kinds of target :mod:`immersion.remote.kinds`.

Each :class:`RemoteTarget` opens its own session on the server. The encoded state travels with
every request, so the server keeps nothing a restart could lose: when the server answers
``unknown-session`` (it restarted, or the session idled out) the client sends its set-up again
and repeats the sample, and a request without an answer is sent again on a fresh connection.

With ``server_key`` and ``client_key`` the connection uses CurveZMQ: the client checks the
server's public key, the server accepts only listed client keys, and everything (the set-up
matrices included) travels encrypted. Without keys only loopback addresses are accepted.

LWE targets (``coding="lwe"``, :mod:`immersion.lwe`): ``setup`` carries ``{"coding": "lwe"}`` and
an ``.npz`` of the public integer matrix and sizes (:meth:`~immersion.lwe.LweTarget.public_arrays`);
``advance`` carries uint64 words (header and ciphertext ``b`` words) instead of float64.

The server never receives ``N1``, ``Pi3_left``, the noise, an LWE key or any decoded value.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import uuid
from collections import deque
from typing import Any

import numpy as np

from .. import validation as v
from ..errors import ImmersionError, InvalidArgumentError, OptionalDependencyError
from ..files import npz_bytes
from . import wire
from .curve import CurveKeyPair, load_curve_public, load_curve_secret
from .kinds import PUBLIC_MATRICES, UNREGISTERED_HINT, kind_of, public_target_matrices

#: Consecutive failed handshakes before the client blames the keys: a server killed in the middle
#: of one fails a single handshake, a wrong server_key (or CURVE on one side only) fails them all.
_HANDSHAKE_TRIES = 3

__all__ = [
    "PUBLIC_MATRICES",
    "AuthenticationError",
    "DisconnectedError",
    "ForbiddenError",
    "MalformedRequestError",
    "MessageTooLargeError",
    "RemoteError",
    "RemoteTarget",
    "RemoteTimeoutError",
    "SessionLimitError",
    "StaleRekeyError",
    "UnknownSessionError",
    "public_target_matrices",
    "remote_stats",
    "stop_server",
]


class RemoteError(ImmersionError):
    """The remote side refused a request, or did not answer in time; ``code`` names the reason."""

    code = "remote"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message)


class RemoteTimeoutError(RemoteError):
    """No answer within ``timeout_s`` on any of the ``attempts`` (is the server running?)."""

    code = "timeout"


class AuthenticationError(RemoteError):
    """The CurveZMQ handshake failed: key not listed, wrong server key, CURVE on one side only."""

    code = "authentication"


class DisconnectedError(RemoteError):
    """The server closed the connection on every attempt, unanswered: it stopped or restarted,
    cut a connection it had to (its connection cap), or, if the request has a frame over its
    ``max_message_bytes``, dropped that frame unread (``RemoteTarget`` checks its frames
    against the limit the server announced and raises :class:`MessageTooLargeError` instead).
    The message says which of these fit; the code is the client's
    (:data:`wire.CLIENT_ERROR_CODES`)."""

    code = "disconnected"


class UnknownSessionError(RemoteError):
    """The server holds no session with this id for this client (restart, idle expiry, close)."""

    code = "unknown-session"


class SessionLimitError(RemoteError):
    """The server holds its maximum number of sessions."""

    code = "too-many-sessions"


class MessageTooLargeError(RemoteError):
    """A request is larger than the server's ``max_message_bytes``."""

    code = "message-too-large"


class MalformedRequestError(RemoteError):
    """The server could not read the request's frames."""

    code = "malformed"


class ForbiddenError(RemoteError):
    """``stats`` and ``stop`` need an admin key."""

    code = "forbidden"


class StaleRekeyError(RemoteError):
    """A ``rekey`` that does not start from the keys the session runs (skipped or repeated)."""

    code = "stale-rekey"


_ERRORS: dict[str, type[RemoteError]] = {
    cls.code: cls
    for cls in (
        UnknownSessionError,
        SessionLimitError,
        MessageTooLargeError,
        MalformedRequestError,
        ForbiddenError,
        StaleRekeyError,
    )
}
_ERRORS["unknown-request"] = MalformedRequestError


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise OptionalDependencyError("pyzmq", "remote", "remote mode") from None
    return zmq


def _curve(
    address: str, server_key: Any, client_key: Any, *, client_name: str = "client_key"
) -> tuple[bytes, CurveKeyPair] | None:
    """The server's public key and this client's pair, or None on loopback without keys."""
    if server_key is None and client_key is None:
        if not wire.is_loopback(address):
            raise InvalidArgumentError(
                "server_key",
                f"{address} is not a loopback address: pass server_key= (the server's public "
                f"key) and {client_name}= (this client's secret key file); see `immersion keys "
                "curve`",
            )
        return None
    if server_key is None or client_key is None:
        missing = "server_key" if server_key is None else client_name
        raise InvalidArgumentError(missing, "CurveZMQ needs both server_key and a client key")
    wire.endpoint_host(address)
    return load_curve_public(server_key, name="server_key"), load_curve_secret(
        client_key, name=client_name
    )


class _Channel:
    """One DEALER connection: request ids, time-outs, a fresh socket per retry, handshake checks."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float,
        attempts: int,
        curve: tuple[bytes, CurveKeyPair] | None,
    ) -> None:
        zmq = _zmq()
        self._zmq, self._ctx = zmq, zmq.Context.instance()
        self.address, self.timeout_s, self.attempts, self._curve = (
            address,
            timeout_s,
            attempts,
            curve,
        )
        self._next_id = 0
        self._sock: Any = None
        #: the server's max_message_bytes once known (``hello``): larger frames are not sent
        self.max_message_bytes: int | None = None
        self._open()

    def _open(self) -> None:
        zmq = self._zmq
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            server_public, pair = self._curve
            sock.curve_serverkey, sock.curve_publickey = server_public, pair.public
            sock.curve_secretkey = pair.secret
        endpoint = f"inproc://immersion-monitor-{uuid.uuid4().hex}"
        sock.monitor(
            endpoint,
            zmq.EVENT_HANDSHAKE_SUCCEEDED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_DISCONNECTED,
        )
        monitor = self._ctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(endpoint)
        try:
            sock.connect(self.address)
        except zmq.ZMQError as exc:
            sock.disable_monitor()
            monitor.close()
            sock.close()
            raise InvalidArgumentError(
                "address",
                f"{self.address!r} is not a ZeroMQ address such as tcp://HOST:PORT ({exc})",
            ) from None
        self._sock, self._monitor, self._handshaken = sock, monitor, False
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.disable_monitor()
            self._monitor.close()
            self._sock.close()
            self._sock = None

    def request(self, kind: bytes, *body: bytes, attempts: int | None = None) -> list[bytes]:
        """Send one request and return the reply body; raise the named error the server sent."""
        tries = self.attempts if attempts is None else attempts
        largest = max(map(len, body), default=0)
        if self.max_message_bytes is not None and largest > self.max_message_bytes:
            raise MessageTooLargeError(
                f"remote: a frame of {largest} bytes is over the max_message_bytes of "
                f"{self.address} ({self.max_message_bytes}); ZeroMQ there would drop it unread",
                code="message-too-large",
            )
        dropped = failed_handshakes = 0
        for _ in range(tries):
            self._next_id += 1
            rid = struct.pack("<Q", self._next_id)
            self._forget_earlier_events()
            self._sock.send_multipart([b"", kind, rid, *body])
            outcome = self._wait(rid)
            if isinstance(outcome, list):
                if outcome[:1] == [wire.OK]:
                    return outcome[1:]
                code = outcome[1].decode(errors="replace") if len(outcome) > 1 else "remote"
                message = outcome[2].decode(errors="replace") if len(outcome) > 2 else "refused"
                raise _ERRORS.get(code, RemoteError)(f"remote: {message}", code=code)
            dropped += outcome == "dropped"
            # a server killed mid-handshake fails one handshake; a wrong key fails every one
            failed_handshakes = failed_handshakes + 1 if outcome == "handshake" else 0
            if failed_handshakes == min(tries, _HANDSHAKE_TRIES):
                raise AuthenticationError(
                    f"remote: the handshake with {self.address} failed on {failed_handshakes} "
                    "fresh connections: server_key is not that server's public key, or the "
                    "server cuts new connections from this address (over its connection rate "
                    "or cap: its log says `connection-shed`)"
                )
            self.close()  # a fresh socket: nothing stale is queued, the handshake is redone
            if failed_handshakes:
                time.sleep(0.1 * 2**failed_handshakes)  # a server shedding connections recovers
            self._open()
        if dropped == tries:
            if self.max_message_bytes is None and largest > 1024:
                frame = (
                    f", or a frame of the request ({largest} bytes) is over its "
                    "max_message_bytes, which ZeroMQ drops unread"
                )
            else:
                frame = ""
            raise DisconnectedError(
                f"remote: {self.address} closed the connection on each of {tries} attempts "
                f"before answering: the server stopped or restarted, or cut the connection "
                f"(its connection cap){frame}"
            )
        raise RemoteTimeoutError(
            f"remote: no answer from {self.address} in {self.timeout_s:g} s on {tries} attempts "
            "(is `immersion serve` running?)"
        )

    def _wait(self, rid: bytes) -> list[bytes] | str:
        deadline = time.monotonic() + self.timeout_s
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(self._poller.poll(max(1, int(left * 1000))))
            # the reply first: a server that answers and then closes (a clean stop) signals
            # both at once, and the answer must not be taken for a dropped connection
            if self._sock in ready and (reply := self._reply(rid)) is not None:
                return reply
            if self._monitor in ready and (event := self._connection_event()) is not None:
                reply = self._reply(rid)
                return reply if reply is not None else event
        return "timeout"

    def _reply(self, rid: bytes) -> list[bytes] | None:
        """The queued reply to request ``rid``, if any (earlier attempts' replies are dropped)."""
        while True:
            try:
                frames = self._sock.recv_multipart(self._zmq.NOBLOCK)
            except self._zmq.Again:
                return None
            if len(frames) >= 3 and frames[0] == b"" and frames[1] == rid:
                return frames[2:]  # anything else answers an earlier, abandoned attempt

    def _forget_earlier_events(self) -> None:
        """Read the events from before a request: a refused key still raises, but a connection
        dropped then (the socket reconnects by itself) or a handshake that failed then does not
        count against the request (it would be sent twice)."""
        while self._monitor.poll(0):
            self._event_outcome(self._monitor.recv_multipart())

    def _connection_event(self) -> str | None:
        """Read monitor events: raise if the server refused our key or CurveZMQ is on one side
        only; "handshake" if a handshake failed otherwise (a wrong server key, a server killed
        mid-handshake, or one that cut the connection: this side cannot tell them apart);
        "dropped" if the server closed an established connection; None if nothing happened."""
        outcome = None
        while self._monitor.poll(0):
            found = self._event_outcome(self._monitor.recv_multipart())
            if found == "handshake":
                return found
            outcome = found or outcome
        return outcome

    def _event_outcome(self, frames: list[bytes]) -> str | None:
        from zmq.utils.monitor import parse_monitor_message

        zmq = self._zmq
        message = parse_monitor_message(frames)
        event = message["event"]
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            raise AuthenticationError(
                f"remote: {self.address} refused this client's public key (it is not in "
                "the server's clients folder)"
            )
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and message["value"] == getattr(
            zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000002
        ):
            raise AuthenticationError(
                f"remote: the handshake with {self.address} failed: one side uses "
                "CurveZMQ keys and the other does not (pass server_key and client_key for a "
                "server started with --server-key, neither for one without)"
            )
        if event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            return "handshake"
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._handshaken = True
        elif event == zmq.EVENT_DISCONNECTED and self._handshaken:
            return "dropped"
        return None


class RemoteTarget:
    """Client side: the same ``advance`` as :class:`~immersion.coding.target.TargetAlgorithm`, over
    ZeroMQ.

    Parameters
    ----------
    address:
        ``tcp://HOST:PORT`` of an ``immersion serve`` (``ipc://PATH`` also works).
    imm:
        The user's handle; its public target data is sent once (encrypted with keys).
    algorithm, params:
        The registered algorithm the server builds ``f``, ``g`` from, and its parameters.
    timeout_s, attempts:
        Seconds to wait for each answer, and how many fresh connections to try before
        :class:`RemoteTimeoutError` (``attempts * timeout_s`` bounds a wait for a restart).
    server_key, client_key:
        CurveZMQ: the server's public key (a ``.key`` file or 40 Z85 characters) and this
        client's ``.key_secret`` file. Required for any address but loopback.

    Examples
    --------
    ``cloud = RemoteTarget("tcp://10.0.0.5:5555", imm, algorithm="reactor-controller",
    params={"dt": 0.01}, server_key="server.key", client_key="plant-1.key_secret")``, then
    ``u_enc, x_enc = cloud.advance(x_enc, y_enc)`` in the control loop. One object per thread.
    """

    def __init__(
        self,
        address: str,
        imm: Any,
        *,
        algorithm: str | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
        attempts: int = 3,
        server_key: Any = None,
        client_key: Any = None,
    ) -> None:
        timeout_s = v.positive_float("timeout_s", timeout_s)
        attempts = v.positive_int("attempts", attempts)
        curve = _curve(address, server_key, client_key)
        kind = kind_of(imm, algorithm=algorithm)
        header: dict[str, Any] = {"coding": kind.name}
        if kind.needs_algorithm:
            if not isinstance(algorithm, str):
                raise InvalidArgumentError(
                    "algorithm",
                    f"name the algorithm f, g run, registered on the server, got {algorithm!r}; "
                    + UNREGISTERED_HINT,
                )
            header.update(algorithm=algorithm, params=params or {})
        elif algorithm is not None or params is not None:
            raise InvalidArgumentError(
                "algorithm", f"a {kind.name!r} target takes no algorithm or params"
            )
        try:
            header_bytes = json.dumps(header, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError("params", f"expected JSON-ready values ({exc})") from None
        self._setup_frames = [header_bytes, npz_bytes(kind.public_arrays(imm))]
        self._kind = kind
        #: the last encoded inputs, to rebuild a state kept on the server after its restart
        self._replay: deque[bytes] | None = (
            deque(maxlen=kind.replay_depth(imm)) if kind.replay_depth is not None else None
        )
        self._dtype = np.dtype(kind.wire_dtype)
        self.address, self.kind = address, kind.name
        self.resumed = self.samples = self.bytes_sent = self.bytes_received = 0
        self._session = b""
        self._channel = _Channel(address, timeout_s=timeout_s, attempts=attempts, curve=curve)
        try:
            self.limits: dict[str, Any] = json.loads(self._channel.request(wire.HELLO)[0])
            self._channel.max_message_bytes = int(self.limits["max_message_bytes"])
            size = sum(map(len, self._setup_frames)) + 64
            if size > self.limits["max_message_bytes"]:
                raise MessageTooLargeError(
                    f"remote: the set-up is {size} bytes, over the server's max_message_bytes "
                    f"({self.limits['max_message_bytes']}); start it with a larger "
                    "--max-message-bytes",
                    code="message-too-large",
                )
            self._setup()
        except BaseException:
            self._channel.close()
            raise

    def _setup(self) -> None:
        info_frame, session = self._channel.request(wire.SETUP, *self._setup_frames)
        info = json.loads(info_frame)
        self._session = session
        self.n_state_encoded, self.n_input_encoded = (
            info["n_state_encoded"],
            info["n_input_encoded"],
        )

    def _vector(self, name: str, value: Any) -> bytes:
        try:
            return np.ascontiguousarray(value, dtype=self._dtype).tobytes()
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(name, f"expected a vector of numbers ({exc})") from None

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """Send ``x~, y~``; receive ``u~, x~+`` (set up again by itself after a server restart).

        For a target that keeps its state on the server (``coding="lwe"``: the encrypted
        history) ``encoded_state`` is not sent and an empty array comes back; after a server
        restart the last inputs are sent again to rebuild that state. ``bytes_sent`` and
        ``bytes_received`` count the vectors of every ``advance``.
        """
        if self._channel._sock is None:
            raise InvalidArgumentError("self", "this RemoteTarget is closed")
        yt = self._vector("encoded_input", encoded_input)
        xt = b"" if self._replay is not None else self._vector("encoded_state", encoded_state)
        try:
            reply = self._channel.request(wire.ADVANCE, self._session, xt, yt)
        except UnknownSessionError:
            self._setup()
            self.resumed += 1
            for past in self._replay or ():  # the server's state, rebuilt from the last inputs
                self._channel.request(wire.ADVANCE, self._session, b"", past)
            reply = self._channel.request(wire.ADVANCE, self._session, xt, yt)
        if self._replay is not None:
            self._replay.append(yt)
        if len(reply) != 2 or any(len(r) % self._dtype.itemsize for r in reply):
            raise RemoteError("remote: the server's reply is malformed", code="malformed")
        self.samples += 1
        self.bytes_sent += len(xt) + len(yt)
        self.bytes_received += len(reply[0]) + len(reply[1])
        return np.frombuffer(reply[0], dtype=self._dtype).copy(), np.frombuffer(
            reply[1], dtype=self._dtype
        ).copy()

    def rekey(self, imm: Any, encoded_state: Any) -> np.ndarray:
        """Rotate the session's keys: send ``imm``'s public arrays and ``x~``; get ``x~`` moved.

        The server builds the new target as at set-up and returns ``Pi2_new Pi2_old_left x~``
        (what :meth:`~immersion.coding.rotation.RotatingTarget.rekey` does in process); later
        ``advance`` calls run under the new keys, and a set-up after a server restart sends
        the new arrays. Only the session's owner (its CurveZMQ key) can rekey it.

        The request names the arrays it rotates from (their SHA-256), so the retry of a rekey
        whose reply was lost gets the first reply again instead of re-encoding ``x~`` twice.
        If every attempt times out, call ``rekey`` again with the same arguments before the
        next ``advance`` (the server may have rotated already; it answers the repeat alike).

        Parameters
        ----------
        imm:
            The handle of the new key period (``RotatingImmersion.current`` after a rotation).
        encoded_state:
            ``x~`` under the old keys.

        Returns
        -------
        np.ndarray
            ``x~`` under the new keys.
        """
        if self._channel._sock is None:
            raise InvalidArgumentError("self", "this RemoteTarget is closed")
        if kind_of(imm, algorithm="" if self._kind.needs_algorithm else None).name != (
            self._kind.name
        ):
            raise InvalidArgumentError("imm", f"expected a {self._kind.name!r} handle")
        arrays = npz_bytes(self._kind.public_arrays(imm))
        xt = self._vector("encoded_state", encoded_state)
        origin = hashlib.sha256(self._setup_frames[1]).digest()
        try:
            reply = self._channel.request(wire.REKEY, self._session, origin, xt, arrays)
        except UnknownSessionError:  # a restarted server: set up under the old keys, then rotate
            self._setup()
            self.resumed += 1
            reply = self._channel.request(wire.REKEY, self._session, origin, xt, arrays)
        if len(reply) != 1 or len(reply[0]) != len(xt):
            raise RemoteError("remote: the server's reply is malformed", code="malformed")
        self._setup_frames[1] = arrays
        self.bytes_sent += len(xt) + len(arrays)
        self.bytes_received += len(reply[0])
        return np.frombuffer(reply[0], dtype=self._dtype).copy()

    def close(self) -> None:
        """End the session on the server (best effort, one short try) and close the socket."""
        if self._channel._sock is None:
            return
        if self._session:
            self._channel.timeout_s = min(self._channel.timeout_s, 1.0)
            try:
                self._channel.request(wire.CLOSE, self._session, attempts=1)
            except RemoteError:
                pass
        self._channel.close()

    def __enter__(self) -> "RemoteTarget":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _admin_request(
    address: str, kind: bytes, server_key: Any, admin_key: Any, timeout_s: float
) -> list[bytes]:
    if server_key is None or admin_key is None:
        missing = "server_key" if server_key is None else "admin_key"
        raise InvalidArgumentError(missing, "stats and stop need the server key and an admin key")
    curve = _curve(address, server_key, admin_key, client_name="admin_key")
    channel = _Channel(
        address, timeout_s=v.positive_float("timeout_s", timeout_s), attempts=1, curve=curve
    )
    try:
        return channel.request(kind)
    finally:
        channel.close()


def remote_stats(
    address: str, *, server_key: Any, admin_key: Any, timeout_s: float = 5.0
) -> dict[str, Any]:
    """The server's ``stats`` (sessions, counters, latency percentiles); needs an admin key.

    Parameters
    ----------
    address:
        The server's ``tcp://HOST:PORT``.
    server_key, admin_key:
        The server's public key (``.key`` file or Z85 text) and an admin's ``.key_secret`` file
        (listed in the server's ``--admins``).
    timeout_s:
        Seconds to wait for the answer.

    Returns
    -------
    dict
        What :meth:`immersion.remote.server.Service.stats` returns on the server.
    """
    return dict(
        json.loads(_admin_request(address, wire.STATS, server_key, admin_key, timeout_s)[0])
    )


def stop_server(address: str, *, server_key: Any, admin_key: Any, timeout_s: float = 5.0) -> None:
    """Ask a server to stop after the requests in flight; needs an admin key (or send SIGTERM).

    Parameters
    ----------
    address, server_key, admin_key, timeout_s:
        As for :func:`remote_stats`.
    """
    _admin_request(address, wire.STOP, server_key, admin_key, timeout_s)
