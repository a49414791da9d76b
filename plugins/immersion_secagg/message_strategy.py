"""The server half of secure aggregation on Flower's Message API: :class:`SecureAggregation`.

``SecureAggregation(FedAvg(...))`` wraps any Message-API strategy whose aggregation is a function
of the weighted mean of the replies (FedAvg, FedProx, FedAvgM, FedAdam/FedAdagrad/FedYogi, the
client-side DP wrappers, a user's subclass of them). A round, with the core's secure sum
(:mod:`immersion.securesum`, Bonawitz et al. CCS 2017 section 4 without double masking):

1. ``configure_train``: the wrapped strategy samples the nodes and builds its messages; the
   wrapper asks those nodes for a fresh public key each (``advertise``, through the grid) and adds
   every member's key to the wrapped strategy's messages (``upload``). Nodes that do not answer
   are left out before any mask involves them.
2. Flower's loop sends them; each node's :func:`~immersion_secagg.secure_aggregation_mod` runs the
   user's train function and answers with ``[w x, w m, w]`` masked (``x`` the arrays, ``m`` the
   metrics, ``w`` the weighting metric, :class:`~.message_wire.Packing`).
3. ``aggregate_train``: the wrapper sums the masked words; for members that failed after the key
   set-up it asks the survivors for their pair seeds with them (``reveal``) and removes the
   uncancelled masks; it then hands the wrapped strategy one reply carrying the weighted means
   ``sum w x / sum w`` and ``sum w m / sum w`` with weight ``sum w``: the wrapped strategy's
   weighted mean of it is the mean of the real replies. Around Flower's DP wrappers, which check
   the count of replies, it hands one such reply per contributor (``K`` of them, weight
   ``sum w / K`` each) instead.

Below ``threshold`` contributors the round is aborted
(:class:`~.message_wire.SecureAggregationAborted`, logged and kept in
:attr:`SecureAggregation.aborted`): no seed is asked for, no model is returned, Flower's loop
keeps the previous global model. A survivor that does not reveal also aborts the
attempt (without double masking, the server may not then learn the seeds that would let it
unmask that survivor's upload): the round runs again among the other contributors with fresh keys
(``attempts``), or is aborted. Evaluation passes through unchanged (its metrics are not protected).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Strategy
from immersion import InvalidArgumentError
from immersion.securesum.protocol import reveal_requests
from immersion.securesum.round import RoundOutcome, sort_replies

from .message_graph import connected, mask_graph, ring_neighbours
from .message_wire import (
    DROPPED,
    KEY,
    MASKED,
    META,
    PUBLICS,
    SEEDS,
    STAGE,
    Packing,
    SecureAggregationAborted,
    as_numpy,
)

if TYPE_CHECKING:
    from flwr.serverapp import Grid

LOG = logging.getLogger("immersion.fl")

#: Strategies whose aggregation needs every reply (a median, a distance, a per-reply clip):
#: refused, since the server only ever holds the sum.
PER_REPLY_STRATEGIES = (
    "FedMedian",
    "FedTrimmedAvg",
    "Krum",
    "MultiKrum",
    "Bulyan",
    "QFedAvg",
    "DifferentialPrivacyServerSideFixedClipping",
    "DifferentialPrivacyServerSideAdaptiveClipping",
    "DifferentialPrivacyClientSideAdaptiveClipping",
    "FedXgbBagging",
    "FedXgbCyclic",
)

NO_MOD = " (no node answered with a key: is secure_aggregation_mod on the train function?)"


class SecureAggregation(Strategy):
    """Secure aggregation around a Flower Message-API strategy (server side).

    Parameters
    ----------
    strategy : Strategy
        The user's strategy (e.g. ``FedAvg(...)``); it samples nodes, builds messages and
        aggregates, on the unmasked weighted means, as it always does.
    threshold : int
        The fewest contributors whose sum the server may learn (at least 2); below it the round
        is aborted. Nodes refuse to mask for fewer members or to reveal seeds that would leave
        fewer survivors.
    words : {1, 2}
        Fixed-point words (uint64) per value (:func:`immersion.securesum.protocol.to_fixed`). 1
        (default): each value is moved by at most 2^-39 (about 1.8e-12), range ``|w x| < 2^24 /
        K`` (``K`` members; the values masked are ``w x``, weight times update: 3.4e5 for 50
        members); a node beyond it refuses by name (``FixedPointRangeError``) and is left out.
        2: at most 2^-61, range ``2^42 / K``, twice the masks' cost and the upload.
    timeout : float
        Seconds to wait for the ``advertise`` and ``reveal`` answers.
    neighbours : int, "auto" or None
        Each member masks with this many others: a ring in a fresh random order per round, each
        member paired with the ``neighbours / 2`` next on either side (rounded up; the k-regular
        graphs of Bell et al., CCS 2020, SecAgg+'s ``num_shares``). The masks then cost
        ``neighbours`` keystreams and key agreements per node instead of ``K - 1``; the server
        refuses a sum whose contributors' graph is disconnected (it would learn each part's sum).
        ``"auto"`` (default): :func:`~.message_graph.ring_neighbours` of the round's ``K``
        members, the fewest for which ``ceil(K / 3)`` members colluding with the server or
        dropping out split the honest contributors with probability at most 2^-40, and fewer
        than ``k`` never do (4 for 7 to 9 members, 6 for 10, 18 for 50, 26 for 100, 36 for
        1,000; the complete graph up to 6). None: every other member (the complete graph: the
        honest contributors stay whole whatever the number of colluders).
    rng : int or numpy Generator, optional
        Seeds the ring's order (None: OS entropy).
    attempts : int
        Tries of a round: if a survivor does not reveal its seeds, the round is run again among
        the other contributors with fresh keys (their train function runs again), at most
        ``attempts`` times in all (1: abort at once).
    budget : object, optional
        A privacy budget with ``check(contributors)`` (raises before a round that would exceed
        it) and ``spend(contributors)`` (after a round), e.g.
        :class:`~immersion_secagg.SecureSumBudget`.

    Examples
    --------
    In the ServerApp (the ClientApp's train function takes ``mods=[secure_aggregation_mod]``)::

        strategy = SecureAggregation(FedAvg(fraction_train=1.0), threshold=2)
        result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        threshold: int = 2,
        words: int = 1,
        timeout: float = 600.0,
        neighbours: int | str | None = "auto",
        rng: int | np.random.Generator | None = None,
        attempts: int = 2,
        budget: Any = None,
    ) -> None:
        if not isinstance(strategy, Strategy):
            raise InvalidArgumentError(
                "strategy", f"expected a Flower Strategy, got {type(strategy).__name__}"
            )
        for inner in _chain(strategy):
            if type(inner).__name__ in PER_REPLY_STRATEGIES:
                raise InvalidArgumentError(
                    "strategy",
                    f"{type(inner).__name__} needs every reply; under secure aggregation the "
                    "server holds only their sum (use FedAvg-like strategies, client-side "
                    "fixed clipping for DP)",
                )
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 2:
            raise InvalidArgumentError("threshold", f"expected an integer >= 2, got {threshold!r}")
        if words not in (1, 2) or isinstance(words, bool):
            raise InvalidArgumentError("words", f"expected 1 or 2, got {words!r}")
        if neighbours not in (None, "auto") and (
            isinstance(neighbours, bool) or not isinstance(neighbours, int) or neighbours < 2
        ):
            raise InvalidArgumentError(
                "neighbours", f"expected an integer >= 2, 'auto' or None, got {neighbours!r}"
            )
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidArgumentError("attempts", f"expected an integer >= 1, got {attempts!r}")
        if not timeout > 0:
            raise InvalidArgumentError("timeout", f"expected > 0 seconds, got {timeout!r}")
        super().__init__()
        self.strategy, self.threshold, self.words, self.timeout = (
            strategy,
            threshold,
            words,
            timeout,
        )
        self.budget, self.neighbours, self.attempts = budget, neighbours, attempts
        self._messages: dict[int, Message] = {}
        self._rng = np.random.default_rng(rng)
        self._graph: dict[int, list[int]] = {}
        self.weight_key = _weight_key(strategy)
        self._counts_replies = any(
            type(inner).__name__.startswith("DifferentialPrivacy") for inner in _chain(strategy)
        )
        self.aborted: list[SecureAggregationAborted] = []
        #: Per round: members, contributors, dropped (with why), bytes received per node.
        self.rounds: dict[int, dict[str, Any]] = {}
        self._grid: Grid | None = None
        self._publics: dict[int, bytes] = {}
        self._packing_arrays: list[tuple[str, tuple[int, ...], str]] = []

    def __repr__(self) -> str:
        return f"SecureAggregation(threshold={self.threshold}, wrapping {self.strategy!r})"

    def summary(self) -> None:
        """Log the wrapper's settings, then the wrapped strategy's."""
        LOG.info(
            "secure aggregation: threshold %d, %d word(s) per value, neighbours %s",
            self.threshold,
            self.words,
            "every other member" if self.neighbours is None else self.neighbours,
        )
        self.strategy.summary()

    # ------------------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: "Grid"
    ) -> Iterable[Message]:
        """The wrapped strategy's train messages, after a key advertisement to their nodes.

        Parameters
        ----------
        server_round : int
            The round, from 1.
        arrays : ArrayRecord
            The global model.
        config : ConfigRecord
            The round's configuration.
        grid : Grid
            The Flower grid (the advertisement goes through it).

        Returns
        -------
        Iterable[Message]
            One ``upload`` message per node that advertised a key (none if the round is
            aborted: fewer than ``threshold`` keys).
        """
        if self.budget is not None:
            self.budget.check(self.threshold)
        self._grid, self._publics = grid, {}
        self._packing_arrays = Packing.arrays_layout(arrays)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._messages = {m.metadata.dst_node_id: m for m in messages}
        self.rounds[server_round] = {"sampled": len(messages), "dropped": {}}
        if not messages or not self._advertise(server_round, sorted(self._messages)):
            return []
        return self._uploads(server_round)

    def _advertise(self, server_round: int, nodes: list[int]) -> bool:
        """Fresh public keys from ``nodes`` and the round's mask graph; False if aborted."""
        info = self.rounds[server_round]
        head = {"round": server_round, "threshold": self.threshold}
        request = RecordDict({STAGE: ConfigRecord({"stage": "advertise", **head})})
        self._publics = {}
        for node, reply in self._send({node: request for node in nodes}).items():
            key = _key(reply)
            if isinstance(key, str):
                info["dropped"][node] = f"advertise: {key}"
            else:
                self._publics[node] = key
        info["members"] = sorted(self._publics)
        if len(self._publics) < self.threshold:
            self._abort(
                server_round,
                f"{len(self._publics)} of {len(nodes)} nodes advertised a key, fewer than the "
                f"threshold {self.threshold}"
                + _hint(info["dropped"])
                + ("" if self._publics else NO_MOD),
            )
            return False
        k = ring_neighbours(len(self._publics)) if self.neighbours == "auto" else self.neighbours
        self._graph = mask_graph(sorted(self._publics), k, self._rng)
        info["neighbours"] = max(len(peers) for peers in self._graph.values())
        return True

    def _uploads(self, server_round: int) -> list[Message]:
        """The wrapped strategy's messages to the members, with the upload stage and keys."""
        stage = ConfigRecord(
            {
                "stage": "upload",
                "round": server_round,
                "threshold": self.threshold,
                "members": len(self._publics),
                "weight_key": self.weight_key,
                "layout": json.dumps([[n, list(s), d] for n, s, d in self._packing_arrays]),
                "words": self.words,
            }
        )
        out = []
        for node in sorted(self._publics):
            m = self._messages[node]
            peers = [node, *self._graph[node]]
            publics = ConfigRecord({str(k): self._publics[k] for k in peers})
            content = RecordDict({**dict(m.content.items()), STAGE: stage, PUBLICS: publics})
            out.append(Message(content, dst_node_id=node, message_type=m.metadata.message_type))
        return out

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Unmask the sum, then let the wrapped strategy aggregate the weighted means.

        Parameters
        ----------
        server_round : int
            The round, from 1.
        replies : Iterable[Message]
            The nodes' masked replies.

        Returns
        -------
        tuple
            The wrapped strategy's result, or ``(None, None)`` if the round was aborted.
        """
        info = self.rounds.setdefault(server_round, {"dropped": {}})
        by_node = {r.metadata.src_node_id: r for r in replies}
        for attempt in range(self.attempts):
            members = sorted(self._publics)
            if not members:
                return None, None
            masked, meta, kept = self._read_uploads(members, by_node, info)
            if len(masked) < self.threshold:
                self._abort(
                    server_round,
                    f"{len(masked)} of {len(members)} members uploaded a usable masked update, "
                    f"fewer than the threshold {self.threshold}" + _hint(info["dropped"]),
                )
                return None, None
            if not connected(sorted(masked), self._graph):
                self._abort(
                    server_round,
                    "the contributors' mask graph is disconnected: the server would learn the "
                    "sum of each part (choose more neighbours)",
                )
                return None, None
            try:
                total = self._unmask(server_round, members, masked)
                break
            except SilentSurvivors as exc:
                retry = [k for k in sorted(masked) if k not in exc.silent]
                for node, why in exc.silent.items():
                    info["dropped"][node] = f"reveal: {why}"
                if attempt + 1 == self.attempts or len(retry) < self.threshold:
                    self._abort(server_round, str(exc))
                    return None, None
                LOG.warning("round %d: %s; retrying with fresh keys", server_round, exc)
                info.setdefault("retries", []).append(str(exc))
                if not self._advertise(server_round, retry):
                    return None, None
                assert self._grid is not None
                again = self._grid.send_and_receive(
                    self._uploads(server_round), timeout=self.timeout
                )
                by_node = {r.metadata.src_node_id: r for r in again}
        try:
            arrays, metrics, weight = self._packing(meta).unpack(total)
        except SecureAggregationAborted as exc:
            self._abort(server_round, str(exc))
            return None, None
        info["contributors"] = sorted(masked)
        # one reply with the total weight; one per contributor (weight W / K each) for a wrapped
        # strategy that checks the count of replies (Flower's DP wrappers)
        senders = sorted(masked) if self._counts_replies else sorted(masked)[:1]
        content = _mean_reply(meta, arrays, metrics, self.weight_key, weight / len(senders))
        synthetic = []
        for node in senders:
            reply = kept[node]
            reply.content = RecordDict(dict(content.items()))
            synthetic.append(reply)
        result = self.strategy.aggregate_train(server_round, synthetic)
        if self.budget is not None and result[0] is not None:
            self.budget.spend(len(masked))
            info["privacy"] = self.budget.guarantee()
            LOG.info("secure sum of %d noisy updates: %s", len(masked), info["privacy"])
        return result

    def _read_uploads(
        self, members: list[int], by_node: dict[int, Message], info: dict[str, Any]
    ) -> tuple[dict[int, np.ndarray], dict[str, Any], dict[int, Message]]:
        """The usable masked uploads (checked before they are read), their common metadata."""
        packed: dict[int, tuple[np.ndarray, dict[str, Any]]] = {}
        for node in members:
            reply = by_node.get(node)
            why = _upload_problem(reply)
            if why is None:
                words = as_numpy(reply.content[MASKED]["words"])  # type: ignore[union-attr]
                meta = dict(reply.content[META])  # type: ignore[union-attr]
                packed[node] = (words, meta)
            else:
                info["dropped"][node] = f"upload: {why}"
        if not packed:
            return {}, {}, {}
        # every contributor must report the same records and metrics: the most common wins
        common = Counter(json.dumps(meta, sort_keys=True) for _, meta in packed.values())
        meta = json.loads(common.most_common(1)[0][0])
        size = self.words * self._packing(meta).size
        masked, kept = {}, {}
        for node, (words, their) in packed.items():
            if their != meta:
                info["dropped"][node] = f"upload: records or metrics {their} differ from {meta}"
            elif words.dtype != np.uint64 or words.shape != (size,):
                info["dropped"][node] = (
                    f"upload: masked words {words.dtype} {words.shape}, expected uint64 ({size},)"
                )
            else:
                masked[node], kept[node] = words, by_node[node]
        info["bytes_per_node"] = 8 * size
        return masked, meta, kept

    def _unmask(
        self, server_round: int, members: list[int], masked: dict[int, np.ndarray]
    ) -> np.ndarray:
        """The float sum of the contributors' vectors (survivors reveal seeds for the others)."""
        outcome: RoundOutcome[np.ndarray, bytes] = RoundOutcome(
            0, members, self._publics, self._graph, masked
        )
        asked = dict(sorted(reveal_requests(outcome.gone, self._graph, masked).items()))
        if asked:
            stage = ConfigRecord(
                {
                    "stage": "reveal",
                    "round": server_round,
                    "threshold": self.threshold,
                    "survivors": len(masked),
                }
            )
            answers = self._send(
                {
                    v: RecordDict(
                        {
                            STAGE: stage,
                            DROPPED: ConfigRecord({"nodes": ds}),
                            PUBLICS: ConfigRecord({str(k): self._publics[k] for k in ds}),
                        }
                    )
                    for v, ds in asked.items()
                }
            )
            outcome.seeds, silent = sort_replies(
                asked, {v: _seeds(reply, asked[v]) for v, reply in answers.items()}
            )
            if silent:
                raise SilentSurvivors(silent)
        return outcome.unmask(words=self.words)

    def _packing(self, meta: dict[str, Any]) -> Packing:
        metrics = [(str(n), int(k)) for n, k in json.loads(str(meta["metrics"]))]
        return Packing(self._packing_arrays, metrics)

    def _send(self, contents: dict[int, RecordDict]) -> dict[int, Message | str]:
        """One message per node through the grid; each answer, or why there is none."""
        assert self._grid is not None
        msgs = [
            Message(content, dst_node_id=node, message_type="train")
            for node, content in contents.items()
        ]
        replies = self._grid.send_and_receive(msgs, timeout=self.timeout)
        by_node = {r.metadata.src_node_id: r for r in replies}
        out: dict[int, Message | str] = {}
        for node in contents:
            reply = by_node.get(node)
            out[node] = (
                f"no answer within {self.timeout} s"
                if reply is None
                else f"error: {reply.error.reason}"
                if reply.has_error()
                else reply
            )
        return out

    def _abort(self, server_round: int, reason: str) -> None:
        error = SecureAggregationAborted(f"round {server_round} aborted: {reason}")
        LOG.error("%s (the previous global model is kept)", error)
        self.aborted.append(error)
        self.rounds.setdefault(server_round, {"dropped": {}})["aborted"] = str(error)

    # --------------------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: "Grid"
    ) -> Iterable[Message]:
        """The wrapped strategy's evaluation messages (not masked).

        Parameters
        ----------
        server_round, arrays, config, grid
            As in :meth:`configure_train`.
        """
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's aggregation of the evaluation metrics (not masked).

        Parameters
        ----------
        server_round, replies
            The round and the nodes' evaluation replies.
        """
        return self.strategy.aggregate_evaluate(server_round, replies)


class SilentSurvivors(SecureAggregationAborted):
    """Survivors that did not reveal their seeds: the attempt cannot be unmasked.

    Parameters
    ----------
    silent : dict of int to str
        The survivors, with why.
    """

    def __init__(self, silent: dict[int, str]) -> None:
        self.silent = dict(silent)
        super().__init__(
            "survivors did not reveal their seeds: "
            + "; ".join(f"node {v}: {why}" for v, why in silent.items())
        )


def _chain(strategy: Strategy) -> list[Strategy]:
    """The strategy and those it wraps (``.strategy`` attributes)."""
    out = [strategy]
    while isinstance(getattr(out[-1], "strategy", None), Strategy):
        out.append(out[-1].strategy)  # type: ignore[attr-defined]
    return out


def _weight_key(strategy: Strategy) -> str:
    for inner in _chain(strategy):
        key = getattr(inner, "weighted_by_key", None)
        if isinstance(key, str):
            return key
    return "num-examples"


def _key(reply: Message | str) -> bytes | str:
    if isinstance(reply, str):
        return reply
    try:
        key = bytes(reply.content[KEY]["public"])  # type: ignore[arg-type]
    except (KeyError, TypeError):
        return "no public key in the answer (is secure_aggregation_mod on the train function?)"
    return key if len(key) == 32 else f"a public key of {len(key)} bytes"


def _upload_problem(reply: Message | None) -> str | None:
    if reply is None:
        return "no answer"
    if reply.has_error():
        return f"error: {reply.error.reason}"
    content = reply.content
    if MASKED not in content or META not in content or "words" not in content[MASKED]:
        return "no masked update in the answer (is secure_aggregation_mod on the train function?)"
    meta = content[META]
    if not all(k in meta for k in ("arrays_key", "metrics_key", "metrics")):
        return f"malformed metadata {dict(meta)}"
    try:
        metrics = json.loads(str(meta["metrics"]))
        if not all(isinstance(n, str) and isinstance(k, int) for n, k in metrics):
            raise ValueError(metrics)
    except (ValueError, TypeError) as exc:
        return f"malformed metrics layout: {exc}"
    return None


def _seeds(reply: Message | str, gone: list[int]) -> dict[int, bytes] | str:
    if isinstance(reply, str):
        return reply
    try:
        got = {d: bytes(reply.content[SEEDS][str(d)]) for d in gone}  # type: ignore[arg-type]
    except (KeyError, TypeError) as exc:
        return f"unreadable answer: {exc!r}"
    if any(len(s) != 32 for s in got.values()):
        return "seeds that are not 32 bytes long"
    return got


def _mean_reply(
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
    metrics: dict[str, Any],
    weight_key: str,
    weight: float,
) -> RecordDict:
    from flwr.app import Array

    return RecordDict(
        {
            str(meta["arrays_key"]): ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            str(meta["metrics_key"]): MetricRecord({**metrics, weight_key: weight}),
        }
    )


def _hint(dropped: dict[int, str]) -> str:
    if not dropped:
        return ""
    reasons = Counter(dropped.values()).most_common(3)
    return "; why: " + "; ".join(f"{why} ({n} node(s))" for why, n in reasons)


__all__ = ["SecureAggregation"]
