"""Secure aggregation for any Flower Message-API app: ``SecureAggregation`` + its client mod.

Every run goes through Flower's own ``Strategy.start`` loop and ``ClientApp`` (mods included) on an
in-process grid that can make nodes fail at a chosen stage; the simulation runtime runs the same
apps at the end. Each secure run is compared round by round with the unwrapped app that sees the
same failures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.clientapp.mod import fixedclipping_mod  # noqa: E402
from flwr.serverapp.strategy import (  # noqa: E402
    DifferentialPrivacyClientSideFixedClipping,
    FedAdam,
    FedAvg,
    FedMedian,
    FedProx,
)
from immersion import InvalidArgumentError  # noqa: E402
from immersion_secagg import (  # noqa: E402
    SecureAggregation,
    SecureAggregationAborted,
    secure_aggregation_mod,
)
from immersion_secagg.message_wire import MASKED, STAGE  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task_identity")

MANY = tuple(range(11, 31))  # 20 nodes: enough for the default sparse ring
NODES = MANY[:5]
RNG = np.random.default_rng(0)
DATA = {
    node: (RNG.normal(size=(20 + 7 * i, 3)), RNG.normal(size=20 + 7 * i))
    for i, node in enumerate(MANY)
}


def make_app(
    mods: list, dtype=np.float64, faulty: dict | None = None, sigma2: float = 0.0
) -> ClientApp:
    """A user's ClientApp: 3 steps of least squares from the received arrays, with metrics.

    ``faulty[node]`` changes what that node returns (bad shapes, dtypes, metrics); ``sigma2``
    adds isotropic Gaussian noise of that variance to the node's update."""
    app = ClientApp()

    @app.train(mods=mods)
    def train(msg: Message, context: Context) -> Message:
        node = context.node_id
        arrays = msg.content["arrays"]
        w, b = arrays["w"].numpy().astype(np.float64), arrays["b"].numpy().astype(np.float64)
        x, y = DATA[node]
        for _ in range(3):
            r = x @ w + b[0] - y
            w, b = w - 0.1 * x.T @ r / len(y), b - 0.1 * np.array([r.mean()])
        if sigma2:
            noise = np.random.default_rng(node).normal(scale=np.sqrt(sigma2), size=4)
            w, b = w + noise[:3], b + noise[3:]
        out = {"w": w.astype(dtype), "b": b.astype(dtype)}
        metrics = {"num-examples": len(y), "loss": float(np.mean(r**2)), "hist": [1.0, float(node)]}
        change = (faulty or {}).get(node)
        if change == "shape":
            out["w"] = np.zeros(4, dtype)
        elif change == "dtype":
            out["w"] = out["w"].astype(np.float32)
        elif change == "metrics":
            metrics["extra"] = 1.0
        elif change == "weight":
            metrics["num-examples"] = 10**9
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in out.items()}),
                "metrics": MetricRecord(metrics),
            }
        )
        return Message(content=content, reply_to=msg)

    return app


class LocalGrid:
    """A grid whose nodes run a ClientApp in-process; ``fail[(round, stage)]`` lists the nodes
    that do not answer at that stage (``"plain"`` is an unwrapped app's train message)."""

    def __init__(self, app: ClientApp, fail: dict | None = None, tamper=None, nodes=NODES) -> None:
        self.app, self.fail, self.tamper, self.nodes = app, fail or {}, tamper, nodes
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={}, state=RecordDict(), run_config={})
            for n in nodes
        }
        self.round = 0

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            stage = msg.content[STAGE]["stage"] if STAGE in msg.content else "plain"
            if STAGE in msg.content:
                self.round = int(msg.content[STAGE]["round"])
            elif "server-round" in msg.content.get("config", {}):
                self.round = int(msg.content["config"]["server-round"])
            if msg.metadata.dst_node_id in self.fail.get((self.round, stage), ()):
                continue
            try:
                reply = self.app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # as Flower's runtimes: the exception becomes an error reply
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            if self.tamper and stage == "upload" and not reply.has_error():
                self.tamper(msg.metadata.dst_node_id, reply)
            replies.append(reply)
        return replies


def run(strategy, grid: LocalGrid, rounds: int = 3, dtype=np.float64):
    """Flower's own loop; the global model after every round (and the train metrics)."""
    seen = {}
    initial = ArrayRecord({"w": Array(np.zeros(3, dtype)), "b": Array(np.zeros(1, dtype))})
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=rounds,
        evaluate_fn=lambda r, a: seen.__setitem__(r, _flat(a)),
    )
    return [seen[r] for r in range(1, rounds + 1)], result.train_metrics_clientapp


def _flat(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([arrays["w"].numpy().astype(float), arrays["b"].numpy().astype(float)])


def fedavg(**kw):
    return FedAvg(**{"fraction_evaluate": 0.0, "min_available_nodes": len(NODES), **kw})


def _max_diffs(a, b):
    return [float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True)]


# ------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize(
    "make",
    [
        fedavg,
        lambda: FedProx(fraction_evaluate=0.0, proximal_mu=0.1),
        lambda: FedAdam(fraction_evaluate=0.0),
    ],
)
def test_the_wrapped_strategy_gives_the_unwrapped_result_every_round(make):
    plain, plain_metrics = run(make(), LocalGrid(make_app([])))
    secure, metrics = run(SecureAggregation(make()), LocalGrid(make_app([secure_aggregation_mod])))
    assert max(_max_diffs(plain, secure)) < 1e-9
    for r in plain_metrics:
        assert set(metrics[r]) == set(plain_metrics[r]) == {"loss", "hist"}
        assert metrics[r]["loss"] == pytest.approx(plain_metrics[r]["loss"], abs=1e-9)
        assert metrics[r]["hist"] == pytest.approx(plain_metrics[r]["hist"], abs=1e-9)


@pytest.mark.parametrize("words", [1, 2])
def test_float32_models_agree_to_the_fixed_point_step(words):
    plain, _ = run(fedavg(), LocalGrid(make_app([], np.float32)), dtype=np.float32)
    secure, _ = run(
        SecureAggregation(fedavg(), words=words),
        LocalGrid(make_app([secure_aggregation_mod], np.float32)),
        dtype=np.float32,
    )
    assert max(_max_diffs(plain, secure)) < 1e-6


def test_two_words_per_value_on_the_complete_graph_agree_as_one_word_on_the_ring():
    """The defaults (one word, the ring) and the former ones (two words, every other member)
    give the unwrapped result round by round, within each encoding's step."""
    plain, _ = run(fedavg(), LocalGrid(make_app([])))
    secure, _ = run(
        SecureAggregation(fedavg(), words=2, neighbours=None),
        LocalGrid(make_app([secure_aggregation_mod])),
    )
    assert max(_max_diffs(plain, secure)) < 1e-12


def test_a_users_subclass_aggregates_the_unmasked_mean():
    class Halving(FedAvg):
        def aggregate_train(self, server_round, replies):
            arrays, metrics = super().aggregate_train(server_round, replies)
            return ArrayRecord({k: Array(v.numpy() / 2) for k, v in arrays.items()}), metrics

    make = lambda: Halving(fraction_evaluate=0.0)  # noqa: E731
    plain, _ = run(make(), LocalGrid(make_app([])))
    secure, _ = run(SecureAggregation(make()), LocalGrid(make_app([secure_aggregation_mod])))
    assert max(_max_diffs(plain, secure)) < 1e-9


def test_the_server_holds_masked_words_only():
    """What reaches the server in the upload stage: uint64 words that differ from the fixed
    point of the node's update (the masks), and no ArrayRecord of floats."""
    uploads = {}

    def keep(node, reply):
        uploads[node] = reply.content

    run(SecureAggregation(fedavg()), LocalGrid(make_app([secure_aggregation_mod]), tamper=keep), 1)
    assert len(uploads) == len(NODES)
    bits = []
    for content in uploads.values():
        assert list(content.array_records) == [MASKED]
        words = content[MASKED]["words"].numpy()
        assert words.dtype == np.uint64
        bits.append(np.unpackbits(words.view(np.uint8)))
    # masked words look uniform: about half the bits set (a float's fixed point would not). The
    # bits of every upload together: one upload of this model is 8 words, 512 bits, whose
    # fraction strays 0.05 from a half about once in 40 uploads; 2,560 bits, about 5 sigma.
    assert abs(np.concatenate(bits).mean() - 0.5) < 0.05


# ------------------------------------------------------------------------------------- dropouts
def test_dropouts_after_key_set_up_are_recovered_and_nodes_rejoin():
    fail_plain = {(2, "plain"): (12, 14)}
    fail_secure = {(2, "upload"): (12, 14)}  # advertised a key, then failed
    plain, _ = run(fedavg(), LocalGrid(make_app([]), fail_plain), 4)
    strategy = SecureAggregation(fedavg(), threshold=3)
    secure, _ = run(strategy, LocalGrid(make_app([secure_aggregation_mod]), fail_secure), 4)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert sorted(strategy.rounds[2]["dropped"]) == [12, 14]
    assert strategy.rounds[2]["contributors"] == [11, 13, 15]
    assert strategy.rounds[3]["contributors"] == list(NODES)  # 12 and 14 rejoined
    assert not strategy.aborted


def test_nodes_failing_before_the_key_set_up_are_simply_left_out():
    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(1, "plain"): (15,)}), 2)
    strategy = SecureAggregation(fedavg())
    secure, _ = run(
        strategy, LocalGrid(make_app([secure_aggregation_mod]), {(1, "advertise"): (15,)}), 2
    )
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert strategy.rounds[1]["members"] == [11, 12, 13, 14]


def test_below_the_threshold_the_round_aborts_and_keeps_the_model():
    strategy = SecureAggregation(fedavg(), threshold=4)
    fail = {(2, "upload"): (11, 12)}
    secure, _ = run(strategy, LocalGrid(make_app([secure_aggregation_mod]), fail), 3)
    assert np.array_equal(secure[0], secure[1])  # round 2 kept round 1's model
    assert not np.array_equal(secure[1], secure[2])  # round 3 ran with every node
    assert len(strategy.aborted) == 1 and isinstance(strategy.aborted[0], SecureAggregationAborted)
    assert "fewer than the threshold 4" in str(strategy.aborted[0])
    plain, _ = run(
        fedavg(), LocalGrid(make_app([])), 2
    )  # round 3 = plain round 2 from round 1's model
    assert max(_max_diffs(plain[:1], secure[:1])) < 1e-9


def test_a_survivor_that_does_not_reveal_makes_the_round_run_again_without_it():
    """Node 11 fails at the upload, node 13 then does not reveal: the round runs again among the
    three others with fresh keys (their train function runs again) and equals plain FedAvg
    without 11 and 13; with ``attempts=1`` the round is aborted and the model kept."""
    fail = {(1, "upload"): (11,), (1, "reveal"): (13,)}
    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(1, "plain"): (11, 13)}), 2)
    strategy = SecureAggregation(fedavg())
    secure, _ = run(strategy, LocalGrid(make_app([secure_aggregation_mod]), fail), 2)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert strategy.rounds[1]["contributors"] == [12, 14, 15]
    assert "node 13" in strategy.rounds[1]["retries"][0] and not strategy.aborted

    strategy = SecureAggregation(fedavg(), attempts=1)
    secure, _ = run(strategy, LocalGrid(make_app([secure_aggregation_mod]), fail), 2)
    assert np.array_equal(secure[0], np.zeros(4))
    assert "did not reveal" in str(strategy.aborted[0])
    assert strategy.rounds[2]["contributors"] == list(NODES)


# ------------------------------------------------------------------------------------ bad input
def test_the_mod_without_the_wrapper_fails_by_name_and_keeps_the_model():
    secure, _ = run(fedavg(), LocalGrid(make_app([secure_aggregation_mod])), 1)
    assert np.array_equal(secure[0], np.zeros(4))
    ctx = Context(run_id=1, node_id=11, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict({"config": ConfigRecord()}), dst_node_id=11, message_type="train")
    reply = make_app([secure_aggregation_mod])(msg, ctx)
    assert reply.has_error() and "wrap the ServerApp's strategy" in reply.error.reason


def test_the_wrapper_without_the_mod_aborts_by_name():
    strategy = SecureAggregation(fedavg())
    secure, _ = run(strategy, LocalGrid(make_app([])), 1)
    assert np.array_equal(secure[0], np.zeros(4))
    assert "secure_aggregation_mod" in str(strategy.aborted[0])


@pytest.mark.parametrize("change", ["shape", "dtype", "metrics"])
def test_a_node_with_other_shapes_dtypes_or_metrics_is_left_out_and_recovered(change):
    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(r, "plain"): (13,) for r in (1, 2)}), 2)
    strategy = SecureAggregation(fedavg())
    grid = LocalGrid(make_app([secure_aggregation_mod], faulty={13: change}))
    secure, _ = run(strategy, grid, 2)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert list(strategy.rounds[1]["dropped"]) == [13]


@pytest.mark.parametrize("how", ["oversized", "float", "missing"])
def test_a_malformed_or_oversized_masked_upload_is_refused_unread(how):
    def tamper(node, reply):
        if node != 14:
            return
        words = reply.content[MASKED]["words"].numpy()
        if how == "oversized":
            reply.content[MASKED] = ArrayRecord({"words": Array(np.concatenate([words, words]))})
        elif how == "float":
            reply.content[MASKED] = ArrayRecord({"words": Array(words.view(np.float64))})
        else:
            del reply.content[MASKED]

    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(1, "plain"): (14,)}), 1)
    strategy = SecureAggregation(fedavg())
    secure, _ = run(strategy, LocalGrid(make_app([secure_aggregation_mod]), tamper=tamper), 1)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert list(strategy.rounds[1]["dropped"]) == [14]


def test_the_wrapper_refuses_bad_arguments_and_per_reply_strategies():
    bad = (
        {"threshold": 1},
        {"threshold": True},
        {"words": 3},
        {"timeout": 0},
        {"neighbours": 1},
        {"neighbours": "some"},
        {"attempts": 0},
    )
    for kwargs in bad:
        with pytest.raises(InvalidArgumentError):
            SecureAggregation(fedavg(), **kwargs)
    with pytest.raises(InvalidArgumentError, match="FedMedian needs every reply"):
        SecureAggregation(FedMedian())
    with pytest.raises(InvalidArgumentError, match="Flower Strategy"):
        SecureAggregation(object())


# ------------------------------------------------------------------------------ DP composition
def test_client_side_clipping_and_central_noise_compose():
    """Flower's client-side fixed clipping (clip on the node before masking) and the DP wrapper's
    noise on the unmasked mean: the same model as without secure aggregation (same noise seed)."""

    def make():
        return DifferentialPrivacyClientSideFixedClipping(
            fedavg(), noise_multiplier=0.5, clipping_norm=0.05, num_sampled_clients=len(NODES)
        )

    np.random.seed(3)
    plain, _ = run(make(), LocalGrid(make_app([fixedclipping_mod])), 2)
    np.random.seed(3)
    mods = [secure_aggregation_mod, fixedclipping_mod]
    secure, _ = run(SecureAggregation(make()), LocalGrid(make_app(mods)), 2)
    assert max(_max_diffs(plain, secure)) < 1e-9


def test_the_secure_sum_budget_reports_seed_001s_dp_and_stops_training_by_name():
    """Five nodes' sum of GD updates with isotropic noise: the budget composes Table 1's GD row
    over the rounds run (as the accountant's own ``gd_guarantee``) and refuses round 3."""
    from flwr.serverapp.exception import PrivacyBudgetExhausted
    from immersion_secagg import PrivacyBudgetExceeded, SecureSumBudget, Setting, gd_guarantee

    setting, sigma2, delta = Setting(5, 20, 20, 1.0), 0.05, 1e-5
    two, three = (gd_guarantee(setting, sigma2, delta, rounds=r).epsilon for r in (2, 3))
    budget = SecureSumBudget(
        "gd",
        samples=20,
        batch=20,
        clip=1.0,
        sigma2=sigma2,
        delta=delta,
        max_epsilon=(two + three) / 2,
    )
    strategy = SecureAggregation(fedavg(), threshold=5, budget=budget)
    with pytest.raises(PrivacyBudgetExceeded, match="past max_epsilon") as caught:
        run(strategy, LocalGrid(make_app([secure_aggregation_mod], sigma2=sigma2)), 3)
    assert isinstance(caught.value, PrivacyBudgetExhausted)  # Flower's own exit for it
    assert budget.spent == [5, 5]
    assert strategy.rounds[2]["privacy"].epsilon == pytest.approx(two, rel=1e-6)
    # fewer contributors, less noise in the sum: a round of 4 costs more than a round of 5
    assert budget.guarantee([5, 4]).epsilon > budget.guarantee([5, 5]).epsilon


def test_the_budget_refuses_bad_arguments():
    from immersion_secagg import SecureSumBudget

    good = dict(samples=20, batch=20, clip=1.0, sigma2=0.05, delta=1e-5)
    for name, value in (("mechanism", "sgd"), ("sigma2", 0.0), ("delta", 1.0), ("max_epsilon", 0)):
        kwargs = {"mechanism": "gd", **good, name: value}
        with pytest.raises(InvalidArgumentError):
            SecureSumBudget(**kwargs)


# -------------------------------------------------------------------- the quickstart app, patched
QUICKSTART = Path(__file__).resolve().parents[1] / "fl_demos" / "flower_quickstart"


def test_the_secagg_patch_is_a_few_lines():
    lines = (QUICKSTART / "enable_secagg.patch").read_text().splitlines()
    changed = [line for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 6


def _quickstart_benchmark():
    """``benchmarks/flower_quickstart.py`` (app copies, patching, the simulation runtime)."""
    spec = importlib.util.spec_from_file_location(
        "flower_quickstart", QUICKSTART.parents[1] / "benchmarks" / "flower_quickstart.py"
    )
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    return quickstart


@pytest.mark.slow
def test_quickstart_with_secure_aggregation_equals_without_on_the_simulation_runtime(tmp_path):
    """Flower's simulation runtime (two SuperNodes): the patched quickstart's final model equals
    the unpatched one's (float64 CNN on digits)."""
    pytest.importorskip("torch")
    quickstart = _quickstart_benchmark()
    plain = quickstart.simulate(
        quickstart.app_copy(tmp_path, "plain", False), tmp_path / "plain.pt"
    )
    app = quickstart.app_copy(tmp_path, "secagg", True, "enable_secagg.patch")
    secure = quickstart.simulate(app, tmp_path / "secagg.pt")
    assert quickstart.max_diff(plain, secure) < 1e-9


# --------------------------------------------------------------------------- sparse mask graphs
def test_a_ring_of_neighbours_gives_the_same_result_and_recovers_dropouts():
    from immersion_secagg.message_graph import mask_graph

    ring = mask_graph(list(NODES), 2, np.random.default_rng(7))  # round 1's graph, as drawn
    first = NODES[0]
    gone = ring[first][:1]  # one neighbour of `first`: the other three stay a path
    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(1, "plain"): gone}), 2)
    strategy = SecureAggregation(fedavg(), neighbours=2, rng=7)
    grid = LocalGrid(make_app([secure_aggregation_mod]), {(1, "upload"): gone})
    secure, _ = run(strategy, grid, 2)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert not strategy.aborted and strategy.rounds[1]["contributors"] == sorted(
        set(NODES) - set(gone)
    )


def test_the_default_ring_is_the_stated_one_exact_and_recovers_dropouts():
    """20 nodes: the default masks with ring_neighbours(20) = 8 peers each (not every other
    member), equals the unwrapped app round by round with 6 nodes (ceil(20 / 3) - 1) dropping
    after the key set-up in round 2, and the masked words are the only upload."""
    from immersion_secagg.message_graph import ring_neighbours

    assert ring_neighbours(len(MANY)) == 8
    gone = MANY[3:9]
    plain, _ = run(
        fedavg(min_available_nodes=len(MANY)),
        LocalGrid(make_app([]), {(2, "plain"): gone}, nodes=MANY),
    )
    strategy = SecureAggregation(fedavg(min_available_nodes=len(MANY)), rng=3)
    grid = LocalGrid(make_app([secure_aggregation_mod]), {(2, "upload"): gone}, nodes=MANY)
    secure, _ = run(strategy, grid)
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert [strategy.rounds[r]["neighbours"] for r in (1, 2, 3)] == [8, 8, 8]
    assert strategy.rounds[2]["contributors"] == sorted(set(MANY) - set(gone))
    assert not strategy.aborted


def test_ring_neighbours_keeps_the_honest_contributors_whole_as_stated():
    """The statement behind the default, checked by enumeration on the real mask graph: on a
    ring of ``h`` a side, every set of fewer than ``2 h`` bad members leaves the others
    connected, and the share of bad sets of a given size that split them is at most
    ``split_bound`` (equal to it where only one pair of gaps can reach ``h``); the chosen ``k``
    meets 2^-40 for ceil(K / 3) bad members and ``k - 2`` does not."""
    from itertools import combinations
    from math import ceil

    from immersion_secagg.message_graph import (
        connected,
        mask_graph,
        ring_neighbours,
        split_bound,
    )

    members = list(range(13))
    for half in (1, 2, 3):
        graph = mask_graph(members, 2 * half, np.random.default_rng(half))
        for bad in range(1, 9):
            split = sum(
                not connected([m for m in members if m not in chosen], graph)
                for chosen in combinations(members, bad)
            )
            share = split / len(list(combinations(members, bad)))
            if bad < 2 * half:
                assert split == 0
            assert share <= split_bound(13, bad, half) + 1e-15, (half, bad)
    cycle = mask_graph(members, 2, np.random.default_rng(0))
    split = [
        not connected([m for m in members if m not in c], cycle) for c in combinations(members, 2)
    ]
    assert split_bound(13, 2, 1) == pytest.approx(sum(split) / len(split))
    for n in (7, 10, 20, 50, 100, 1000):
        k, bad = ring_neighbours(n), ceil(n / 3)
        assert split_bound(n, bad, k // 2) <= 2.0**-40 < split_bound(n, bad, k // 2 - 1)
    assert [ring_neighbours(n) for n in (3, 6, 50)] == [None, None, 18]


def test_a_disconnected_mask_graph_aborts_the_round():
    from immersion_secagg.message_graph import mask_graph

    ring = mask_graph(list(NODES), 2, np.random.default_rng(7))
    first = NODES[0]
    gone = tuple(ring[first])  # both neighbours of `first`: it is cut off from the others
    strategy = SecureAggregation(fedavg(), neighbours=2, rng=7)
    grid = LocalGrid(make_app([secure_aggregation_mod]), {(1, "upload"): gone})
    secure, _ = run(strategy, grid, 1)
    assert np.array_equal(secure[0], np.zeros(4))
    assert "disconnected" in str(strategy.aborted[0])


@pytest.mark.slow
def test_quickstart_with_secure_aggregation_on_the_deployment_runtime_with_tls(tmp_path):
    """SuperLink with TLS and SuperNode authentication + two registered SuperNodes + ``flwr run``
    of the patched app on loopback: the final model equals the unpatched app's on the simulation
    runtime."""
    torch = pytest.importorskip("torch")
    import os

    from flower_deployment import CONNECTION, LoopbackDeployment

    quickstart = _quickstart_benchmark()
    plain = quickstart.simulate(
        quickstart.app_copy(tmp_path, "plain", False), tmp_path / "plain.pt"
    )
    app = quickstart.app_copy(tmp_path, "secagg", True, "enable_secagg.patch")
    out = tmp_path / "deployed.pt"
    app_path = {"PYTHONPATH": f"{app}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with LoopbackDeployment(tmp_path / "deployment", secure=True, extra_env=app_path) as link:
        for pid in (0, 1):
            private, public = link.node_key(f"node-{pid}")
            done = link.flwr("supernode", "register", str(public), CONNECTION)
            assert "registered successfully" in done.stdout + done.stderr, done.stdout[-2000:]
            link.supernode(f"node-{pid}", pid, 2, key=private)
        done = link.run(app, f"num-server-rounds=2 final-model='{out}'", timeout_s=300)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert quickstart.max_diff(plain, torch.load(out)) < 1e-9


def test_an_update_outside_the_fixed_point_range_is_refused_by_name():
    """One word per value holds |w x| < 2^24 / K: a node weighing 1e9 examples is refused on the
    node (``FixedPointRangeError``), left out, and the round completes with the others."""
    plain, _ = run(fedavg(), LocalGrid(make_app([]), {(1, "plain"): (12,)}), 1)
    strategy = SecureAggregation(fedavg(), words=1)
    secure, _ = run(
        strategy, LocalGrid(make_app([secure_aggregation_mod], faulty={12: "weight"})), 1
    )
    assert max(_max_diffs(plain, secure)) < 1e-9
    assert "fixed-point range" in strategy.rounds[1]["dropped"][12]
