"""Who masks with whom in a round of :class:`~immersion_secagg.SecureAggregation`.

Every other member (the complete graph of Bonawitz et al., CCS 2017), or a ring of random order
in which each member masks with its ``k / 2`` nearest on either side (the k-regular graphs of
Bell et al., CCS 2020; SecAgg+'s ``num_shares``). With pairwise masks only, the server learns
the sum of each connected part of the contributors' graph: :func:`connected` is the check.
"""

from __future__ import annotations

import numpy as np


def mask_graph(
    members: list[int], neighbours: int | None, rng: np.random.Generator
) -> dict[int, list[int]]:
    """Who masks with whom: every other member, or a ring of random order with ``neighbours / 2``
    (rounded up) members on either side.

    Parameters
    ----------
    members : list of int
        The round's members.
    neighbours : int or None
        Peers per member (None, or at least ``len(members) - 1``: the complete graph).
    rng : numpy Generator
        Draws the ring's order.

    Returns
    -------
    dict of int to list of int
        Each member's peers, sorted; symmetric.

    Examples
    --------
    >>> g = mask_graph(list(range(8)), 2, np.random.default_rng(0))
    >>> [len(p) for p in g.values()] == [2] * 8, all(k in g[v] for k in g for v in g[k])
    (True, True)
    """
    if neighbours is None or neighbours >= len(members) - 1:
        return {k: [v for v in members if v != k] for k in members}
    ring = [members[i] for i in rng.permutation(len(members))]
    half, n = -(-neighbours // 2), len(ring)
    peers: dict[int, set[int]] = {k: set() for k in members}
    for i, k in enumerate(ring):
        for step in range(1, half + 1):
            peers[k] |= {ring[(i + step) % n], ring[(i - step) % n]}
    return {k: sorted(p) for k, p in peers.items()}


def connected(nodes: list[int], graph: dict[int, list[int]]) -> bool:
    """Whether ``nodes`` form one connected part of ``graph`` (edges among them only).

    Parameters
    ----------
    nodes : list of int
        The contributors.
    graph : dict of int to list of int
        Each member's peers.

    Examples
    --------
    >>> connected([1, 2, 3], {1: [2], 2: [1, 3], 3: [2]}), connected([1, 3], {1: [2], 3: [2]})
    (True, False)
    """
    inside = set(nodes)
    if not inside:
        return True
    seen, todo = set(), [nodes[0]]
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo.extend(v for v in graph.get(k, ()) if v in inside)
    return seen == inside
