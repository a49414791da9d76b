"""The SDK runner on Flower: the same schemes as a Flower ServerApp + ClientApp, run by Flower's
simulation runtime (``immersion fl run --engine flower``) or its deployment runtime
(:mod:`immersion_fl.flower.app`).

Message flow (Flower's Message API, flwr 1.41):

* ``handshake``: the server sends each node the run configuration and the client kit (``Pi1``,
  ``Pi1_left`` and, for M2, ``Pi2^R``: what a SIFL client holds); the node keeps it in its
  ``context.state`` and answers with its partition id and dataset size |D_i|.
* ``train``: the server (or, for M2, server plus aggregator coding) sends the broadcast arrays; the
  node runs :func:`~immersion_fl.schemes.client_upload` (the code the local engine runs) and
  answers with its upload. Nodes that answer with an error are left out of the round (logged).

The ServerApp aggregates with weights |D_i| / sum over the nodes that answered. A Flower user who
keeps their own apps uses :mod:`immersion_fl.flower.native` instead.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
from immersion import OptionalDependencyError
from immersion.securesum.protocol import SecureSumClient
from immersion.securesum.round import RoundRecords, RoundTransport, run_round

from ..runtime.client import Client
from ..runtime.faults import FaultPlan, upload_problem
from ..runtime.federation import (
    EveryClientFailedError,
    FederatedTask,
    RunConfig,
    RunResult,
    Server,
    optimizer_by_name,
    task_from_config,
)
from ..runtime.secure import masked_upload, new_party
from ..scheme import AnyScheme
from ..schemes import ClientKit, client_upload
from ..schemes.modular import FixedPointFedAvg, IntegerBroadcast, ModularClientKit

if TYPE_CHECKING:
    from types import ModuleType

    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

LOG = logging.getLogger("immersion.fl")

#: Builds node ``index``'s client from the run configuration and the model norm bound.
ClientFactory = Callable[[RunConfig, int, "float | None"], Client]


def _flwr() -> tuple[ModuleType, ModuleType, ModuleType, ModuleType]:
    try:
        import flwr  # noqa: F401
        from flwr import app as flwr_app
        from flwr import clientapp, serverapp, simulation
    except ImportError:
        raise OptionalDependencyError("flwr[simulation]", "fl", "engine='flower'") from None
    return flwr_app, serverapp, clientapp, simulation


def flwr_types() -> tuple[
    type[Array], type[ArrayRecord], type[ConfigRecord], type[Message], type[RecordDict]
]:
    """Flower's ``(Array, ArrayRecord, ConfigRecord, Message, RecordDict)`` (imported lazily)."""
    flwr_app = _flwr()[0]
    return (
        flwr_app.Array,
        flwr_app.ArrayRecord,
        flwr_app.ConfigRecord,
        flwr_app.Message,
        flwr_app.RecordDict,
    )


_TASK_CACHE: dict[str, FederatedTask] = {}


def client_from_config(cfg: RunConfig, index: int, clip: float | None) -> Client:
    """Node ``index``'s Client from the SDK's model and dataset names (task built once per
    process).

    Parameters
    ----------
    cfg:
        The run.
    index:
        The node's partition id.
    clip:
        The scheme's model norm bound, or None.
    """
    key = cfg.to_json()
    if key not in _TASK_CACHE:
        _TASK_CACHE[key] = task_from_config(cfg)
    task = _TASK_CACHE[key]
    return task.client(cfg, index, optimizer_by_name(cfg.optimizer, cfg.lr), clip)


def arrays_record(payload: dict[str, np.ndarray]) -> "ArrayRecord":
    """An ArrayRecord of contiguous numpy arrays.

    Parameters
    ----------
    payload:
        Name -> array.
    """
    flwr_app = _flwr()[0]
    return flwr_app.ArrayRecord(
        {k: flwr_app.Array(np.ascontiguousarray(v)) for k, v in payload.items()}
    )


def await_nodes(grid: "Grid", count: int, seconds: float = 120.0) -> list[int]:
    """The grid's node ids, once ``count`` have connected (or after ``seconds``).

    Parameters
    ----------
    grid:
        The Flower grid.
    count:
        Nodes to wait for.
    seconds:
        The longest wait.
    """
    deadline = time.time() + seconds
    nodes: list[int] = []
    while len(nodes) < count and time.time() < deadline:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.05)
    return nodes


def serve(
    grid: "Grid",
    cfg: RunConfig,
    *,
    plan: FaultPlan,
    progress: Callable[[str], None] | None,
    task: FederatedTask | None = None,
    reference_drift: bool = False,
) -> RunResult:
    """The ServerApp's work for ``cfg`` (simulation and deployment runtimes alike).

    Parameters
    ----------
    grid:
        The Flower grid of the run's nodes.
    cfg:
        The run.
    plan:
        Client failures to inject (sent to the nodes in the handshake).
    progress:
        Called with one line per round.
    task:
        A user's learning problem (default: :func:`~immersion_fl.runtime.engine.task_from_config`).
    reference_drift:
        Also run plain FedAvg summing its uploads in reverse order (with ``compare_plain``), as
        the local engine does. The one-step error is not recorded here: it needs the clients'
        plain local models, which the nodes do not send.
    """

    flwr_app = _flwr()[0]
    ConfigRecord, Message, RecordDict = flwr_app.ConfigRecord, flwr_app.Message, flwr_app.RecordDict
    nodes = await_nodes(grid, cfg.clients)
    setup_start = time.perf_counter()  # keys, the handshake, the noise calibration
    server = Server.create(  # keys drawn; noise calibrated after |D_i|
        cfg, task or task_from_config(cfg), reference_drift=reference_drift
    )
    clip = server.scheme.model_norm_bound
    handshake = ConfigRecord(
        {
            "kind": "handshake",
            "cfg": cfg.to_json(),
            "clip": -1.0 if clip is None else clip,
            "faults": json.dumps([[c, t, k] for (c, t), k in plan.faults.items()]),
        }
    )
    kit = arrays_record(server.scheme.kit_arrays())
    msgs = [
        Message(
            content=RecordDict({"kit": kit, "config": handshake}),
            dst_node_id=n,
            message_type="train",
        )
        for n in nodes
    ]
    pid_of, sizes = {}, {}
    for reply in grid.send_and_receive(msgs):
        if reply.has_error():
            LOG.warning("node %s failed the handshake: %s", reply.metadata.src_node_id, reply.error)
            continue
        info = reply.content["config"]
        pid_of[reply.metadata.src_node_id] = int(info["pid"])
        sizes[int(info["pid"])] = int(info["n_samples"])
    server.calibrate([sizes[i] for i in sorted(sizes)])
    server.result.setup_s = time.perf_counter() - setup_start

    def flower_round(
        scheme: AnyScheme, name: str, t: int, dropped: list[dict[str, Any]], members: set[int]
    ) -> tuple[float, list[int]]:
        start = time.perf_counter()
        payload = arrays_record(_broadcast_arrays(scheme.broadcast(t)))
        config = ConfigRecord({"kind": "train", "scheme": name, "round": t})
        asked = {n: pid for n, pid in pid_of.items() if pid in members}
        msgs = [
            Message(
                content=RecordDict({"w": payload, "config": config}),
                dst_node_id=n,
                message_type="train",
            )
            for n in asked
        ]
        uploads, weights, answered, contributors = [], [], set(), []
        replies = grid.send_and_receive(msgs, timeout=cfg.client_timeout)
        for reply in sorted(replies, key=lambda r: pid_of.get(r.metadata.src_node_id, -1)):
            pid = pid_of.get(reply.metadata.src_node_id, -1)
            answered.add(pid)
            upload = None if reply.has_error() else _upload(reply.content["w"]["w"].numpy())
            problem = (
                f"raised: {error_reason(reply.error.reason)}"
                if upload is None
                else upload_problem(upload, scheme.upload_shape, scheme.upload_dtype)
            )
            if problem:
                LOG.warning("round %d: client %d left out: %s", t, pid, problem)
                dropped.append({"round": t, "client": pid, "reason": problem})
                continue
            uploads.append(upload)
            weights.append(sizes[pid])
            contributors.append(pid)
        for pid in sorted(set(asked.values()) - answered):
            reason = f"no answer within {cfg.client_timeout} s"
            LOG.warning("round %d: client %d left out: %s", t, pid, reason)
            dropped.append({"round": t, "client": pid, "reason": reason})
        if not uploads:
            raise EveryClientFailedError(f"round {t}: every client failed; nothing to aggregate")
        scheme.server_update(scheme.aggregate(uploads, weights))
        return time.perf_counter() - start, contributors

    everyone = set(pid_of.values())
    for t in range(cfg.rounds):
        scheme = server.scheme
        seconds, contributors = (
            secure_flower_round(
                grid, cfg, scheme, pid_of, sizes, t, server.result.dropped, server.result.aborted
            )
            if scheme.secure_aggregation
            else flower_round(scheme, "scheme", t, server.result.dropped, everyone)
        )
        seconds_plain = (
            flower_round(server.plain, server.plain.name, t, [], set(contributors))[0]
            if server.plain is not None
            else None
        )
        # float FedAvg beside an integer scheme; FedAvg summing in reverse (reference drift)
        for reference in server.references.values():
            flower_round(reference, reference.name, t, [], set(contributors))
        server.record(t, seconds, seconds_plain, progress)
    server.result.final_model = server.scheme.global_model()
    return server.result


def send_each(
    grid: "Grid",
    contents: dict[int, "RecordDict"],
    node_of: dict[int, int],
    timeout: float | None,
) -> dict[int, "Message | str"]:
    """Send ``contents[k]`` to client ``k``'s node (message type ``train``); each answer by
    client, or why there is none (an error, or no answer within ``timeout``).

    Parameters
    ----------
    grid:
        The Flower grid.
    contents:
        Client -> message content.
    node_of:
        Client -> node id.
    timeout:
        Seconds to wait (None: no limit).
    """
    Message = _flwr()[0].Message
    msgs = [
        Message(content=c, dst_node_id=node_of[k], message_type="train")
        for k, c in contents.items()
    ]
    by_node = {r.metadata.src_node_id: r for r in grid.send_and_receive(msgs, timeout=timeout)}
    out: dict[int, Message | str] = {}
    for k in contents:
        reply = by_node.get(node_of[k])
        out[k] = (
            f"no answer within {timeout} s"
            if reply is None
            else f"raised: {error_reason(reply.error.reason)}"
            if reply.has_error()
            else reply
        )
    return out


def error_reason(text: str) -> str:
    """The exception's message from a node's error report (Flower wraps it, with a traceback).

    Parameters
    ----------
    text:
        ``reply.error.reason``.

    Examples
    --------
    >>> error_reason("ClientAppException occurred. Message: bad upload'>")
    'bad upload'
    """
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no reason given"
    return last.split(" occurred. Message: ", 1)[-1].rstrip(">").rstrip("'\"")


def _uint8(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.uint8).copy()


def _bytes(array: "Array") -> bytes:
    return np.asarray(array.numpy(), dtype=np.uint8).tobytes()


def secure_flower_round(
    grid: "Grid",
    cfg: RunConfig,
    scheme: AnyScheme,
    pid_of: dict[int, int],
    sizes: dict[int, int],
    t: int,
    dropped: list[dict[str, Any]],
    aborted: list[dict[str, Any]],
) -> tuple[float, list[int]]:
    """One round of a scheme with ``secure_aggregation`` over Flower messages
    (:func:`secure_flower_sum` of the scheme's broadcast and uploads, then its
    ``aggregator_code`` and ``server_update``).

    Parameters
    ----------
    grid, cfg:
        The Flower grid and the run.
    scheme:
        The scheme (keys drawn, noise calibrated).
    pid_of, sizes:
        Node id -> partition id; partition id -> |D_i|.
    t:
        The round.
    dropped, aborted:
        Where left-out clients and given-up attempts are recorded.

    Returns
    -------
    tuple
        The round's seconds and the clients whose uploads are in the sum.
    """
    import torch

    start = time.perf_counter()
    payload = arrays_record({"w": scheme.broadcast(t).cpu().numpy()})
    total, contributors = secure_flower_sum(
        grid,
        {pid: n for n, pid in pid_of.items()},
        sizes,
        t,
        content={"w": payload},
        config={"scheme": "scheme"},
        n_values=int(np.prod(scheme.upload_shape)),
        timeout=cfg.client_timeout,
        dropped=dropped,
        aborted=aborted,
    )
    scheme.server_update(scheme.aggregator_code(torch.as_tensor(total)))
    return time.perf_counter() - start, contributors


def secure_flower_sum(
    grid: "Grid",
    node_of: dict[int, int],
    sizes: dict[int, int],
    t: int,
    *,
    content: dict[str, Any],
    config: dict[str, Any],
    n_values: int,
    timeout: float | None,
    dropped: list[dict[str, Any]],
    aborted: list[dict[str, Any]],
) -> tuple[np.ndarray, list[int]]:
    """The weighted sum ``sum_i |D_i| v_i / sum |D_i|`` of the clients' vectors as a secure sum
    over Flower messages (:mod:`immersion_fl.runtime.secure`, the core's
    :mod:`immersion.securesum.protocol`).

    Messages (type ``train``, the phase in ``config["kind"]``): ``secagg/advertise`` (a fresh key
    pair per round and attempt; the node keeps it in ``context.state``), ``train`` with
    ``content``, every public key and the node's weight (the node answers with its masked
    vector, :func:`immersion_fl.runtime.secure.masked_upload`), and ``secagg/reveal`` to the
    survivors if clients dropped out after the key agreement; if a survivor does not reveal, the
    attempt is given up and retried with fresh keys among the others
    (:data:`immersion_fl.runtime.secure.MAX_ATTEMPTS`).

    Parameters
    ----------
    grid:
        The Flower grid.
    node_of:
        Client (partition id) -> node id, for every client that may take part.
    sizes:
        Client -> weight before normalisation (``|D_i|``; equal sizes give the mean).
    t:
        The round.
    content:
        Record parts every ``train`` message carries (e.g. the broadcast).
    config:
        Extra ``train`` config entries (e.g. the scheme name).
    n_values:
        The length of a client's (unmasked) vector.
    timeout:
        Seconds to wait for each phase's answers.
    dropped, aborted:
        Where left-out clients and given-up attempts are recorded.

    Returns
    -------
    tuple
        The weighted sum renormalised over the contributors (float64), and the contributors.
    """
    from ..runtime import secure

    transport = FlowerSecureSum(grid, node_of, sizes, t, content, config, n_values, timeout)
    outcome = run_round(
        transport,
        sorted(node_of),
        RoundRecords(t, dropped, aborted),
        max_attempts=secure.MAX_ATTEMPTS,
        too_few=EveryClientFailedError,
        given_up=lambda: secure.given_up(t),
    )
    sec = secure.SecureRound(t, outcome.members, sizes, outcome.publics)
    return sec.total(outcome.uploads, outcome.seeds), outcome.contributors


class FlowerSecureSum(RoundTransport[np.ndarray, bytes]):
    """The phases of :func:`secure_flower_sum` as Flower messages (type ``train``, the phase in
    ``config["kind"]``).

    Parameters
    ----------
    grid:
        The Flower grid.
    node_of:
        Client -> node id.
    sizes:
        Client -> ``|D_i|``.
    t:
        The round.
    content, config:
        Record parts and config entries every ``train`` message carries.
    n_values:
        The length of a client's (unmasked) vector.
    timeout:
        Seconds to wait for each phase's answers.
    """

    def __init__(
        self,
        grid: "Grid",
        node_of: dict[int, int],
        sizes: dict[int, int],
        t: int,
        content: dict[str, Any],
        config: dict[str, Any],
        n_values: int,
        timeout: float | None,
    ) -> None:
        self.grid, self.node_of, self.sizes, self.t = grid, node_of, sizes, t
        self.content, self.config, self.n_values, self.timeout = content, config, n_values, timeout
        self.public_record: Any = None

    def _head(self, attempt: int) -> dict[str, int]:
        return {"round": self.t, "attempt": attempt}

    def advertise(self, attempt: int, members: list[int]) -> dict[int, bytes | str]:
        """``secagg/advertise``: each node's fresh public key, or why there is none."""
        ConfigRecord, RecordDict = _flwr()[0].ConfigRecord, _flwr()[0].RecordDict
        advertise = ConfigRecord({"kind": "secagg/advertise", **self._head(attempt)})
        answers = send_each(
            self.grid,
            {k: RecordDict({"config": advertise}) for k in members},
            self.node_of,
            self.timeout,
        )
        return {
            k: reply if isinstance(reply, str) else _bytes(reply.content["keys"]["public"])
            for k, reply in answers.items()
        }

    def upload(
        self, attempt: int, members: list[int], publics: Mapping[int, bytes], graph: Any
    ) -> dict[int, np.ndarray | str]:
        """``train`` with every public key and the node's weight: its masked vector, checked."""
        from ..runtime.secure import SecureRound

        ConfigRecord, RecordDict = _flwr()[0].ConfigRecord, _flwr()[0].RecordDict
        sec = SecureRound(self.t, members, self.sizes, dict(publics))
        self.public_record = arrays_record({str(k): _uint8(v) for k, v in publics.items()})
        answers = send_each(
            self.grid,
            {
                k: RecordDict(
                    {
                        **self.content,
                        "publics": self.public_record,
                        "config": ConfigRecord(
                            {
                                "kind": "train",
                                "secure": True,
                                "weight": sec.weight(k),
                                "n_summands": len(members),
                                **self.config,
                                **self._head(attempt),
                            }
                        ),
                    }
                )
                for k in members
            },
            self.node_of,
            self.timeout,
        )
        out: dict[int, np.ndarray | str] = {}
        for k in members:
            reply = answers[k]
            words = None if isinstance(reply, str) else reply.content["w"]["masked"].numpy()
            problem = reply if isinstance(reply, str) else sec.problem(words, self.n_values)
            out[k] = problem or words
        return out

    def reveal(
        self, attempt: int, asked: Mapping[int, list[int]], publics: Mapping[int, bytes]
    ) -> dict[int, dict[int, bytes] | str]:
        """``secagg/reveal``: each survivor's seeds with the dropped nodes named, or why not."""
        ConfigRecord, RecordDict = _flwr()[0].ConfigRecord, _flwr()[0].RecordDict
        answers = send_each(
            self.grid,
            {
                v: RecordDict(
                    {
                        "dropped": arrays_record({"d": np.asarray(ds, dtype=np.int64)}),
                        "publics": self.public_record,
                        "config": ConfigRecord({"kind": "secagg/reveal", **self._head(attempt)}),
                    }
                )
                for v, ds in asked.items()
            },
            self.node_of,
            self.timeout,
        )
        out: dict[int, dict[int, bytes] | str] = {}
        for v, reply in answers.items():
            try:
                record = reply.content["seeds"]  # type: ignore[union-attr]
                got = {d: _bytes(record[str(d)]) for d in asked[v]}
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                out[v] = reply if isinstance(reply, str) else f"unreadable answer: {exc}"
                continue
            lengths_ok = all(len(seed) == 32 for seed in got.values())
            out[v] = got if lengths_ok else "seeds that are not 32 bytes long"
        return out


def make_client_train(
    client_for: ClientFactory = client_from_config,
) -> Callable[["Message", "Context"], "Message"]:
    """The ClientApp's ``train``: handshake (keep the kit), then one round of :func:`client_upload`.

    Parameters
    ----------
    client_for:
        ``client_for(cfg, index, clip)`` builds the node's client (default: from the SDK's model
        and dataset names; :func:`immersion_fl.api.run` passes the user's own data).
    """

    def client_train(msg: "Message", context: "Context") -> "Message":
        """Answer a handshake (keep the kit and the run) or a round (upload).

        Parameters
        ----------
        msg:
            The server's message (``config["kind"]``: ``handshake`` or ``train``).
        context:
            The node's context (``partition-id``; the kit and the run in ``state``).
        """

        flwr_app = _flwr()[0]
        ConfigRecord, Message, RecordDict = (
            flwr_app.ConfigRecord,
            flwr_app.Message,
            flwr_app.RecordDict,
        )
        config = msg.content["config"]
        index = int(context.node_config["partition-id"])
        if config["kind"] == "handshake":
            context.state["kit"] = msg.content["kit"]
            context.state["run"] = ConfigRecord(
                {"cfg": config["cfg"], "faults": config["faults"], "clip": config["clip"]}
            )
            client = _node_client(client_for, context.state["run"], index)
            return Message(
                content=RecordDict(
                    {"config": ConfigRecord({"pid": index, "n_samples": client.n_samples})}
                ),
                reply_to=msg,
            )
        if config["kind"] == "secagg/advertise":
            return secagg_advertise(msg, context, index)
        run = context.state["run"]
        client = _node_client(client_for, run, index)
        faults_here = FaultPlan({(c, r): k for c, r, k in json.loads(run["faults"])})
        if config["kind"] == "secagg/reveal":
            return secagg_reveal(msg, context, index, faults_here)
        received = _received({k: v.numpy() for k, v in msg.content["w"].items()})
        t = int(config["round"])
        if config["scheme"] == "fedavg-fixed-point":  # the exact twin of the integer schemes
            work = FixedPointFedAvg(
                RunConfig.from_json(run["cfg"]).options.fraction_bits
            ).client_upload
        else:
            kit = None if config["scheme"] == "fedavg" else _kit(context.state["kit"])
            work = lambda c, r, t: client_upload(kit, c, r, t)  # noqa: E731
        timeout = RunConfig.from_json(run["cfg"]).client_timeout or 0.0
        upload = faults_here.apply(index, t, lambda: work(client, received, t), timeout)
        if "secure" in config:
            party = restore_party(context, index, t, int(config["attempt"]))
            publics = {int(k): _bytes(v) for k, v in msg.content["publics"].items()}
            words = masked_upload(
                party, upload, float(config["weight"]), publics, int(config["n_summands"])
            )
            return Message(
                content=RecordDict({"w": arrays_record({"masked": words})}), reply_to=msg
            )
        upload = upload if isinstance(upload, np.ndarray) else upload.detach().cpu().numpy()
        return Message(content=RecordDict({"w": arrays_record({"w": upload})}), reply_to=msg)

    return client_train


def _broadcast_arrays(payload: Any) -> dict[str, np.ndarray]:
    """A broadcast as message arrays: a float tensor, or an integer broadcast and its divisor."""
    if isinstance(payload, IntegerBroadcast):
        return payload.arrays()
    return {"w": payload.detach().cpu().numpy()}


def _received(arrays: dict[str, np.ndarray]) -> Any:
    """:func:`_broadcast_arrays` read back on the node."""
    import torch

    return (
        IntegerBroadcast.from_arrays(arrays)
        if "divisor" in arrays
        else torch.as_tensor(arrays["w"])
    )


def _upload(values: np.ndarray) -> Any:
    """An upload as the server aggregates it: ``uint64`` stays numpy, floats become tensors."""
    import torch

    return values if values.dtype == np.uint64 else torch.as_tensor(values)


def _kit(record: Any) -> ClientKit | ModularClientKit:
    """The client kit from the handshake's arrays (float or integer codes)."""
    from immersion.backends import make_backend

    arrays = {k: v.numpy() for k, v in record.items()}
    if "fraction_bits" in arrays:
        return ModularClientKit.from_arrays(arrays)
    return ClientKit.from_arrays(arrays, make_backend("torch", dtype="float64", device="cpu"))


def secagg_advertise(msg: "Message", context: "Context", index: int) -> "Message":
    """``secagg/advertise``: a fresh key pair for (round, attempt), kept in ``context.state`` (on
    the node, never sent); answers with the public key.

    Parameters
    ----------
    msg, context:
        The message and the node's context.
    index:
        The node's client index (partition id).
    """
    flwr_app = _flwr()[0]
    config = msg.content["config"]
    t, attempt = int(config["round"]), int(config["attempt"])
    party = new_party(index, t)
    context.state["secagg"] = flwr_app.ConfigRecord(
        {
            "round": t,
            "attempt": attempt,
            "private": party.agreement.private_key_bytes(),
            "public": party.public_bytes,
        }
    )
    return flwr_app.Message(
        content=flwr_app.RecordDict(
            {"keys": arrays_record({"public": _uint8(party.public_bytes)})}
        ),
        reply_to=msg,
    )


def restore_party(context: "Context", index: int, t: int, attempt: int) -> SecureSumClient:
    """The key pair this node advertised for ``(t, attempt)``, checked against its public key.

    Parameters
    ----------
    context:
        The node's context (``state["secagg"]``).
    index:
        The node's client index.
    t, attempt:
        The round and attempt the message is for.
    """
    state = context.state["secagg"]
    if (int(state["round"]), int(state["attempt"])) != (t, attempt):
        raise RuntimeError(
            f"asked for round {t} attempt {attempt}, but the last key advertised was for round "
            f"{state['round']} attempt {state['attempt']}"
        )
    party = new_party(index, t, bytes(state["private"]))
    if party.public_bytes != bytes(state["public"]):
        raise RuntimeError(f"client {index}: the stored key pair does not match its public key")
    return party


def secagg_reveal(msg: "Message", context: "Context", index: int, faults: FaultPlan) -> "Message":
    """``secagg/reveal``: this node's mask seeds with the dropped clients named (and only them).

    Parameters
    ----------
    msg, context:
        The message and the node's context.
    index:
        The node's client index.
    faults:
        Injected faults (``no-recovery``: the node refuses).
    """
    flwr_app = _flwr()[0]
    config = msg.content["config"]
    t = int(config["round"])
    if faults.faults.get((index, t)) == "no-recovery":
        raise RuntimeError(f"injected fault: client {index} does not reveal its seeds")
    party = restore_party(context, index, t, int(config["attempt"]))
    dropped = [int(d) for d in msg.content["dropped"]["d"].numpy()]
    publics = {int(k): _bytes(v) for k, v in msg.content["publics"].items()}
    seeds = party.reveal(dropped, publics)
    return flwr_app.Message(
        content=flwr_app.RecordDict(
            {"seeds": arrays_record({str(d): _uint8(seed) for d, seed in seeds.items()})}
        ),
        reply_to=msg,
    )


def _node_client(client_for: ClientFactory, run: ConfigRecord, index: int) -> Client:
    clip = float(run["clip"])
    return client_for(RunConfig.from_json(run["cfg"]), index, None if clip < 0 else clip)


#: The default ClientApp ``train`` (SDK models and datasets).
client_train = make_client_train()


def build_apps(
    cfg: RunConfig,
    *,
    progress: Callable[[str], None] | None,
    sink: dict[str, Any],
    faults: FaultPlan | None = None,
    server_work: Callable[..., Any] | None = None,
    client_work: Callable[[Message, Context], Message] | None = None,
) -> tuple[ServerApp, ClientApp]:
    """A ServerApp and a ClientApp for ``cfg``; the ServerApp leaves its result in ``sink``.

    Parameters
    ----------
    cfg:
        The run.
    progress:
        Called with one line per round.
    sink:
        Receives the ServerApp's result under ``"result"``.
    faults:
        Client failures to inject.
    server_work, client_work:
        ``server_work(grid, cfg, plan=, progress=)`` and ``client_work(msg, context)``; default
        to this module's :func:`serve` and :func:`client_train` (a scheme with its own rounds
        passes its own).
    """
    _, serverapp, clientapp, _ = _flwr()
    server_app, client_app = serverapp.ServerApp(), clientapp.ClientApp()
    work = server_work or serve

    @server_app.main()
    def main(grid: "Grid", context: "Context") -> None:
        sink["result"] = work(grid, cfg, plan=faults or FaultPlan(), progress=progress)

    client_app.train()(client_work or client_train)
    return server_app, client_app


def run_flower(
    cfg: RunConfig,
    *,
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    server_work: Callable[..., Any] | None = None,
    client_work: Callable[[Message, Context], Message] | None = None,
    task: FederatedTask | None = None,
    reference_drift: bool = False,
) -> Any:
    """Run ``cfg`` on Flower's simulation runtime (Ray backend) with ``cfg.clients`` virtual nodes
    (Ray gets no more CPUs than there are nodes).

    Parameters
    ----------
    cfg, progress, faults, server_work, client_work:
        As in :func:`build_apps`.
    task:
        A user's model and data: the nodes train on its client data (then neither
        ``server_work`` nor ``client_work`` may be given).
    reference_drift:
        As in :func:`serve` (then ``server_work`` may not be given).

    Returns
    -------
    RunResult or a scheme's own result
        What the ServerApp's work returned.
    """
    _, _, _, simulation = _flwr()
    sink: dict[str, Any] = {}
    if task is not None and client_work is not None:
        raise ValueError("task replaces the default client work")
    user_task = task
    if task is not None or reference_drift:
        if server_work is not None:
            raise ValueError("task and reference_drift replace the default server work")

        def server_work(grid: "Grid", cfg: RunConfig, **kwargs: Any) -> RunResult:
            return serve(grid, cfg, task=user_task, reference_drift=reference_drift, **kwargs)

    if user_task is not None:

        def client_for(cfg: RunConfig, index: int, clip: float | None) -> Client:
            return user_task.client(cfg, index, optimizer_by_name(cfg.optimizer, cfg.lr), clip)

        client_work = make_client_train(client_for)
    server_app, client_app = build_apps(
        cfg,
        progress=progress,
        sink=sink,
        faults=faults,
        server_work=server_work,
        client_work=client_work,
    )
    simulation.run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=cfg.clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": min(cfg.clients, os.cpu_count() or 1)},
        },
    )
    if "result" not in sink:
        raise RuntimeError("the Flower run ended without a result (see the Flower log above)")
    return sink["result"]
