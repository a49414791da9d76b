"""The client half of secure aggregation on Flower's Message API: :func:`secure_aggregation_mod`.

Attach it to the ClientApp's train function, first in the list so that it masks what every other
mod (e.g. Flower's ``fixedclipping_mod``) has made of the reply::

    @app.train(mods=[secure_aggregation_mod])  # or [secure_aggregation_mod, fixedclipping_mod]

It answers the three stages of :mod:`.message_wire` with the core's secure sum
(:mod:`immersion.securesum`: X25519, HKDF, AES-128-CTR masks, fixed point). The user's function
sees the wrapped strategy's message unchanged (the stage records removed). Every refusal is an
error reply (``MOD_FAILED_PRECONDITION``) whose reason names it; the server then treats the node as
dropped.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from immersion import InvalidArgumentError
from immersion.securesum.protocol import SecureSumClient, mask_fixed

from .message_wire import (
    DROPPED,
    KEY,
    LABEL,
    MASKED,
    META,
    PUBLICS,
    SEEDS,
    STAGE,
    STATE,
    Packing,
    stage_of,
)

if TYPE_CHECKING:
    from flwr.clientapp.typing import ClientAppCallable

LOG = logging.getLogger("immersion.fl")


def secure_aggregation_mod(msg: Message, ctxt: Context, call_next: "ClientAppCallable") -> Message:
    """Client mod for :class:`~immersion_secagg.SecureAggregation`: advertise, mask, reveal.

    Parameters
    ----------
    msg : Message
        A train message from a server whose strategy is wrapped in ``SecureAggregation``.
    ctxt : Context
        The node's context (its key pair for the round lives in ``ctxt.state`` between stages).
    call_next : callable
        The next mod or the user's train function.

    Returns
    -------
    Message
        The stage's answer, or an error reply naming why the node refuses.
    """
    stage = stage_of(msg.content)
    if stage is None:
        return _error(
            msg,
            "secure_aggregation_mod got a train message without a secure-aggregation stage: wrap "
            "the ServerApp's strategy in immersion_secagg.SecureAggregation",
        )
    try:
        if stage["stage"] == "advertise":
            return _advertise(msg, ctxt, stage)
        if stage["stage"] == "upload":
            return _upload(msg, ctxt, stage, call_next)
        if stage["stage"] == "reveal":
            return _reveal(msg, ctxt, stage)
    except (InvalidArgumentError, KeyError, ValueError, TypeError) as exc:
        return _error(msg, f"secure_aggregation_mod refused stage {stage.get('stage')!r}: {exc}")
    return _error(msg, f"secure_aggregation_mod: unknown stage {stage['stage']!r}")


def _advertise(msg: Message, ctxt: Context, stage: dict) -> Message:
    """A fresh key pair for the round; the private key stays in the node's state."""
    party = SecureSumClient(ctxt.node_id, int(stage["round"]), label=LABEL)
    ctxt.state[STATE] = ConfigRecord(
        {
            "round": int(stage["round"]),
            "private": party.agreement.private_key_bytes(),
            "public": party.public_bytes,
            "threshold": int(stage["threshold"]),
            "members": 0,
        }
    )
    return Message(RecordDict({KEY: ConfigRecord({"public": party.public_bytes})}), reply_to=msg)


def _party(ctxt: Context, stage: dict) -> tuple[SecureSumClient, ConfigRecord]:
    """The key pair this node advertised for the message's round (checked)."""
    if STATE not in ctxt.state:
        raise InvalidArgumentError("msg", "no key pair advertised on this node")
    state = ctxt.state[STATE]
    if int(state["round"]) != int(stage["round"]):
        raise InvalidArgumentError(
            "msg",
            f"round {stage['round']} asked, the key pair advertised is round {state['round']}",
        )
    party = SecureSumClient(
        ctxt.node_id, int(state["round"]), private_bytes=bytes(state["private"]), label=LABEL
    )
    return party, state


def _publics(record: ConfigRecord) -> dict[int, bytes]:
    return {int(k): bytes(v) for k, v in record.items()}  # type: ignore[arg-type]


def _upload(msg: Message, ctxt: Context, stage: dict, call_next: "ClientAppCallable") -> Message:
    """The user's train function on the wrapped strategy's message, then the masked reply."""
    party, state = _party(ctxt, stage)
    publics = _publics(msg.content[PUBLICS])
    threshold = int(state["threshold"])
    if publics.get(ctxt.node_id) != party.public_bytes:
        raise InvalidArgumentError("publics", "this node's own public key is not in the list")
    members = int(stage["members"])
    if members < threshold or len(publics) > members:
        raise InvalidArgumentError(
            "publics",
            f"{members} members ({len(publics)} keys), fewer than the threshold {threshold}",
        )
    state["members"] = members
    # the received content may be shared between nodes (in-process runtimes): never edit it
    msg.content = RecordDict({k: v for k, v in msg.content.items() if k not in (STAGE, PUBLICS)})
    reply = call_next(msg, ctxt)
    if reply.has_error():
        return reply
    content = reply.content
    if len(content.array_records) != 1 or len(content.metric_records) != 1:
        raise InvalidArgumentError(
            "reply", "expected exactly one ArrayRecord and one MetricRecord in the train reply"
        )
    (arrays_key, arrays), (metrics_key, metrics) = (
        next(iter(content.array_records.items())),
        next(iter(content.metric_records.items())),
    )
    weight_key = str(stage["weight_key"])
    weight = metrics.get(weight_key)
    if isinstance(weight, list) or weight is None or not float(weight) >= 0:
        raise InvalidArgumentError(weight_key, f"expected a number >= 0, got {weight!r}")
    packing = Packing(
        Packing.arrays_from_json(str(stage["layout"])),
        Packing.metrics_layout(metrics, weight_key),
    )
    vector = packing.pack(arrays, metrics, float(weight))
    seeds = party.seeds(publics, publics)
    words = mask_fixed(
        vector,
        members,  # the range check is for the whole sum, not this node's peers
        party.index,
        seeds,
        words=int(stage["words"]),
        argument="update",
        overwrite=True,
    )
    meta = {"arrays_key": arrays_key, "metrics_key": metrics_key}
    meta["metrics"] = json.dumps(packing.metrics)
    return Message(
        RecordDict({MASKED: ArrayRecord({"words": Array(words)}), META: ConfigRecord(meta)}),
        reply_to=msg,
    )


def _reveal(msg: Message, ctxt: Context, stage: dict) -> Message:
    """This node's mask seeds with the members named dropped, if enough survive."""
    party, state = _party(ctxt, stage)
    dropped = [int(d) for d in msg.content[DROPPED]["nodes"]]  # type: ignore[union-attr]
    members, threshold = int(state["members"]), int(state["threshold"])
    survivors = int(stage["survivors"])
    if not members:
        raise InvalidArgumentError("msg", "asked to reveal before this node uploaded")
    if ctxt.node_id in dropped or survivors < threshold or survivors + len(set(dropped)) > members:
        raise InvalidArgumentError(
            "dropped",
            f"{survivors} survivors of {members} members, {len(set(dropped))} named dropped: "
            f"fewer than the threshold {threshold}, inconsistent, or naming this node",
        )
    seeds = party.reveal(dropped, _publics(msg.content[PUBLICS]))
    del ctxt.state[STATE]  # one reveal per round: the key pair is spent
    return Message(
        RecordDict({SEEDS: ConfigRecord({str(d): s for d, s in seeds.items()})}), reply_to=msg
    )


def _error(msg: Message, reason: str) -> Message:
    LOG.error(reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)


__all__ = ["secure_aggregation_mod"]
