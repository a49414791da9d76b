"""Pairwise seeds and neighbour graphs for DDP_Client (seed 004 Remark 4, as in secure aggregation).

Each client makes one X25519 key pair for the run and publishes its public key every round (the
server relays public keys only). Two neighbours derive the same 32-byte secret by Diffie-Hellman
once and expand it with HKDF-SHA256 into one seed per purpose (the DP noise ``Delta``, the masks
of the corrections), round and retry: the HKDF info names all three, so the seeds of one round
(or of an aborted attempt, revealed to recover a dropout) say nothing about any other. The seed
keys AES-128 in counter mode, a cryptographic PRG. Nobody else, the server included, can compute
a pair's seed; a surviving neighbour can reveal one round's seeds to recover a client that dropped
out (see :mod:`immersion_mpdp.ddp`). The key agreement, the seeds and the keystream are the
core's secure-sum primitive (:mod:`immersion.securesum.protocol`) under MP-DP's HKDF label.

Graphs (Remark 4): ``complete`` (every pair) or ``nout:N`` (each client picks ``N`` others at
random; an edge exists if either side picked it, so every degree is at least ``N``). A round has
two: the graph of the noise ``Delta``, which the privacy theorem depends on (Theorem 10 for the
complete graph, 11 for an n-out one), and the graph of the masks of the corrections, which only
sets how many colluding neighbours it takes to unmask one client (it must stay connected). Both
default to ``"auto"`` (:func:`immersion_mpdp.calibration.resolve_noise_graph`,
:func:`resolve_mask_graph`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
from immersion import InvalidArgumentError
from immersion.securesum import protocol as securesum

#: The HKDF label of MP-DP's pair seeds (kept since the first release: runs stay bit-identical).
LABEL = "immersion-mpdp"


@dataclass
class KeyAgreement(securesum.KeyAgreement):
    """One client's X25519 key pair, with MP-DP's HKDF label; a client keeps it for the run and
    asks for the seeds of each round and retry (``pair_seeds(..., round_t=t, attempt=a)``).

    :class:`immersion.securesum.protocol.KeyAgreement` with ``label="immersion-mpdp"``.

    Parameters
    ----------
    client : int
        The client's index.
    round_t : int
        The round it was made in (the default round of ``pair_seeds``).
    private_bytes : bytes, optional
        32 raw bytes of the private key (reproducible simulations); OS entropy by default.
    label : str
        HKDF label, ``"immersion-mpdp"``.
    """

    label: str = LABEL


#: ``mask_graph="auto"``: the complete graph up to this many clients, ``nout:AUTO_MASK_N`` above.
AUTO_MASK_MAX_COMPLETE = 7
AUTO_MASK_N = 2
#: Draws of a mask graph before giving up on a connected one.
CONNECTED_TRIES = 1000


class GraphError(InvalidArgumentError):
    """No connected mask graph was drawn (``nout:N`` with too small an ``N``)."""


def parse_graph(spec: str) -> tuple[str, int]:
    """``"complete"`` -> ("complete", 0); ``"nout:N"`` -> ("nout", N); ``"auto"`` -> ("auto",
    0); anything else is refused."""
    if spec in ("complete", "auto"):
        return spec, 0
    kind, _, n = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if kind == "nout" and n.isdigit() and int(n) >= 1:
        return "nout", int(n)
    raise InvalidArgumentError(
        "graph", f"expected 'auto', 'complete' or 'nout:N' with N >= 1, got {spec!r}"
    )


def resolve_mask_graph(spec: str, n_clients: int) -> str:
    """The graph of the correction masks that ``spec`` means for ``n_clients``.

    ``"auto"``: complete up to :data:`AUTO_MASK_MAX_COMPLETE` clients, ``nout:2`` above (each
    client masks with about 3 to 4 peers instead of ``K - 1``; it takes 2 colluding
    neighbours, not ``K - 1`` other clients, to unmask one). Other specs are returned as they are.

    Parameters
    ----------
    spec : str
        ``"auto"``, ``"complete"`` or ``"nout:N"``.
    n_clients : int
        ``K``.

    Examples
    --------
    >>> resolve_mask_graph("auto", 6), resolve_mask_graph("auto", 10)
    ('complete', 'nout:2')
    """
    if parse_graph(spec)[0] != "auto":
        return spec
    return "complete" if n_clients <= AUTO_MASK_MAX_COMPLETE else f"nout:{AUTO_MASK_N}"


def build_graph(
    clients: list[int], spec: str, rng: np.random.Generator, *, connected: bool = False
) -> dict[int, list[int]]:
    """Neighbour lists of an undirected graph over ``clients`` (Remark 4).

    Parameters
    ----------
    clients : list of int
        The round's members.
    spec : str
        ``"complete"`` or ``"nout:N"`` (resolve ``"auto"`` first).
    rng : np.random.Generator
        Source of the n-out picks.
    connected : bool
        Draw again until the graph is connected (masks: a component would reveal its sum).

    Examples
    --------
    >>> g = build_graph(list(range(6)), "nout:2", np.random.default_rng(0))
    >>> all(len(v) >= 2 for v in g.values()), all(k in g[v] for k in g for v in g[k])
    (True, True)
    >>> sorted(build_graph([3, 5, 9], "complete", np.random.default_rng(0))[5])
    [3, 9]
    """
    kind, n = parse_graph(spec)
    if kind == "auto":
        raise InvalidArgumentError("graph", "resolve 'auto' for the round's clients first")
    members = sorted(clients)
    for _ in range(CONNECTED_TRIES if connected else 1):
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
        if not connected or len(components(graph, members)) <= 1:
            return graph
    raise GraphError(
        "mask_graph",
        f"no connected {spec} graph over {len(members)} clients in {CONNECTED_TRIES} draws; "
        "use a larger N",
    )


def components(graph: Mapping[int, Iterable[int]], members: Iterable[int]) -> list[list[int]]:
    """The connected components of ``graph`` restricted to ``members`` (sorted lists).

    Parameters
    ----------
    graph : mapping of int to iterable of int
        Neighbours of each client.
    members : iterable of int
        The clients to keep (edges to others are ignored).

    Examples
    --------
    >>> components({0: [1], 1: [0, 2], 2: [1], 3: []}, [0, 2, 3])
    [[0], [2], [3]]
    """
    keep = set(members)
    seen: set[int] = set()
    out = []
    for start in sorted(keep):
        if start in seen:
            continue
        part, stack = [], [start]
        seen.add(start)
        while stack:
            k = stack.pop()
            part.append(k)
            for v in graph.get(k, ()):
                if v in keep and v not in seen:
                    seen.add(v)
                    stack.append(v)
        out.append(sorted(part))
    return out


#: A round's graph: ``{client: {neighbour: purposes of the edge}}``.
RoundGraph = dict[int, dict[int, tuple[str, ...]]]


def round_graph(
    clients: list[int],
    noise_spec: str | None,
    mask_spec: str | None,
    rng: np.random.Generator,
) -> RoundGraph:
    """The round's edges and what each carries: ``"delta"`` (the noise graph, drawn as
    Theorem 11 assumes) and ``"mask"`` (the mask graph, drawn again until connected).

    Parameters
    ----------
    clients : list of int
        The round's members.
    noise_spec, mask_spec : str or None
        Resolved graphs (``"complete"`` or ``"nout:N"``); None: no edge of that purpose (no
        noise, or corrections in the clear).
    rng : np.random.Generator
        Source of the n-out picks (the noise graph first).

    Examples
    --------
    >>> g = round_graph([0, 1, 2], "complete", None, np.random.default_rng(0))
    >>> g[0]
    {1: ('delta',), 2: ('delta',)}
    """
    members = sorted(clients)
    graphs = [
        (purpose, build_graph(members, spec, rng, connected=purpose == "mask"))
        for purpose, spec in (("delta", noise_spec), ("mask", mask_spec))
        if spec is not None
    ]
    out: RoundGraph = {k: {} for k in members}
    for k in members:
        for v in sorted({v for _, g in graphs for v in g[k]}):
            out[k][v] = tuple(p for p, g in graphs if v in g[k])
    return out


def edges_of(graph: RoundGraph, purpose: str) -> dict[int, list[int]]:
    """The neighbour lists of one purpose's edges.

    Parameters
    ----------
    graph : RoundGraph
        From :func:`round_graph`.
    purpose : str
        ``"delta"`` or ``"mask"``.
    """
    return {k: [v for v, ps in peers.items() if purpose in ps] for k, peers in graph.items()}
