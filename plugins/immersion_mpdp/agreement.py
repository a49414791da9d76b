"""Pairwise seeds and neighbour graphs for DDP_Client (seed 004 Remark 4, as in secure aggregation).

Every round each client makes a fresh X25519 key pair and publishes its public key (the server
relays public keys only). Two neighbours derive the same 32-byte secret by Diffie-Hellman and
expand it with HKDF-SHA256 into one seed per purpose (the DP noise ``Delta``, the masks of the
corrections); the seed keys AES-256 in counter mode, a cryptographic PRG. Nobody else, the server
included, can compute a pair's seed; a surviving neighbour can reveal it to recover a client
that dropped out (see :mod:`immersion_mpdp.ddp`).

Graphs (Remark 4): ``complete`` (every pair) or ``nout:N`` (each client picks ``N`` others at
random; an edge exists if either side picked it, so every degree is at least ``N``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from immersion import InvalidArgumentError, OptionalDependencyError


def _crypto() -> tuple[Any, Any, Any, Any]:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.x25519 import (
            X25519PrivateKey,
            X25519PublicKey,
        )
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:
        raise OptionalDependencyError(
            "cryptography", "fl", "pairwise key agreement (mpdp)"
        ) from None
    return X25519PrivateKey, X25519PublicKey, HKDF, hashes.SHA256


PUBLIC_KEY_BYTES = 32


@dataclass
class KeyAgreement:
    """One client's ephemeral X25519 key pair for one round.

    The private key comes from OS entropy, or from ``private_bytes`` (32 bytes) where a
    simulation wants reproducible runs.
    """

    client: int
    round_t: int
    private_bytes: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        private_cls = _crypto()[0]
        if self.private_bytes is None:
            self._private = private_cls.generate()
        else:
            if len(self.private_bytes) != 32:
                raise InvalidArgumentError("private_bytes", "expected 32 bytes")
            self._private = private_cls.from_private_bytes(self.private_bytes)  # type: ignore[attr-defined]

    def private_key_bytes(self) -> bytes:
        """The raw private key (32 bytes), for a node that must keep it between messages."""
        from cryptography.hazmat.primitives import serialization

        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def public_bytes(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw,  # type: ignore[attr-defined]
            serialization.PublicFormat.Raw,
        )

    def pair_seeds(
        self, peer: int, peer_public: bytes, purposes: tuple[str, ...]
    ) -> dict[str, bytes]:
        """32-byte seeds shared with ``peer``, one per purpose (both sides get the same bytes): one
        Diffie-Hellman exchange, then HKDF-SHA256 with the round, the pair and the purpose as info.
        """
        _, public_cls, hkdf_cls, sha256 = _crypto()
        if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
            raise InvalidArgumentError(
                "peer_public", f"expected {PUBLIC_KEY_BYTES} raw bytes of an X25519 key"
            )
        secret = self._private.exchange(public_cls.from_public_bytes(peer_public))
        low, high = sorted((self.client, peer))
        return {
            purpose: hkdf_cls(
                algorithm=sha256(),
                length=32,
                salt=None,
                info=f"immersion-mpdp/{purpose}/round {self.round_t}/pair {low}-{high}".encode(),
            ).derive(secret)
            for purpose in purposes
        }

    def pair_seed(self, peer: int, peer_public: bytes, purpose: str) -> bytes:
        """The seed shared with ``peer`` for one ``purpose``."""
        return self.pair_seeds(peer, peer_public, (purpose,))[purpose]


def keystream(seed: bytes, n_words: int) -> np.ndarray:
    """``n_words`` pseudo-random 64-bit words: AES-256 in counter mode keyed by ``seed`` (a
    cryptographic PRG; as fast here as numpy's Philox).

    Examples
    --------
    >>> words = keystream(bytes(32), 4)
    >>> words.dtype, len(words), bool((words == keystream(bytes(32), 4)).all())
    (dtype('uint64'), 4, True)
    """
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if len(seed) != 32:
        raise InvalidArgumentError("seed", f"expected 32 bytes, got {len(seed)}")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * n_words)), dtype=np.uint64)


def keystream_uniform(seed: bytes, n: int, low: float, high: float) -> np.ndarray:
    """``n`` uniform draws in ``[low, high)`` from :func:`keystream` (53 random bits each)."""
    unit = (keystream(seed, n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return low + (high - low) * unit


def parse_graph(spec: str) -> tuple[str, int]:
    """``"complete"`` -> ("complete", 0); ``"nout:N"`` -> ("nout", N); anything else is refused."""
    if spec == "complete":
        return "complete", 0
    kind, _, n = spec.partition(":")
    if kind == "nout" and n.isdigit() and int(n) >= 1:
        return "nout", int(n)
    raise InvalidArgumentError(
        "graph", f"expected 'complete' or 'nout:N' with N >= 1, got {spec!r}"
    )


def build_graph(clients: list[int], spec: str, rng: np.random.Generator) -> dict[int, list[int]]:
    """Neighbour lists of an undirected graph over ``clients`` (Remark 4).

    Examples
    --------
    >>> g = build_graph(list(range(6)), "nout:2", np.random.default_rng(0))
    >>> all(len(v) >= 2 for v in g.values()), all(k in g[v] for k in g for v in g[k])
    (True, True)
    >>> sorted(build_graph([3, 5, 9], "complete", np.random.default_rng(0))[5])
    [3, 9]
    """
    kind, n = parse_graph(spec)
    members = sorted(clients)
    edges: set[tuple[int, int]] = set()
    if kind == "complete" or n >= len(members) - 1:
        edges = set(itertools.combinations(members, 2))
    else:
        for k in members:
            others = [v for v in members if v != k]
            for v in rng.choice(others, size=n, replace=False):
                edges.add((min(k, int(v)), max(k, int(v))))
    graph: dict[int, list[int]] = {k: [] for k in members}
    for a, b in sorted(edges):
        graph[a].append(b)
        graph[b].append(a)
    return graph
