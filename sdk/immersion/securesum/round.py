"""One secure-sum round driver: the phases of a round, whatever carries the messages.

A round of :mod:`.protocol` (Bonawitz et al., CCS 2017, section 4, without double masking) is
driven here once for every scheme and engine; the transport (calls in this process, or Flower
messages) is a :class:`RoundTransport` the caller supplies. One attempt:

1. **advertise**: every member is asked for a fresh public key; who does not answer is left out
   (recorded in ``dropped``) before any mask involves it;
2. **graph**: who masks with whom (every other member unless the transport says otherwise);
3. **upload**: every member is asked for its masked vector; a failure is left out and its masks
   are recovered in step 5. A transport may ask for the attempt to be run again with the same
   members (:meth:`RoundTransport.redo`, e.g. MP-DP's fall back to two words per value);
4. **split check**: if members dropped, the contributors' graph must stay connected, or the
   revealed seeds would give the aggregator the sum of each part (one client alone: its
   upload); otherwise the attempt is aborted with no seed asked for and run again among them;
5. **reveal**: each contributor with a dropped peer is asked for its pair seeds with it
   (:func:`~.protocol.reveal_requests`); if one does not answer, the attempt is aborted and run
   again with fresh keys among the other contributors (an aggregator that has seeds with a
   client must never accept that client's upload in the same attempt);
6. **unmask**: :meth:`RoundOutcome.unmask` (or the caller's own recovery with
   :meth:`RoundOutcome.revealed`).

At most ``max_attempts`` attempts; then the caller's ``given_up`` error. Fewer keys or
contributors than ``threshold`` (by default: none at all) raise the caller's ``too_few``
error, with no seed asked for. Every left-out client and aborted attempt is logged
(logger ``immersion.fl``) and recorded as ``{"round", "client", "reason"}`` and ``{"round",
"attempt", "reason", "silent"}`` dictionaries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

import numpy as np

from ..errors import InvalidArgumentError
from .protocol import from_fixed, recovery_mask, reveal_requests, revealed_pairs, sum_words

LOG = logging.getLogger("immersion.fl")

U = TypeVar("U")  # what a contributor uploads (masked words, or a scheme's upload)
S = TypeVar("S")  # what a survivor reveals per dropped peer (a seed, or seeds by purpose)
Graph = Mapping[int, Iterable[int]]


def complete_graph(members: list[int]) -> dict[int, list[int]]:
    """Every member is every other member's peer.

    Parameters
    ----------
    members : list of int
        The round's clients.

    Returns
    -------
    dict of int to list of int
        ``{member: [its peers]}``.

    Examples
    --------
    >>> complete_graph([0, 2, 5])
    {0: [2, 5], 2: [0, 5], 5: [0, 2]}
    """
    return {k: [v for v in members if v != k] for k in members}


class RoundTransport(Generic[U, S]):
    """How a round's phases reach the clients; subclasses implement :meth:`advertise`,
    :meth:`upload` and :meth:`reveal` (answers by client: the content, or why there is none).
    """

    def advertise(self, attempt: int, members: list[int]) -> Mapping[int, bytes | str]:
        """Phase 1: each member's fresh public key, or why it has none.

        Parameters
        ----------
        attempt : int
            The attempt of the round (from 0).
        members : list of int
            The clients asked.

        Returns
        -------
        mapping of int to bytes or str
            By client; a client absent from it is dropped without a record.
        """
        raise NotImplementedError

    def graph(self, members: list[int], publics: Mapping[int, bytes]) -> Graph:
        """Phase 2: the peers of every member (:func:`complete_graph` unless overridden).

        Parameters
        ----------
        members : list of int
            The clients that advertised a key (sorted).
        publics : mapping of int to bytes
            Their public keys.

        Returns
        -------
        mapping of int to iterable of int
            ``{member: peers}``.
        """
        return complete_graph(members)

    def upload(
        self, attempt: int, members: list[int], publics: Mapping[int, bytes], graph: Graph
    ) -> Mapping[int, U | str]:
        """Phase 3: each member's masked upload, or why it is left out.

        Parameters
        ----------
        attempt : int
            The attempt of the round.
        members : list of int
            The clients that advertised a key (sorted).
        publics : mapping of int to bytes
            Their public keys.
        graph : mapping of int to iterable of int
            From :meth:`graph`.

        Returns
        -------
        mapping of int to upload or str
            By client; a client absent from it is gone without a new record (its failure was
            recorded before).
        """
        raise NotImplementedError

    def redo(self) -> str | None:
        """After :meth:`upload`: why this attempt must be run again with the same members
        (recorded as an aborted attempt), or None (the default).

        Returns
        -------
        str or None
            The reason.
        """
        return None

    def reveal(
        self, attempt: int, asked: Mapping[int, list[int]], publics: Mapping[int, bytes]
    ) -> Mapping[int, Mapping[int, S] | str]:
        """Phase 5: each asked survivor's seeds with its dropped peers, or why there are none.

        Parameters
        ----------
        attempt : int
            The attempt of the round.
        asked : mapping of int to list of int
            ``{survivor: [dropped peers]}`` (:func:`~.protocol.reveal_requests`).
        publics : mapping of int to bytes
            Every member's public key.

        Returns
        -------
        mapping of int to (mapping of int to seed) or str
            ``{survivor: {dropped: seed}}``, or why the survivor did not reveal; a survivor absent
            from it did not answer.
        """
        raise NotImplementedError


@dataclass
class RoundOutcome(Generic[U, S]):
    """The attempt that succeeded: who took part, what they sent, the seeds revealed.

    Parameters
    ----------
    attempt : int
        The attempt (from 0).
    members : list of int
        The clients that advertised a key in it (sorted).
    publics : dict of int to bytes
        Their public keys.
    graph : mapping of int to iterable of int
        The peers of every member.
    uploads : dict of int to upload
        The contributors' uploads, in member order.
    seeds : dict
        ``seeds[survivor][dropped]`` revealed.
    """

    attempt: int
    members: list[int]
    publics: dict[int, bytes]
    graph: Graph
    uploads: dict[int, Any]
    seeds: dict[int, Mapping[int, Any]] = field(default_factory=dict)

    @property
    def contributors(self) -> list[int]:
        """The clients whose uploads are in the sum (sorted)."""
        return sorted(self.uploads)

    @property
    def gone(self) -> list[int]:
        """Members that advertised a key and did not contribute."""
        return [k for k in self.members if k not in self.uploads]

    def revealed(self) -> list[tuple[int, int, Any]]:
        """``(survivor, dropped, seed)`` for every pair to recover, in a fixed order.

        Returns
        -------
        list of tuple
            :func:`~.protocol.revealed_pairs`.
        """
        return revealed_pairs(self.gone, self.graph, self.uploads, self.seeds)

    def unmask(self, *, words: int = 2) -> np.ndarray:
        """The float sum of the contributors' masked words, the dropped clients' masks removed.

        Parameters
        ----------
        words : {1, 2}
            Words per value of the uploads.

        Returns
        -------
        np.ndarray
            float64, one value per ``words`` words.
        """
        total = sum_words([self.uploads[k] for k in self.contributors])
        if self.gone:
            total -= recovery_mask(self.revealed(), total.size)
        return from_fixed(total, words=words)


def sort_replies(
    asked: Mapping[int, Iterable[int]], replies: Mapping[int, Mapping[int, S] | str]
) -> tuple[dict[int, Mapping[int, S]], dict[int, str]]:
    """The seeds each asked survivor revealed, and the survivors that did not (with why).

    Parameters
    ----------
    asked : mapping of int to iterable of int
        ``{survivor: [dropped peers]}``, in the order the answers are read.
    replies : mapping
        By survivor: its seeds, or why there are none; a survivor absent did not answer.

    Returns
    -------
    tuple of dict
        ``({survivor: seeds}, {silent survivor: why})``: the attempt can be unmasked only if
        the second is empty.
    """
    seeds: dict[int, Mapping[int, S]] = {}
    silent: dict[int, str] = {}
    for v in asked:
        reply = replies.get(v, "no answer")
        if isinstance(reply, str):
            silent[v] = reply
        else:
            seeds[v] = reply
    return seeds, silent


def silent_reason(silent: Mapping[int, str], asked: Mapping[int, list[int]] | None = None) -> str:
    """Why an attempt was aborted: the survivors that did not reveal their seeds.

    Parameters
    ----------
    silent : mapping of int to str
        The survivors, with why.
    asked : mapping of int to list of int, optional
        What each was asked for; given, the reason names the dropped clients too.

    Returns
    -------
    str
        One clause per survivor, by index.

    Examples
    --------
    >>> silent_reason({3: "timeout"}, {3: [1, 2]})
    'client 3 did not reveal its seeds for dropped client 1, 2 (timeout)'
    """
    return "; ".join(
        f"client {v} did not reveal its seeds"
        + (f" for dropped client {', '.join(map(str, asked[v]))}" if asked is not None else "")
        + f" ({why})"
        for v, why in sorted(silent.items())
    )


@dataclass
class RoundRecords:
    """Where a round's left-out clients and aborted attempts are logged and recorded.

    Parameters
    ----------
    round_t : int
        The round.
    dropped : list of dict
        Left-out clients (``RunResult.dropped``).
    aborted : list of dict
        Aborted attempts (``RunResult.aborted``).
    """

    round_t: int
    dropped: list[dict[str, Any]]
    aborted: list[dict[str, Any]]

    def leave_out(self, client: int, reason: str) -> None:
        """Log and record a client left out of the round.

        Parameters
        ----------
        client : int
            The client.
        reason : str
            Why.
        """
        LOG.warning("round %d: client %d left out: %s", self.round_t, client, reason)
        self.dropped.append({"round": self.round_t, "client": client, "reason": reason})

    def abort(
        self, attempt: int, reason: str, silent: Iterable[int] = (), *, fresh: str = "keys"
    ) -> None:
        """Log and record an aborted attempt (run again with fresh ``keys`` or ``seeds``).

        Parameters
        ----------
        attempt : int
            The attempt (from 0; recorded from 1).
        reason : str
            Why.
        silent : iterable of int
            The survivors that did not reveal their seeds.
        fresh : str
            What the next attempt draws anew (for the log).
        """
        LOG.warning(
            "round %d aborted (attempt %d): %s; retrying with fresh %s",
            self.round_t,
            attempt + 1,
            reason,
            fresh,
        )
        self._record(attempt, reason, silent)

    def redo(self, attempt: int, reason: str) -> None:
        """Log and record an attempt run again with the same members (:meth:`RoundTransport.redo`).

        Parameters
        ----------
        attempt : int
            The attempt (from 0).
        reason : str
            Why.
        """
        LOG.warning("round %d (attempt %d): %s", self.round_t, attempt + 1, reason)
        self._record(attempt, reason, ())

    def _record(self, attempt: int, reason: str, silent: Iterable[int]) -> None:
        self.aborted.append(
            {
                "round": self.round_t,
                "attempt": attempt + 1,
                "reason": reason,
                "silent": sorted(silent),
            }
        )


def _kept(answers: Mapping[int, Any], records: RoundRecords) -> dict[int, Any]:
    """The answers that are not a reason, by client in order; each reason leaves its client out."""
    kept = {}
    for k in sorted(answers):
        if isinstance(answers[k], str):
            records.leave_out(k, answers[k])
        else:
            kept[k] = answers[k]
    return kept


def run_round(
    transport: RoundTransport[U, S],
    members: list[int],
    records: RoundRecords,
    *,
    max_attempts: int,
    too_few: Callable[[str], Exception],
    given_up: Callable[[], Exception],
    split: Callable[[Any, Mapping[int, Any]], str | None] | None = None,
    name_dropped: bool = False,
    party: str = "client",
    threshold: int = 1,
) -> RoundOutcome[U, S]:
    """Drive one secure round through ``transport`` until an attempt can be unmasked.

    Parameters
    ----------
    transport : RoundTransport
        Carries the phases to the clients.
    members : list of int
        The clients asked to advertise a key in the first attempt.
    records : RoundRecords
        Where left-out clients and aborted attempts go.
    max_attempts : int
        Attempts before ``given_up``.
    too_few : callable
        ``too_few(message)``: the error raised when fewer than ``threshold`` advertised or
        contributed.
    given_up : callable
        The error raised after ``max_attempts`` aborted attempts.
    split : callable, optional
        ``split(graph, contributors)``: why the contributors' graph cannot be unmasked (it falls
        apart), or None; asked only when members dropped.
    name_dropped : bool
        Name the dropped clients in a silent survivor's abort reason (:func:`silent_reason`).
    party : str
        What a client is called in ``too_few``'s message (``"client"``, ``"node"``).
    threshold : int
        The fewest keys and contributors an attempt may have (``too_few`` below): a sum of
        fewer contributors tells more about each (one alone: its vector).

    Returns
    -------
    RoundOutcome
        The attempt that succeeded.
    """
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise InvalidArgumentError(
            "max_attempts", f"expected an integer >= 1, got {max_attempts!r}"
        )
    if not isinstance(threshold, int) or threshold < 1:
        raise InvalidArgumentError("threshold", f"expected an integer >= 1, got {threshold!r}")
    t = records.round_t
    for attempt in range(max_attempts):
        publics = _kept(transport.advertise(attempt, members), records)
        members = sorted(publics)
        if len(members) < threshold:
            raise too_few(
                f"round {t}: "
                + (
                    f"{len(members)} {party}(s) advertised a key, fewer than the threshold "
                    f"{threshold}"
                    if members
                    else f"no {party} answered the key advertisement"
                )
            )
        graph = transport.graph(members, publics)
        uploads = _kept(transport.upload(attempt, members, publics, graph), records)
        redo = transport.redo()
        if redo:
            records.redo(attempt, redo)
            continue
        if len(uploads) < threshold:
            raise too_few(
                f"round {t}: "
                + (
                    f"{len(uploads)} of {len(members)} members uploaded, fewer than the "
                    f"threshold {threshold}"
                    if uploads
                    else "every client failed; nothing to aggregate"
                )
            )
        gone = [k for k in members if k not in uploads]
        apart = split(graph, uploads) if split is not None and gone else None
        if apart:
            records.abort(attempt, apart, fresh="seeds")
            members = sorted(uploads)
            continue
        asked = reveal_requests(gone, graph, uploads)
        seeds, silent = sort_replies(
            asked, transport.reveal(attempt, asked, publics) if asked else {}
        )
        if silent:
            reason = silent_reason(silent, asked if name_dropped else None)
            records.abort(attempt, reason, silent)
            members = [k for k in uploads if k not in silent]
            continue
        return RoundOutcome(attempt, members, publics, graph, uploads, seeds)
    raise given_up()
