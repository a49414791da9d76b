"""Seed 001's sum on Flower through the core secure sum (``secure_sum="core"``, the default).

Seed 001's accountant (:mod:`immersion_secagg.accountant`) covers the server seeing the *exact* sum
of the users' updates. Flower's SecAgg+ (:mod:`immersion_secagg.flower_secagg`) releases a
quantised sum of clipped coordinates (``k 2c / T`` worst case, silent clipping) and expands every
mask from a 32-bit seed with numpy's Mersenne Twister (flwr 1.41,
``flwr/common/secure_aggregation/secaggplus_utils.py``, ``pseudo_rand_gen``, lines 83-100: the
seed, a 44-byte base64 key for a pairwise mask or 32 bytes of ``os.urandom`` for the self mask, is
XOR-folded into ``seed32`` and fed to ``np.random.RandomState``). The audit row
``secagg-mask-seed`` measures what that costs an attacker.

Here every round is :func:`immersion_fl.flower.engine.secure_flower_sum`: fresh X25519 keys per
round, HKDF pair seeds, AES-128-CTR masks, two-limb fixed point (each value moved by at most
``2^-61``, so the released sum is within ``N 2^-61`` of the exact one instead of SecAgg+'s
``k 2c / T``), and a user that drops out after the key agreement has its masks removed from the
seeds its peers reveal. Messages: a handshake (``dp/handshake``: the node's partition id), then
per round the advertise, train (the node computes its update at the broadcast model, as
:class:`immersion_secagg.users.NodeUpdates` does, and masks it) and reveal phases.

The released value is still a fixed-point rounding of each user's update before summation, so
the post-processing argument of the accountant does not apply to it word for word; the deviation
from the exact sum is at most ``N 2^-61`` per coordinate (about 1e-17 here), against SecAgg+'s
quantisation step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from immersion_fl.flower.engine import (
    arrays_record,
    await_nodes,
    flwr_types,
    restore_party,
    run_flower,
    secagg_advertise,
    secagg_reveal,
    secure_flower_sum,
    send_each,
)
from immersion_fl.runtime.faults import FaultPlan
from immersion_fl.runtime.secure import masked_upload

from .flower_secagg import AggregationRun, Step

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.serverapp import Grid
    from immersion_fl.runtime.engine import RunConfig


def core_secure_models(
    cfg: RunConfig, initial: np.ndarray, sigma2: float, *, step: Step
) -> AggregationRun:
    """Train ``cfg`` (a seed 001 scheme) on Flower with the core secure sum of the updates.

    Parameters
    ----------
    cfg:
        The run (``cfg.clients`` users, ``cfg.rounds`` rounds).
    initial:
        The initial model vector.
    sigma2:
        The users' noise variance (each node draws its noise from OS entropy).
    step:
        ``step(model, total, contributors)``: the server's new model from the sum.

    Returns
    -------
    AggregationRun
        The sums, contributors, models and round times (``settings["secure_sum"] = "core"``).
    """
    sink: dict[str, Any] = {}

    def serve(grid: Grid, cfg: RunConfig, **_: Any) -> AggregationRun:
        return _serve(grid, cfg, initial, sigma2, step)

    start = time.perf_counter()
    sink["run"] = run_flower(cfg, server_work=serve, client_work=_client_work)
    run: AggregationRun = sink["run"]
    run.total_seconds = time.perf_counter() - start
    return run


def _serve(
    grid: Grid, cfg: RunConfig, initial: np.ndarray, sigma2: float, step: Step
) -> AggregationRun:
    ConfigRecord, RecordDict = flwr_types()[2], flwr_types()[4]
    nodes = await_nodes(grid, cfg.clients)
    hello = ConfigRecord({"kind": "dp/handshake"})
    answers = send_each(
        grid, {n: RecordDict({"config": hello}) for n in nodes}, {n: n for n in nodes}, None
    )
    node_of = {
        int(reply.content["config"]["pid"]): n
        for n, reply in answers.items()
        if not isinstance(reply, str)
    }
    run = AggregationRun(True, [], [], [], [], settings={"secure_sum": "core"})
    model = np.asarray(initial, dtype=np.float64)
    dropped: list[dict[str, Any]] = []
    aborted: list[dict[str, Any]] = []
    for t in range(cfg.rounds):
        tick = time.perf_counter()
        mean, contributors = secure_flower_sum(
            grid,
            node_of,
            dict.fromkeys(node_of, 1),  # equal weights: the mean over the contributors
            t,
            content={"w": arrays_record({"w": model})},
            config={"cfg": cfg.to_json(), "sigma2": sigma2},
            n_values=model.size,
            timeout=cfg.client_timeout,
            dropped=dropped,
            aborted=aborted,
        )
        total = mean * len(contributors)
        model = step(model, total, contributors)
        run.round_seconds.append(time.perf_counter() - tick)
        run.sums.append(total)
        run.server_outputs.append(mean)
        run.contributors.append(contributors)
        run.models.append(model)
    return run


def _client_work(msg: Message, context: Context) -> Message:
    """A node: handshake, then the advertise / train / reveal phases of each round."""
    from immersion_fl.runtime.engine import RunConfig

    from .users import NodeUpdates

    _, _, ConfigRecord, Message, RecordDict = flwr_types()
    config = msg.content["config"]
    index = int(context.node_config["partition-id"])
    if config["kind"] == "dp/handshake":
        return Message(content=RecordDict({"config": ConfigRecord({"pid": index})}), reply_to=msg)
    if config["kind"] == "secagg/advertise":
        return secagg_advertise(msg, context, index)
    if config["kind"] == "secagg/reveal":
        return secagg_reveal(msg, context, index, FaultPlan())
    t, attempt = int(config["round"]), int(config["attempt"])
    party = restore_party(context, index, t, attempt)
    cfg = RunConfig.from_json(str(config["cfg"]))
    model = msg.content["w"]["w"].numpy()
    update = NodeUpdates(cfg, float(config["sigma2"]))(t, index, model)
    publics = {
        int(k): np.asarray(v.numpy(), dtype=np.uint8).tobytes()
        for k, v in msg.content["publics"].items()
    }
    words = masked_upload(
        party, update, float(config["weight"]), publics, int(config["n_summands"])
    )
    return Message(content=RecordDict({"w": arrays_record({"masked": words})}), reply_to=msg)
