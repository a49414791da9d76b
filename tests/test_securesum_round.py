"""The core's one secure-round driver (``immersion.securesum.round``): a full round, dropouts
recovered, aborts (a silent survivor, a split graph) retried, too few contributors refused by the
caller's named error; the unmasked sum equals the plain sum to the fixed-point step every time."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

pytest.importorskip("cryptography")

from immersion import ImmersionError, InvalidArgumentError  # noqa: E402
from immersion.securesum.protocol import (  # noqa: E402
    SecureSumClient,
    fixed_point_limit,
    from_fixed,
    mask,
    to_fixed,
)
from immersion.securesum.round import (  # noqa: E402
    RoundRecords,
    RoundTransport,
    complete_graph,
    run_round,
    silent_reason,
)

N_VALUES = 64
#: Two-limb fixed point: each value moves by at most 2^-61, the float sum adds one rounding.
STEP = 2.0**-61


class TooFew(ImmersionError):
    """The caller's error for a round with too few contributors."""


class GivenUp(ImmersionError):
    """The caller's error for a round aborted every attempt."""


class Local(RoundTransport):
    """Clients as objects in this process; faults by (client, attempt) and phase."""

    def __init__(self, values, *, silent=(), no_key=(), fail=(), graph=None, redo=None):
        self.values, self.silent, self.no_key, self.fail = values, silent, no_key, fail
        self.fixed_graph, self.redo_once = graph, redo
        self.calls: list[tuple[str, int, tuple[int, ...]]] = []

    def advertise(self, attempt, members):
        self.calls.append(("advertise", attempt, tuple(members)))
        self.parties = {
            k: SecureSumClient(k, 7, private_bytes=bytes([k + 1, attempt + 1]) * 16)
            for k in members
            if k not in self.no_key
        }
        out = {k: p.public_bytes for k, p in self.parties.items()}
        out.update({k: "no key" for k in members if k in self.no_key})
        return out

    def graph(self, members, publics):
        if self.fixed_graph is None:
            return complete_graph(members)
        return {k: [v for v in self.fixed_graph[k] if v in members] for k in members}

    def upload(self, attempt, members, publics, graph):
        self.calls.append(("upload", attempt, tuple(members)))
        out: dict[int, np.ndarray | str] = {}
        for k in members:
            if (k, attempt) in self.fail:
                out[k] = "crashed"
                continue
            agreement = self.parties[k].agreement
            seeds = {v: agreement.pair_seed(v, publics[v], "mask") for v in graph[k]}
            out[k] = mask(to_fixed(self.values[k], len(members)), k, seeds)
        return out

    def redo(self):
        reason, self.redo_once = self.redo_once, None
        return reason

    def reveal(self, attempt, asked, publics):
        self.calls.append(("reveal", attempt, tuple(sorted(asked))))
        return {
            v: "refused"
            if (v, attempt) in self.silent
            else {d: self.parties[v].agreement.pair_seed(d, publics[d], "mask") for d in ds}
            for v, ds in asked.items()
        }


def _values(n):
    rng = np.random.default_rng(5)
    return {k: rng.normal(scale=100.0, size=N_VALUES) for k in range(n)}


def _run(transport, members, **kw):
    records = RoundRecords(3, [], [])
    kw = {"max_attempts": 3, "too_few": TooFew, "given_up": lambda: GivenUp("gave up"), **kw}
    return run_round(transport, members, records, **kw), records


def _exact(vectors):
    """The exactly rounded sum of the vectors, entry by entry."""
    return np.array([math.fsum(column) for column in np.stack(vectors).T])


def _assert_sum(outcome, values):
    """The contributors' exact sum (math.fsum) within K fixed-point steps and one rounding."""
    exact = _exact([values[k] for k in outcome.contributors])
    tolerance = len(outcome.contributors) * STEP + np.spacing(np.abs(exact))
    assert (np.abs(outcome.unmask() - exact) <= tolerance).all()


def test_a_full_round_unmasks_to_the_plain_sum():
    values = _values(5)
    transport = Local(values)
    outcome, records = _run(transport, list(range(5)))
    assert outcome.contributors == [0, 1, 2, 3, 4] and outcome.attempt == 0
    assert not outcome.gone and not outcome.revealed() and not records.dropped
    _assert_sum(outcome, values)
    assert [c[0] for c in transport.calls] == ["advertise", "upload"]  # no reveal needed
    masked = outcome.uploads[0]  # one upload alone is masked: nothing of its values is left
    assert np.abs(from_fixed(masked) - values[0]).min() > 1e3


def test_dropouts_are_recovered_from_the_survivors_seeds():
    values = _values(5)
    transport = Local(values, no_key=(4,), fail=((1, 0),))
    outcome, records = _run(transport, list(range(5)))
    assert outcome.members == [0, 1, 2, 3] and outcome.contributors == [0, 2, 3]
    assert [(d["client"], d["reason"]) for d in records.dropped] == [(4, "no key"), (1, "crashed")]
    assert sorted((v, d) for v, d, _ in outcome.revealed()) == [(0, 1), (2, 1), (3, 1)]
    _assert_sum(outcome, values)
    assert not records.aborted


def test_a_silent_survivor_aborts_the_attempt_and_the_retry_leaves_it_out(caplog):
    values = _values(5)
    transport = Local(values, fail=((1, 0),), silent=((2, 0),))
    with caplog.at_level(logging.WARNING, logger="immersion.fl"):
        outcome, records = _run(transport, list(range(5)))
    assert records.aborted == [
        {
            "round": 3,
            "attempt": 1,
            "reason": "client 2 did not reveal its seeds (refused)",
            "silent": [2],
        }
    ]
    assert "retrying with fresh keys" in caplog.text
    assert transport.calls[3] == ("advertise", 1, (0, 3, 4))  # fresh keys, without 1 and 2
    assert outcome.attempt == 1 and outcome.contributors == [0, 3, 4]
    _assert_sum(outcome, values)


def test_the_abort_reason_can_name_the_dropped_clients():
    assert silent_reason({4: "timeout", 2: "refused"}, {2: [0], 4: [0, 1]}) == (
        "client 2 did not reveal its seeds for dropped client 0 (refused); "
        "client 4 did not reveal its seeds for dropped client 0, 1 (timeout)"
    )


def test_a_round_aborted_every_attempt_raises_the_callers_error():
    transport = Local(_values(6), fail=((1, 0), (3, 1)), silent=((0, 0), (2, 1)))
    with pytest.raises(GivenUp):
        _run(transport, list(range(6)), max_attempts=2)
    advertised = [c[2] for c in transport.calls if c[0] == "advertise"]
    assert advertised == [(0, 1, 2, 3, 4, 5), (2, 3, 4, 5)]


def test_below_the_threshold_the_round_is_refused_by_name_before_any_seed_is_asked():
    transport = Local(_values(5), fail=((1, 0), (2, 0)))
    with pytest.raises(
        TooFew, match="round 3: 3 of 5 members uploaded, fewer than the threshold 4"
    ):
        _run(transport, list(range(5)), threshold=4)
    assert [c[0] for c in transport.calls] == ["advertise", "upload"]
    transport = Local(_values(5), no_key=(0, 1, 2))
    with pytest.raises(
        TooFew, match="2 client\\(s\\) advertised a key, fewer than the threshold 3"
    ):
        _run(transport, list(range(5)), threshold=3)
    with pytest.raises(TooFew, match="no client answered the key advertisement"):
        _run(Local(_values(2), no_key=(0, 1)), [0, 1])
    with pytest.raises(TooFew, match="every client failed"):
        _run(Local(_values(2), fail=((0, 0), (1, 0))), [0, 1])


def _falls_apart(graph, contributors):
    """Why the contributors' graph is disconnected (a walk from the smallest), or None."""
    alive = sorted(contributors)
    seen, todo = {alive[0]}, [alive[0]]
    while todo:
        for v in graph[todo.pop()]:
            if v in contributors and v not in seen:
                seen.add(v)
                todo.append(v)
    return None if len(seen) == len(alive) else f"falls apart ({sorted(seen)})"


def test_a_dropout_that_splits_the_graph_aborts_with_no_seed_asked_and_retries():
    values = _values(4)
    path = {0: [1], 1: [0, 2], 2: [1, 3], 3: [2]}
    transport = Local(values, graph=path, fail=((1, 0),))
    outcome, records = _run(transport, [0, 1, 2, 3], split=_falls_apart)
    assert [(a["attempt"], a["reason"], a["silent"]) for a in records.aborted] == [
        (1, "falls apart ([0])", [])
    ]
    assert "reveal" not in [c[0] for c in transport.calls]  # no seed asked for
    assert transport.calls[2] == ("advertise", 1, (0, 2, 3))  # fresh seeds among the others
    assert outcome.attempt == 1 and outcome.contributors == [0, 2, 3]
    _assert_sum(outcome, values)


def test_a_transport_may_run_an_attempt_again_with_the_same_members():
    values = _values(3)
    transport = Local(values, redo="two words, please")
    outcome, records = _run(transport, [0, 1, 2])
    assert records.aborted == [
        {"round": 3, "attempt": 1, "reason": "two words, please", "silent": []}
    ]
    assert outcome.attempt == 1 and outcome.members == [0, 1, 2]
    _assert_sum(outcome, values)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(InvalidArgumentError, match="max_attempts"):
        _run(Local(_values(2)), [0, 1], max_attempts=0)
    with pytest.raises(InvalidArgumentError, match="threshold"):
        _run(Local(_values(2)), [0, 1], threshold=0)


def test_one_word_per_value_unmasks_as_well():
    values = {k: v / 1e3 for k, v in _values(3).items()}
    assert max(np.abs(v).max() for v in values.values()) < fixed_point_limit(3, words=1)

    class OneWord(Local):
        def upload(self, attempt, members, publics, graph):
            out = {}
            for k in members:
                agreement = self.parties[k].agreement
                seeds = {v: agreement.pair_seed(v, publics[v], "mask") for v in graph[k]}
                out[k] = mask(to_fixed(self.values[k], 3, words=1), k, seeds)
            return out

    outcome, _ = _run(OneWord(values), [0, 1, 2])
    exact = _exact(list(values.values()))
    tolerance = 3 * 2.0**-39 + np.spacing(np.abs(exact))
    assert (np.abs(outcome.unmask(words=1) - exact) <= tolerance).all()
