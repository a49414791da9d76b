"""MP-DP's Flower engine message by message, without the simulation runtime: the ServerApp's
``serve`` and the ClientApp's ``client_train`` exchange real Flower messages through an
in-process grid (one ``Context`` per node, kept between messages as a SuperNode keeps it).

This is where a node's corrections that do not fit one 64-bit word are tested: the fixed-point
range is made tiny in this process (the runtime's workers would not see the change), the node
answers ``out_of_range`` and the server retries the round with two words, as the in-process
engine does (``tests/test_mpdp.py``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")
pytest.importorskip("flwr")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from immersion.securesum import protocol as securesum  # noqa: E402
from immersion_fl.runtime.engine import RunConfig  # noqa: E402
from immersion_fl.runtime.faults import FaultPlan  # noqa: E402
from immersion_mpdp import engine, flower_engine, runner  # noqa: E402
from immersion_mpdp.ddp import Layout  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task_identity")


class InProcessGrid:
    """A Grid whose nodes are ``client_train`` calls in this process (node id 100 + partition)."""

    def __init__(self, clients: int) -> None:
        self.contexts = {
            100 + k: Context(
                run_id=1,
                node_id=100 + k,
                node_config={"partition-id": k},
                state=RecordDict(),
                run_config={},
            )
            for k in range(clients)
        }
        self.kinds: list[str] = []

    def get_node_ids(self) -> list[int]:
        return sorted(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            self.kinds.append(str(msg.content["config"]["kind"]))
            try:
                replies.append(flower_engine.client_train(msg, self.contexts[node]))
            except Exception as exc:  # noqa: BLE001 - what the runtime reports for a raising app
                reason = f"ClientAppException occurred. Message: {exc}"
                replies.append(Message(Error(code=0, reason=reason), reply_to=msg))
        return replies


def _serve(cfg: RunConfig, faults: FaultPlan | None = None):
    grid = InProcessGrid(cfg.clients)
    weights = []
    record = engine.record

    def spy(result, setup, t, w, *args, **kwargs):
        weights.append([x.clone() for x in w])
        return record(result, setup, t, w, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "record", spy)
        result = flower_engine.serve(grid, cfg, plan=faults or FaultPlan(), progress=None)
    return result, weights, grid


def _local(cfg: RunConfig, faults: FaultPlan | None = None):
    weights = []
    record = engine.record

    def spy(result, setup, t, w, *args, **kwargs):
        weights.append([x.clone() for x in w])
        return record(result, setup, t, w, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "record", spy)
        result = runner.run_mpdp(cfg, engine="local", faults=faults)
    return result, weights


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _cfg(**kw) -> RunConfig:
    base = dict(scheme="mpdp", noise="off", hidden=(16,), clients=3, rounds=2, seed=3)
    base.update(kw)
    return RunConfig.from_flat(base)


def test_out_of_range_corrections_are_retried_with_two_words_over_messages(monkeypatch):
    """With the one-word range made tiny, every node answers out_of_range at one word; the server
    records the fallback, retries the round with two words and leaves nobody out; the weights
    equal plain FedSGD and the in-process engine's (which falls back the same way)."""
    monkeypatch.setattr(securesum, "ONE_LIMB_BITS", 61)  # range 2 / K
    cfg = _cfg()
    result, weights, grid = _serve(cfg)
    assert not result.dropped
    assert [(a["round"], a["attempt"]) for a in result.aborted] == [(0, 1), (1, 1)]
    assert all("two words" in a["reason"] for a in result.aborted)
    assert max(result.diff_vs_plain) < 1e-9
    layout = Layout((64, 16, 10))
    two_words = 8 * layout.gradient_size + 16 * layout.correction_size
    assert result.upload_bytes == [two_words] * (cfg.clients * cfg.rounds)
    assert grid.kinds.count("mpdp/upload") == 2 * cfg.clients * cfg.rounds  # each round twice
    local, local_weights = _local(cfg)
    assert [(a["round"], a["attempt"]) for a in local.aborted] == [(0, 1), (1, 1)]
    for w_flower, w_local in zip(weights, local_weights, strict=True):
        assert _max_diff(w_flower, w_local) <= 1e-12


def test_messages_equal_the_local_engine_with_a_sparse_mask_graph_and_a_dropout():
    """Eight nodes (the auto mask graph is nout:2 from 8 clients, the noise off): one raises
    after the key agreement; its mask neighbours reveal this round's seeds and the weights equal
    the in-process engine's and plain FedSGD; one key pair per node for the whole run."""
    cfg = _cfg(clients=8, rounds=2, mask_graph="auto")
    faults = FaultPlan({(2, 1): "raise"})
    result, weights, grid = _serve(cfg, faults)
    assert result.summary()["mask_graph"] == "nout:2"
    assert [(d["round"], d["client"]) for d in result.dropped] == [(1, 2)]
    assert "mpdp/reveal" in grid.kinds and not result.aborted
    assert max(result.diff_vs_plain) < 1e-9
    local, local_weights = _local(cfg, faults)
    assert [d["client"] for d in result.dropped] == [d["client"] for d in local.dropped]
    assert [a["round"] for a in result.aborted] == [a["round"] for a in local.aborted]
    for w_flower, w_local in zip(weights, local_weights, strict=True):
        assert _max_diff(w_flower, w_local) <= 1e-12
    publics = {n: bytes(c.state["mpdp"]["public"]) for n, c in grid.contexts.items()}
    assert len(set(publics.values())) == cfg.clients  # kept for the run, one per node
