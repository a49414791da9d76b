"""Remote target: run the cloud side in another process or machine, exchanging encoded vectors only.

Transport: ZeroMQ (pyzmq, extra ``remote``), REQ/REP. Chosen over gRPC because a control loop is
one small request and one small reply per sample: ZeroMQ needs no schema compilation, adds no
HTTP/2 framing, and its loopback round trip is tens of microseconds; pyzmq is a small, widely
used, actively maintained binding.

Protocol (multipart messages, JSON headers, float64 payloads; nothing is unpickled):

* ``setup``: header ``{"algorithm": NAME, "params": {...}}`` plus an ``.npz`` of the public
  target matrices ``Pi1_left, Pi2, Pi2_left, Pi3, Pi4``. The server builds ``f`` and ``g`` from
  its own plugin registry (only registered algorithms run), never from code sent over the wire.
* ``advance``: raw ``x~`` and ``y~``; reply raw ``u~`` and ``x~+`` (seed 002 eq. 17).

LWE targets (``coding="lwe"``, :mod:`immersion.lwe`): ``setup`` carries ``{"coding": "lwe"}`` and
an ``.npz`` of the public integer matrix and sizes (:meth:`~immersion.lwe.LweTarget.public_arrays`);
``advance`` carries uint64 words (header and ciphertext ``b`` words) instead of float64.

The server never receives ``N1``, ``Pi3_left``, the noise, an LWE key or any decoded value.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import numpy as np

from ._files import npz_bytes
from .errors import ImmersionError, InvalidArgumentError, OptionalDependencyError

PUBLIC_MATRICES = ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4")


class RemoteError(ImmersionError):
    """The remote side refused a request, or did not answer in time."""


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise OptionalDependencyError("pyzmq", "remote", "remote mode") from None
    return zmq


def public_target_matrices(keys: Any) -> dict[str, np.ndarray]:
    """The matrices the cloud needs for eq. 17 (dense keys only: remote mode ships them once)."""
    if keys.kind != "dense":
        raise InvalidArgumentError(
            "keys", "remote mode ships dense target matrices; use keys='dense'"
        )
    return {name: np.ascontiguousarray(getattr(keys, name)) for name in PUBLIC_MATRICES}


def _unpack(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


class RemoteTarget:
    """Client side: the same ``advance`` as :class:`~immersion.target.TargetAlgorithm`, over ZeroMQ.

    Examples
    --------
    ``cloud = RemoteTarget("tcp://10.0.0.5:5555", imm, algorithm="reactor-controller",
    params={"dt": 0.01})`` (an LWE handle needs no algorithm: its target is the integer matrix),
    then ``u_enc, x_enc = cloud.advance(x_enc, y_enc)`` in the control loop.
    """

    def __init__(
        self,
        address: str,
        imm: Any,
        *,
        algorithm: str | None = None,
        params: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REQ)
        self._sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
        self._sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.connect(address)
        except (zmq.ZMQError, TypeError) as exc:
            self._sock.close()
            raise InvalidArgumentError(
                "address", f"{address!r} is not a ZeroMQ address such as tcp://HOST:PORT ({exc})"
            ) from None
        self.address = address
        self.bytes_sent = self.bytes_received = self.samples = 0
        if getattr(imm, "coding", None) == "lwe":
            self._dtype: Any = np.uint64
            setup = [json.dumps({"coding": "lwe"}).encode(), npz_bytes(imm.target.public_arrays())]
        else:
            if algorithm is None:
                self._sock.close()
                raise InvalidArgumentError("algorithm", "name the registered algorithm f, g run")
            self._dtype = np.float64
            header = json.dumps({"algorithm": algorithm, "params": params or {}}).encode()
            setup = [header, npz_bytes(public_target_matrices(imm.keys))]
        reply = self._request([b"setup", *setup])
        info = json.loads(reply[0])
        self.n_state_encoded, self.n_input_encoded = (
            info["n_state_encoded"],
            info["n_input_encoded"],
        )

    def _request(self, frames: list[bytes]) -> list[bytes]:
        try:
            self._sock.send_multipart(frames)
            status, *rest = self._sock.recv_multipart()
        except self._zmq.Again:
            raise RemoteError(
                f"remote: no answer from {self.address} in time (is `immersion serve` running?)"
            ) from None
        if status != b"ok":
            raise RemoteError(f"remote: {rest[0].decode(errors='replace') if rest else 'refused'}")
        return rest

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """Send ``x~, y~``; receive ``u~, x~+`` (float64, or uint64 words for LWE targets).

        ``bytes_sent`` and ``bytes_received`` count the payload of every ``advance``.
        """
        xt = np.ascontiguousarray(encoded_state, dtype=self._dtype).tobytes()
        yt = np.ascontiguousarray(encoded_input, dtype=self._dtype).tobytes()
        ut, xt_next = self._request([b"advance", xt, yt])
        self.bytes_sent += len(xt) + len(yt)
        self.bytes_received += len(ut) + len(xt_next)
        self.samples += 1
        return np.frombuffer(ut, dtype=self._dtype).copy(), np.frombuffer(
            xt_next, dtype=self._dtype
        ).copy()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "RemoteTarget":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _build_target(header: dict[str, Any], matrices: dict[str, np.ndarray]) -> Any:
    if header.get("coding") == "lwe":
        from .lwe import LweTarget

        return LweTarget.from_public_arrays(matrices)
    from .backends import make_backend
    from .plugin_manager import registry
    from .probing import uses_public
    from .target import CheckedFunction, TargetAlgorithm

    spec = registry().algorithm(str(header["algorithm"]))
    params = header.get("params") or {}
    if not isinstance(params, dict):
        raise InvalidArgumentError("params", "expected a JSON object")
    algo = spec.build(**params)
    be = make_backend("numpy", dtype=None, device=None)
    missing = [m for m in PUBLIC_MATRICES if m not in matrices]
    if missing:
        raise InvalidArgumentError("setup", f"missing matrices {missing}")
    f = CheckedFunction(algo.f, "f", algo.n_state, uses_public(algo.f, "f"), be)
    g = CheckedFunction(algo.g, "g", algo.n_output, uses_public(algo.g, "g"), be)
    return TargetAlgorithm.from_matrices(f=f, g=g, backend=be, **matrices)


def serve(
    bind: str = "tcp://127.0.0.1:5555", *, max_requests: int | None = None, log: Any = None
) -> int:
    """Run the cloud side until ``max_requests`` requests (or forever); return the count served."""
    zmq = _zmq()
    sock = zmq.Context.instance().socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(bind)
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    log(f"immersion serve: listening on {sock.getsockopt(zmq.LAST_ENDPOINT).decode()}")
    target, served = None, 0
    try:
        while max_requests is None or served < max_requests:
            frames = sock.recv_multipart()
            served += 1
            try:
                kind = frames[0]
                if kind == b"setup":
                    header = json.loads(frames[1])
                    target = _build_target(header, _unpack(frames[2]))
                    log(f"immersion serve: target {header.get('algorithm') or target!r} installed")
                    sock.send_multipart(
                        [
                            b"ok",
                            json.dumps(
                                {
                                    "n_state_encoded": target.n_state_encoded,
                                    "n_input_encoded": target.n_input_encoded,
                                }
                            ).encode(),
                        ]
                    )
                elif kind == b"advance":
                    if target is None:
                        raise InvalidArgumentError(
                            "advance", "no target installed: send setup first"
                        )
                    wire = np.uint64 if getattr(target, "coding", None) == "lwe" else np.float64
                    xt = np.frombuffer(frames[1], dtype=wire)
                    yt = np.frombuffer(frames[2], dtype=wire)
                    ut, xt_next = target.advance(xt, yt)
                    sock.send_multipart(
                        [
                            b"ok",
                            np.ascontiguousarray(ut).tobytes(),
                            np.ascontiguousarray(xt_next).tobytes(),
                        ]
                    )
                elif kind == b"stop":
                    sock.send_multipart([b"ok"])
                    break
                else:
                    raise InvalidArgumentError("request", f"unknown request {kind[:20]!r}")
            except (ImmersionError, ValueError, KeyError, IndexError, TypeError) as exc:
                sock.send_multipart([b"error", str(exc).encode()])
    finally:
        sock.close()
    return served


def stop_server(address: str, *, timeout_s: float = 5.0) -> None:
    """Ask a server to stop (used by tests and by the demo's spawned server)."""
    zmq = _zmq()
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart([b"stop"])
        sock.recv_multipart()
    except zmq.Again:
        pass
    finally:
        sock.close()
