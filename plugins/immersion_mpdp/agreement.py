"""Pairwise seeds and neighbour graphs for DDP_Client (seed 004 Remark 4, as in secure aggregation).

Every round each client makes a fresh X25519 key pair and publishes its public key (the server
relays public keys only). Two neighbours derive the same 32-byte secret by Diffie-Hellman and
expand it with HKDF-SHA256 into one seed per purpose (the DP noise ``Delta``, the masks of the
corrections); the seed keys AES-256 in counter mode, a cryptographic PRG. Nobody else, the server
included, can compute a pair's seed; a surviving neighbour can reveal it to recover a client
that dropped out (see :mod:`immersion_mpdp.ddp`). The key agreement, the seeds and the keystream
are the core's secure-sum primitive (:mod:`immersion.securesum`) under MP-DP's HKDF label.

Graphs (Remark 4): ``complete`` (every pair) or ``nout:N`` (each client picks ``N`` others at
random; an edge exists if either side picked it, so every degree is at least ``N``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from immersion import InvalidArgumentError, securesum

#: The HKDF label of MP-DP's pair seeds (kept since the first release: runs stay bit-identical).
LABEL = "immersion-mpdp"


@dataclass
class KeyAgreement(securesum.KeyAgreement):
    """One client's ephemeral X25519 key pair for one round, with MP-DP's HKDF label.

    :class:`immersion.securesum.KeyAgreement` with ``label="immersion-mpdp"``.

    Parameters
    ----------
    client : int
        The client's index.
    round_t : int
        The round.
    private_bytes : bytes, optional
        32 raw bytes of the private key (reproducible simulations); OS entropy by default.
    label : str
        HKDF label, ``"immersion-mpdp"``.
    """

    label: str = LABEL


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
