"""Who masks with whom in a round of :class:`~immersion_secagg.SecureAggregation`.

Every other member (the complete graph of Bonawitz et al., CCS 2017), or a ring of random order
in which each member masks with its ``k / 2`` nearest on either side (the k-regular graphs of
Bell et al., CCS 2020; SecAgg+'s ``num_shares``). With pairwise masks only, the server learns
the sum of each connected part of the contributors' graph: :func:`connected` is the check.

How many neighbours (:func:`ring_neighbours`, the wrapper's default). Call *bad* the members
that collude with the server (they hand it their seeds) or drop out after the key set-up; the
server learns the sum of each connected part of the *honest contributors* (members less bad).
On a ring where each member masks with the ``h`` nearest on either side, two honest members
``j + 1`` places apart are joined when ``j < h`` bad members lie between them, so the honest
contributors are split only if at least two runs of ``h`` consecutive bad members cut the ring:

* fewer than ``2 h`` bad members never split them (the ring is ``2 h``-connected, Harary 1962);
* with ``b`` bad members placed independently of the ring's order (the server draws it after
  the keys are advertised, fresh every round), the gaps between consecutive honest members are a
  uniform weak composition of ``b`` into ``K - b`` parts, and the chance that two of them reach
  ``h`` is at most :func:`split_bound` (the union bound over pairs of gaps).

:func:`ring_neighbours` takes the smallest ``k = 2 h`` for which ``ceil(K / 3)`` bad members
(a third of the members colluding or dropping out: our choice) split the honest contributors
with probability at most ``2^-40`` (40 bits of statistical security, as in Bell et al.), or every
other member when no smaller ring qualifies: complete up to 6 members, then 4 for 7 to 9, 6 for
10, 18 for 50, 26 for 100, 36 for 1,000. The server still aborts a round whose contributors'
graph is disconnected (dropouts alone never expose a part's sum), so more dropouts cost
availability, not privacy; more colluders than the fraction weaken the guarantee as
:func:`split_bound` says.
"""

from __future__ import annotations

import functools
import math
from math import comb

import numpy as np

#: Fraction of the members that may collude with the server or drop out.
BAD_FRACTION = 1 / 3
#: The honest contributors are split with probability at most ``2^-SECURITY_BITS``.
SECURITY_BITS = 40


def split_bound(members: int, bad: int, half: int) -> float:
    """Bound on the chance that ``bad`` members split the honest others on a random ring.

    For ``bad`` members placed independently of the ring's order, the ``g = members - bad``
    honest members cut the ring into ``g`` gaps whose sizes are a uniform weak composition of
    ``bad`` (``C(bad + g - 1, g - 1)`` of them); the honest members are split only if two gaps
    hold ``half`` or more, and a given pair of gaps does in ``C(bad - 2 half + g - 1, g - 1)``
    compositions: the union bound over the ``C(g, 2)`` pairs.

    Parameters
    ----------
    members : int
        Members of the round (``K``).
    bad : int
        Members that collude with the server or drop out.
    half : int
        Peers on either side of each member (``k / 2``).

    Returns
    -------
    float
        The bound (0 when ``bad < 2 half``, or the ring is complete: never split).

    Examples
    --------
    >>> split_bound(50, 17, 9), split_bound(100, 34, 13) < 2.0**-40 < split_bound(100, 34, 12)
    (0.0, True)
    """
    honest = members - bad
    if honest <= 1 or bad < 2 * half or members <= 2 * half + 1:
        return 0.0
    pairs = comb(honest, 2) * comb(bad - 2 * half + honest - 1, honest - 1)
    return min(1.0, pairs / comb(bad + honest - 1, honest - 1))


@functools.lru_cache(maxsize=64)
def ring_neighbours(
    members: int, bad_fraction: float = BAD_FRACTION, security_bits: int = SECURITY_BITS
) -> int | None:
    """The fewest neighbours ``k`` (even) whose random ring keeps the honest contributors whole.

    Parameters
    ----------
    members : int
        Members of the round.
    bad_fraction : float
        Fraction of them that may collude with the server or drop out (rounded up).
    security_bits : int
        The split's probability is at most ``2^-security_bits``.

    Returns
    -------
    int or None
        ``k``; None when only the complete graph qualifies (small rounds).

    Examples
    --------
    >>> [ring_neighbours(n) for n in (6, 7, 10, 50, 100, 1000)]
    [None, 4, 6, 18, 26, 36]
    """
    bad = math.ceil(bad_fraction * members)
    half = 1
    while 2 * half + 1 < members - 1:
        if split_bound(members, bad, half) <= 2.0**-security_bits:
            return 2 * half
        half += 1
    return None


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
