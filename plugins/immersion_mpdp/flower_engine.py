"""Flower engine for MP-DP: the rounds of :mod:`immersion_mpdp.engine` as Flower messages.

A ServerApp and a ClientApp exchange them.

Every virtual node is one :class:`~immersion_mpdp.protocol.MpdpClient`; the ServerApp holds the
:class:`~immersion_mpdp.protocol.MpdpServer`. Messages of round ``t`` (retry ``attempt``), each one
``grid.send_and_receive`` (message type ``train``, the phase in ``config["kind"]`` as
``mpdp/<phase>``):

1. ``advertise``: the node answers with its public key (32 bytes as a uint8 array) and its
   partition id; its key pair is made at its first advertise and kept for the run;
2. ``upload``: the server runs ``begin_round`` and sends the perturbed model, every public key,
   the node's neighbours with what each edge carries (``v``, and ``p``: 1 the noise ``Delta``,
   2 the masks, 3 both), the number of members and the noise settings; the node answers with
   its ``Upload`` (gradient and corrections), or, when its corrections do not fit one 64-bit
   word, with ``config["out_of_range"]`` (the reason): the round is then retried with two words
   per correction, as ``mpdp_round`` does. Uploads are checked with ``upload_problem``; nodes
   that fail are left out (``result.dropped``);
3. ``reveal`` (only if someone was left out): each surviving neighbour of a dropped node answers
   with its pair seeds of this round and attempt with it, one uint8 array per purpose; if one
   cannot, or if the survivors' graph falls apart, the round is aborted (``result.aborted``) and
   retried with fresh seeds among the others, as ``mpdp_round`` does;
4. the server runs ``finish_round`` and, beside it, plain FedSGD over the same survivors on its own
   copy of the clients' data (the reference, never sent anywhere).

Node state between messages: Flower hands each message to whichever worker is free, so a node's
Python objects may not be there for its next message; only ``context.state`` is. At its first
``advertise`` the node draws its key pair from OS entropy and keeps the raw private key and the
public key in its ``context.state`` (on the node, never sent) for the run, with the round and
attempt of the last advertise; ``upload`` and ``reveal`` reinstate that key pair and check it
against the public key and the round. The nodes' DP
noise also comes from OS entropy, so with noise on two runs differ; with noise off they equal the
in-process engine's to 1e-12 (the 64-bit masks cancel exactly whatever the keys).
Message kinds are namespaced (``mpdp/...``) so one deployed ClientApp can serve every scheme.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion.securesum.protocol import FixedPointRangeError
from immersion.securesum.round import RoundRecords, run_round
from immersion_fl.flower import engine as fl_flower
from immersion_fl.flower.engine import arrays_record as _arrays
from immersion_fl.flower.engine import flwr_types as _flwr_types
from immersion_fl.runtime.engine import EveryClientFailedError, RunConfig
from immersion_fl.runtime.faults import FaultPlan

from . import engine
from .ddp import PURPOSES, NoiseSettings, Upload
from .perturbation import PerturbedModel
from .protocol import MpdpClient, MpdpServer

if TYPE_CHECKING:
    from flwr.app import Array, ConfigRecord, Context, Message, RecordDict
    from flwr.serverapp import Grid

LOG = logging.getLogger("immersion.fl")

_CLIENT_CACHE: dict[tuple[str, int], MpdpClient] = {}


def _client_for(cfg_json: str, index: int) -> MpdpClient:
    """The node's MpdpClient (its data share), built once per worker process."""
    key = (cfg_json, index)
    if key not in _CLIENT_CACHE:
        for client in engine.make_setup(RunConfig.from_json(cfg_json)).clients:
            client.deterministic_keys = False  # private keys and DP noise from OS entropy
            _CLIENT_CACHE[(cfg_json, client.index)] = client
    return _CLIENT_CACHE[key]


def _as_bytes(array: Array) -> bytes:
    return np.asarray(array.numpy(), dtype=np.uint8).tobytes()


def _as_uint8(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.uint8).copy()


class _Nodes:
    """The ServerApp's side of the messages: which node holds which partition, phase by phase."""

    def __init__(self, grid: Grid, cfg: RunConfig, dropped: list[dict[str, Any]]) -> None:
        self.grid, self.timeout, self.dropped = grid, cfg.client_timeout, dropped
        deadline = time.time() + 120
        nodes: list[int] = []
        while len(nodes) < cfg.clients and time.time() < deadline:
            nodes = sorted(grid.get_node_ids())
            time.sleep(0.05)
        self.unmapped = nodes  # node ids until their first advertise answer
        self.node_of: dict[int, int] = {}  # partition id -> node id

    def send(self, contents: dict[int, RecordDict]) -> dict[int, Message | str]:
        """Send ``contents[k]`` to partition ``k``'s node; the answers by ``k``, or the failure."""
        return self._send(
            {self.node_of[k]: c for k, c in contents.items()},
            {self.node_of[k]: k for k in contents},
        )

    def advertise(
        self, t: int, members: list[int], content: Callable[[], RecordDict]
    ) -> dict[int, Message | str]:
        """The advertise phase; on first contact it asks every node and learns the partition ids."""
        if self.node_of:
            return self.send({k: content() for k in members})
        answers = self._send({n: content() for n in self.unmapped}, {n: n for n in self.unmapped})
        out = {}
        for n, reply in answers.items():
            if isinstance(reply, str):
                LOG.warning(
                    "round %d: node %d left out before its first key advertisement: %s", t, n, reply
                )
            else:
                self.node_of[int(reply.content["config"]["pid"])] = n
                out[int(reply.content["config"]["pid"])] = reply
        return out

    def _send(
        self, contents: dict[int, RecordDict], key_of: dict[int, int]
    ) -> dict[int, Message | str]:
        Message = _flwr_types()[3]
        msgs = [
            Message(content=c, dst_node_id=n, message_type="train") for n, c in contents.items()
        ]
        by_node = {
            r.metadata.src_node_id: r
            for r in self.grid.send_and_receive(msgs, timeout=self.timeout)
        }
        out: dict[int, Message | str] = {}
        for n in contents:
            reply = by_node.get(n)
            out[key_of[n]] = (
                f"no answer within {self.timeout} s"
                if reply is None
                else f"raised: {fl_flower.error_reason(reply.error.reason)}"
                if reply.has_error()
                else reply
            )
        return out


def _records(**parts: Any) -> RecordDict:
    _, ArrayRecord, ConfigRecord, _, RecordDict = _flwr_types()
    return RecordDict(
        {
            k: v
            if isinstance(v, (ArrayRecord, ConfigRecord))
            else (ConfigRecord(v) if k == "config" else _arrays(v))
            for k, v in parts.items()
        }
    )


#: Bits of an edge's purposes in the ``neighbours`` message.
_PURPOSE_BITS = {"delta": 1, "mask": 2}


def _neighbour_arrays(peers: dict[int, tuple[str, ...]]) -> dict[str, np.ndarray]:
    return {
        "v": np.asarray(list(peers), dtype=np.int64),
        "p": np.asarray([sum(_PURPOSE_BITS[p] for p in ps) for ps in peers.values()], np.int64),
    }


def _neighbours_of(record: Any) -> dict[int, tuple[str, ...]]:
    peers = [int(v) for v in record["v"].numpy()]
    bits = [int(b) for b in record["p"].numpy()]
    return {
        v: tuple(p for p, bit in _PURPOSE_BITS.items() if b & bit)
        for v, b in zip(peers, bits, strict=True)
    }


class _OutOfRange(str):
    """A node's answer that its corrections do not fit one 64-bit word (the reason)."""


def _upload_of(reply: Message | str, phase_s: dict[str, float]) -> Upload | str:
    """A node's upload (its timings added to ``phase_s``), or why there is none (an
    :class:`_OutOfRange` when it needs two words per correction)."""
    if isinstance(reply, str):
        return reply
    if "config" in reply.content and "out_of_range" in reply.content["config"]:
        return _OutOfRange(reply.content["config"]["out_of_range"])
    try:
        for phase, seconds in reply.content["timings"].items():
            phase_s[phase] = phase_s.get(phase, 0.0) + float(seconds)
        return Upload(
            reply.content["upload"]["gradient"].numpy(),
            reply.content["upload"]["corrections"].numpy(),
        )
    except (KeyError, TypeError, ValueError) as exc:
        return f"unreadable answer: {type(exc).__name__}: {exc}"


def _seeds_of(reply: Message | str, dropped: list[int]) -> dict[int, dict[str, bytes]] | str:
    """A survivor's pair seeds with each of ``dropped``, by purpose, or why there are none."""
    if isinstance(reply, str):
        return reply
    try:
        out = {
            d: {p: _as_bytes(reply.content["seeds"][f"{d}/{p}"]) for p in PURPOSES} for d in dropped
        }
    except (KeyError, TypeError, ValueError) as exc:
        return f"unreadable answer: {type(exc).__name__}: {exc}"
    if any(len(seed) != 32 for seeds in out.values() for seed in seeds.values()):
        return "seeds that are not 32 bytes long"
    return out


def flower_round(
    nodes: _Nodes,
    server: MpdpServer,
    members: list[int],
    t: int,
    *,
    run: dict[str, str],
    aborted: list[dict[str, Any]],
    phase_s: dict[str, float],
) -> tuple[list[int], list[Upload]]:
    """:func:`~immersion_mpdp.engine.mpdp_round` over Flower messages.

    Every random draw and every sum comes in the same order, so the same seed gives the same
    weights.
    """
    transport = FlowerMpdp(nodes, server, t, run, phase_s)
    outcome = run_round(
        transport,
        members,
        RoundRecords(t, nodes.dropped, aborted),
        max_attempts=engine.MAX_ATTEMPTS,
        too_few=EveryClientFailedError,
        given_up=lambda: engine.given_up(t),
        split=engine.graph_split,
        name_dropped=True,
        party="node",
    )
    engine.finish(server, outcome, phase_s)
    server.noise = transport.one_word  # two words were for this round only
    return outcome.contributors, [outcome.uploads[k] for k in outcome.contributors]


class FlowerMpdp(engine.MpdpPhases):
    """The phases of :func:`flower_round` as Flower messages (``mpdp/<phase>``)."""

    def __init__(
        self,
        nodes: _Nodes,
        server: MpdpServer,
        t: int,
        run: dict[str, str],
        phase_s: dict[str, float],
    ) -> None:
        super().__init__(server, t, phase_s)
        self.nodes, self.run = nodes, run
        self.public_arrays: dict[str, np.ndarray] = {}

    def advertise(self, attempt: int, members: list[int]) -> dict[int, bytes | str]:
        self.tick = time.perf_counter()
        head = {"round": self.t, "attempt": attempt}
        answers = self.nodes.advertise(
            self.t,
            members,
            partial(_records, config={"kind": "mpdp/advertise", **head, **self.run}),
        )
        return {
            k: reply if isinstance(reply, str) else _as_bytes(reply.content["keys"]["public"])
            for k, reply in answers.items()
        }

    def upload(
        self, attempt: int, members: list[int], publics: Any, graph: Any
    ) -> dict[int, Upload | str]:
        noise = self.server.noise
        model_arrays = self.model.arrays()
        self.public_arrays = {str(k): _as_uint8(v) for k, v in publics.items()}
        settings = {
            "n_clients": len(members),
            "sigma_eta": noise.sigma_eta,
            "sigma_delta": noise.sigma_delta,
            "mask_corrections": noise.mask_corrections,
            "words": noise.words,
        }
        answers = self.nodes.send(
            {
                k: _records(
                    model=model_arrays,
                    publics=self.public_arrays,
                    neighbours=_neighbour_arrays(graph[k]),
                    config={"kind": "mpdp/upload", "round": self.t, "attempt": attempt, **settings},
                )
                for k in members
            }
        )
        out: dict[int, Upload | str] = {}
        self.too_large = []
        for k in members:
            upload = _upload_of(answers[k], self.phase_s)
            if isinstance(upload, _OutOfRange) and noise.words == 1:
                self.too_large.append(k)  # not left out: the attempt is run again
            elif isinstance(upload, str):
                out[k] = str(upload)
            else:
                problem = engine.upload_problem(
                    upload, self.server.layout, noise.mask_corrections, noise.words
                )
                out[k] = problem or upload
        return out

    def reveal(self, attempt: int, asked: Any, publics: Any) -> dict[int, Any]:
        requests = {
            v: _records(
                dropped={"d": np.asarray(ds, dtype=np.int64)},
                publics={str(d): self.public_arrays[str(d)] for d in ds},
                config={"kind": "mpdp/reveal", "round": self.t, "attempt": attempt},
            )
            for v, ds in asked.items()
        }
        answers = self.nodes.send(requests)
        return {v: _seeds_of(answers[v], asked[v]) for v in sorted(answers)}


def serve(
    grid: Grid, cfg: RunConfig, *, plan: FaultPlan, progress: Callable[[str], None] | None
) -> engine.MpdpResult:
    """The ServerApp's work for ``cfg``: the server side of :func:`.runner.run_mpdp`."""
    messages = {
        "cfg": cfg.to_json(),
        "faults": json.dumps([[c, t, k] for (c, t), k in plan.faults.items()]),
    }
    tick = time.perf_counter()
    run = engine.start(cfg)
    run.result.setup_s = time.perf_counter() - tick  # the nodes answer first in round 1
    nodes = _Nodes(grid, cfg, run.result.dropped)
    for t in range(cfg.rounds):
        phases: dict[str, float] = {}
        tick = time.perf_counter()
        members = (
            sorted(nodes.node_of) if nodes.node_of else []
        )  # [] : every node, on first contact
        survivors, uploads = flower_round(
            nodes, run.server, members, t, run=messages, aborted=run.result.aborted, phase_s=phases
        )
        engine.close_round(run, t, survivors, uploads, time.perf_counter() - tick, phases, progress)
    run.result.weights = run.server.weights
    return run.result


def _restore_keys(client: MpdpClient, state: ConfigRecord, t: int, attempt: int) -> None:
    """Reinstate the key pair this node advertised for ``(t, attempt)``, from ``context.state``."""
    if (int(state["round"]), int(state["attempt"])) != (t, attempt):
        raise RuntimeError(
            f"asked for round {t} attempt {attempt}, but the last key advertised was for round "
            f"{state['round']} attempt {state['attempt']}"
        )
    if client.restore_key(t, attempt, bytes(state["private"])) != bytes(state["public"]):
        raise RuntimeError(
            f"client {client.index}: the stored key pair does not match its public key"
        )


def client_train(msg: Message, context: Context) -> Message:
    """The ClientApp's ``train``: the phase advertise, upload or reveal for this node's client."""
    ConfigRecord, Message = _flwr_types()[2:4]
    config = msg.content["config"]
    index = int(context.node_config["partition-id"])
    t, attempt = int(config["round"]), int(config["attempt"])
    if config["kind"] == "mpdp/advertise":
        client = _client_for(config["cfg"], index)
        kept = context.state["mpdp"] if "mpdp" in context.state else None
        if kept is not None and kept["cfg"] == config["cfg"]:  # the run's key pair
            public = client.restore_key(t, attempt, bytes(kept["private"]))
        else:
            client.forget_key()  # this node's first advertise: a fresh key pair
            public = client.advertise(t, attempt)
        context.state["mpdp"] = ConfigRecord(
            {
                "cfg": config["cfg"],
                "faults": config["faults"],
                "round": t,
                "attempt": attempt,
                "public": public,
                "private": client.private_key(t),
            }
        )
        client.forget(t)
        return Message(
            content=_records(keys={"public": _as_uint8(public)}, config={"pid": index}),
            reply_to=msg,
        )
    state = context.state["mpdp"]
    client = _client_for(state["cfg"], index)
    kind = {(c, r): k for c, r, k in json.loads(state["faults"])}.get((index, t))
    _restore_keys(client, state, t, attempt)
    try:
        publics = {int(k): _as_bytes(v) for k, v in msg.content["publics"].items()}
        if config["kind"] == "mpdp/upload":
            model = PerturbedModel.from_arrays(
                {k: v.numpy() for k, v in msg.content["model"].items()}
            )
            noise = NoiseSettings(
                float(config["sigma_eta"]),
                float(config["sigma_delta"]),
                bool(config["mask_corrections"]),
                int(config.get("words", 2)),
            )
            neighbours = _neighbours_of(msg.content["neighbours"])
            try:
                upload = engine.apply_fault(
                    kind if kind != "no-recovery" else None,
                    lambda: client.upload(
                        t, model, publics, neighbours, int(config["n_clients"]), noise
                    ),
                )
            except FixedPointRangeError as exc:  # the server retries the round with two words
                return Message(content=_records(config={"out_of_range": str(exc)}), reply_to=msg)
            return Message(
                content=_records(
                    upload={"gradient": upload.gradient, "corrections": upload.corrections},
                    timings=ConfigRecord(dict(client.timings)),
                ),
                reply_to=msg,
            )
        if kind == "no-recovery":
            raise RuntimeError(f"injected fault: client {index} does not reveal its seeds")
        dropped = [int(d) for d in msg.content["dropped"]["d"].numpy()]
        seeds = client.reveal(t, dropped, publics)
        return Message(
            content=_records(
                seeds={f"{d}/{p}": _as_uint8(s[p]) for d, s in seeds.items() for p in s}
            ),
            reply_to=msg,
        )
    finally:
        client.forget(t)


def run_flower(
    cfg: RunConfig,
    *,
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
) -> engine.MpdpResult:
    """Run ``cfg`` with MP-DP on Flower's simulation runtime (Ray), one virtual node per client."""
    result: engine.MpdpResult = fl_flower.run_flower(
        cfg, progress=progress, faults=faults, server_work=serve, client_work=client_train
    )
    return result
