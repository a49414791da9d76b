"""The wire protocol of ``immersion serve`` (version 3): frames, requests, error codes, addresses.

Shared by the server (:mod:`immersion.remote.server`) and the client
(:mod:`immersion.remote.client`). A request is one multipart ZeroMQ message ``[b"", kind,
request_id, *body]`` and its reply is ``[b"", request_id, b"ok", *body]`` or ``[b"", request_id,
b"error", code, message]``; the empty first frame lets plain REQ sockets (other languages, lock-step
clients) talk to the server as well as DEALER sockets. Nothing is pickled: headers are JSON, arrays
raw bytes or an uncompressed ``.npz`` (``numpy.savez``: stored members with the kind's array names,
no object dtype; the server reads their headers and counts their declared sizes against
``max_message_bytes`` before any array data).

=========  ================================  =====================================================
kind       request body                      reply body
=========  ================================  =====================================================
hello      (none)                            JSON: protocol, limits, target kinds
setup      JSON header, ``.npz`` of arrays   JSON: dimensions, session; the session id (16 bytes)
advance    session, ``x~``, ``y~``           ``u~``, ``x~+`` (seed 002 eq. 17, one sample)
rekey      session, digest (SHA-256) of the  ``x~`` under the new keys, ``Pi2_new Pi2_left x~``
           ``.npz`` the session runs,        (key rotation; the session then runs the new target;
           ``x~``, ``.npz`` of the new       the same rekey resent gets the same reply, one from
           public arrays                     other arrays ``stale-rekey``)
close      session                           (none)
stats      (none); admin keys only           JSON: sessions, counters, latency percentiles
stop       (none); admin keys only           (none); the server then stops
=========  ================================  =====================================================

Examples
--------
>>> is_loopback("tcp://127.0.0.1:5555"), is_loopback("tcp://0.0.0.0:5555")
(True, False)
>>> endpoint_host("tcp://[::1]:5555")
'::1'
"""

from __future__ import annotations

import ipaddress
import re

from ..errors import InvalidArgumentError

PROTOCOL = 3

#: Request kinds (first frame after the empty delimiter).
HELLO, SETUP, ADVANCE, REKEY, CLOSE, STATS, STOP = (
    b"hello",
    b"setup",
    b"advance",
    b"rekey",
    b"close",
    b"stats",
    b"stop",
)
OK, ERROR = b"ok", b"error"

#: Bytes of a session id (random, ``secrets.token_bytes``) and the longest request id accepted.
SESSION_BYTES = 16
MAX_REQUEST_ID_BYTES = 16
#: Bytes of the digest (SHA-256) a ``rekey`` names the arrays it rotates from by.
DIGEST_BYTES = 32

#: Every error code the server sends, with what it means.
ERROR_CODES: dict[str, str] = {
    "malformed": "the frames do not form a request of this protocol",
    "unknown-request": "the request kind is not one of hello/setup/advance/rekey/close/stats/stop",
    "unknown-session": "no session with this id belongs to this client (expired, closed, "
    "lost in a restart, or never created)",
    "too-many-sessions": "the server holds its maximum number of sessions",
    "message-too-large": "the request is larger than the server's max_message_bytes",
    "forbidden": "stats and stop need an admin key",
    "stale-rekey": "the rekey does not start from the arrays the session runs (a rotation "
    "skipped or applied twice); the same rekey resent unchanged gets its first reply instead",
    "invalid-argument": "the target refused the set-up or the vectors (the message names what)",
    "internal": "the target failed unexpectedly (the server logged the exception type)",
}

#: Codes the client gives its own errors (:mod:`immersion.remote.client`); no server sends them.
CLIENT_ERROR_CODES: dict[str, str] = {
    "timeout": "no answer within timeout_s on any of the attempts (RemoteTimeoutError)",
    "authentication": "the CurveZMQ handshake failed: key not listed, wrong server key, keys on "
    "one side only (AuthenticationError)",
    "disconnected": "the server closed the connection on every attempt before answering: it "
    "stopped or restarted, cut the connection (its connection cap), or dropped unread a frame "
    "over its max_message_bytes (DisconnectedError; the message says which fit)",
}

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\[\]\s]+):(?P<port>\d{1,5}|\*)$")
_LOCAL_NAMES = {"localhost", "lo"}


def endpoint_host(address: str, *, name: str = "address", bind: bool = False) -> str | None:
    """The host of a ``tcp://HOST:PORT`` endpoint, ``None`` for ``ipc://`` and ``inproc://``.

    Parameters
    ----------
    address:
        A ZeroMQ endpoint.
    name:
        The argument an :class:`~immersion.InvalidArgumentError` names for anything else.
    bind:
        Also accept ZeroMQ's ``*`` wildcard port (a client needs a number).
    """
    if not isinstance(address, str):
        raise InvalidArgumentError(name, f"expected a ZeroMQ address string, got {address!r}")
    for local in ("ipc://", "inproc://"):
        if address.startswith(local) and len(address) > len(local):
            return None
    match = _TCP.match(address)
    port = match.group("port") if match else ""
    if match is None or (port == "*" and not bind) or (port != "*" and not 0 < int(port) < 65536):
        raise InvalidArgumentError(
            name, f"{address!r} is not a ZeroMQ address such as tcp://HOST:PORT"
        )
    return match.group("host").strip("[]")


def is_loopback(address: str, *, name: str = "address", bind: bool = False) -> bool:
    """True if ``address`` only reaches this machine (loopback TCP, ``ipc://``, ``inproc://``).

    Parameters
    ----------
    address, name, bind:
        As for :func:`endpoint_host`.
    """
    host = endpoint_host(address, name=name, bind=bind)
    if host is None or host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name or an interface name other than lo: not known to be local
        return False
