"""The SDK runner on Flower: the same schemes as a Flower ServerApp + ClientApp, run by Flower's
simulation runtime (``immersion fl run --engine flower``) or its deployment runtime
(:mod:`immersion_fl.flower_app`).

Message flow (Flower's Message API, flwr 1.41):

* ``handshake``: the server sends each node the run configuration and the client kit (``Pi1``,
  ``Pi1_left`` and, for M2, ``Pi2^R``: what a SIFL client holds); the node keeps it in its
  ``context.state`` and answers with its partition id and dataset size |D_i|.
* ``train``: the server (or, for M2, server plus aggregator coding) sends the broadcast arrays; the
  node runs :func:`~immersion_fl.schemes.client_upload` (the code the local engine runs) and
  answers with its upload. Nodes that answer with an error are left out of the round (logged).

The ServerApp aggregates with weights |D_i| / sum over the nodes that answered. A Flower user who
keeps their own apps uses :mod:`immersion_fl.flower_native` instead.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import OptionalDependencyError

from .client import Client
from .engine import (
    EveryClientFailedError,
    FederatedTask,
    RunConfig,
    RunResult,
    Server,
    optimizer_by_name,
    task_from_config,
)
from .faults import FaultPlan, upload_problem
from .scheme import Scheme
from .schemes import ClientKit, client_upload

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Context, Message
    from flwr.serverapp import Grid

LOG = logging.getLogger("immersion.fl")

#: Builds node ``index``'s client from the run configuration and the model norm bound.
ClientFactory = Callable[[RunConfig, int, "float | None"], Client]


def _flwr() -> Any:
    try:
        import flwr  # noqa: F401
        from flwr import app as flwr_app
        from flwr import clientapp, serverapp, simulation
    except ImportError:
        raise OptionalDependencyError("flwr[simulation]", "fl", "engine='flower'") from None
    return flwr_app, serverapp, clientapp, simulation


def flwr_types() -> tuple[Any, Any, Any, Any, Any]:
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
    """Node ``index``'s Client from the SDK's model and dataset names (task built once per process)."""
    key = cfg.to_json()
    if key not in _TASK_CACHE:
        _TASK_CACHE[key] = task_from_config(cfg)
    task = _TASK_CACHE[key]
    return task.client(cfg, index, optimizer_by_name(cfg.optimizer, cfg.lr), clip)


def arrays_record(payload: dict[str, np.ndarray]) -> "ArrayRecord":
    """An ArrayRecord of contiguous numpy arrays."""
    flwr_app = _flwr()[0]
    return flwr_app.ArrayRecord(
        {k: flwr_app.Array(np.ascontiguousarray(v)) for k, v in payload.items()}
    )


def _await_nodes(grid: "Grid", count: int, seconds: float = 120.0) -> list[int]:
    deadline, nodes = time.time() + seconds, []
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
) -> RunResult:
    """The ServerApp's work for ``cfg`` (simulation and deployment runtimes alike)."""
    import torch

    flwr_app = _flwr()[0]
    ConfigRecord, Message, RecordDict = flwr_app.ConfigRecord, flwr_app.Message, flwr_app.RecordDict
    nodes = _await_nodes(grid, cfg.clients)
    server = Server.create(
        cfg, task or task_from_config(cfg)
    )  # keys drawn; noise calibrated after |D_i|
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

    def flower_round(scheme: Scheme, name: str, t: int, dropped: list[dict[str, Any]]) -> float:
        start = time.perf_counter()
        payload = arrays_record({"w": scheme.broadcast(t).cpu().numpy()})
        config = ConfigRecord({"kind": "train", "scheme": name, "round": t})
        msgs = [
            Message(
                content=RecordDict({"w": payload, "config": config}),
                dst_node_id=n,
                message_type="train",
            )
            for n in pid_of
        ]
        uploads, weights, answered = [], [], set()
        replies = grid.send_and_receive(msgs, timeout=cfg.client_timeout)
        for reply in sorted(replies, key=lambda r: pid_of.get(r.metadata.src_node_id, -1)):
            pid = pid_of.get(reply.metadata.src_node_id, -1)
            answered.add(pid)
            upload = None if reply.has_error() else torch.as_tensor(reply.content["w"]["w"].numpy())
            problem = (
                f"raised: {reply.error.reason}"
                if upload is None
                else upload_problem(upload, scheme.upload_shape)
            )
            if problem:
                LOG.warning("round %d: client %d left out: %s", t, pid, problem)
                dropped.append({"round": t, "client": pid, "reason": problem})
                continue
            uploads.append(upload)
            weights.append(sizes[pid])
        for pid in sorted(set(pid_of.values()) - answered):
            reason = f"no answer within {cfg.client_timeout} s"
            LOG.warning("round %d: client %d left out: %s", t, pid, reason)
            dropped.append({"round": t, "client": pid, "reason": reason})
        if not uploads:
            raise EveryClientFailedError(f"round {t}: every client failed; nothing to aggregate")
        total = sum(weights)
        scheme.server_update(scheme.aggregate(uploads, [w / total for w in weights]))
        return time.perf_counter() - start

    for t in range(cfg.rounds):
        seconds = flower_round(server.scheme, "scheme", t, server.result.dropped)
        seconds_plain = (
            flower_round(server.plain, "fedavg", t, []) if server.plain is not None else None
        )
        server.record(t, seconds, seconds_plain, progress)
    server.result.final_model = server.scheme.global_model()
    return server.result


def make_client_train(
    client_for: ClientFactory = client_from_config,
) -> Callable[["Message", "Context"], "Message"]:
    """The ClientApp's ``train``: handshake (keep the kit), then one round of :func:`client_upload`.

    ``client_for(cfg, index, clip)`` builds the node's client (default: from the SDK's model and
    dataset names; :func:`immersion_fl.api.run` passes the user's own data).
    """

    def client_train(msg: "Message", context: "Context") -> "Message":
        import torch
        from immersion.backends import make_backend

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
        run = context.state["run"]
        client = _node_client(client_for, run, index)
        kit = None
        if config["scheme"] != "fedavg":
            kit_arrays = {k: v.numpy() for k, v in context.state["kit"].items()}
            kit = ClientKit.from_arrays(
                kit_arrays, make_backend("torch", dtype="float64", device="cpu")
            )
        received = torch.as_tensor(msg.content["w"]["w"].numpy())
        t = int(config["round"])
        faults_here = FaultPlan({(c, r): k for c, r, k in json.loads(run["faults"])})
        timeout = RunConfig.from_json(run["cfg"]).client_timeout or 0.0
        upload = faults_here.apply(
            index, t, lambda: client_upload(kit, client, received, t), timeout
        )
        return Message(
            content=RecordDict({"w": arrays_record({"w": upload.numpy()})}), reply_to=msg
        )

    return client_train


def _node_client(client_for: ClientFactory, run: Any, index: int) -> Client:
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
    client_work: Callable[[Any, Any], Any] | None = None,
) -> tuple[Any, Any]:
    """A ServerApp and a ClientApp for ``cfg``; the ServerApp leaves its result in ``sink``.

    ``server_work(grid, cfg, plan=, progress=)`` and ``client_work(msg, context)`` default to this
    module's :func:`serve` and :func:`client_train`; a scheme with its own rounds passes its own.
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
    client_work: Callable[[Any, Any], Any] | None = None,
    task: FederatedTask | None = None,
) -> Any:
    """Run ``cfg`` on Flower's simulation runtime (Ray backend) with ``cfg.clients`` virtual nodes
    (Ray gets no more CPUs than there are nodes); ``server_work``/``client_work`` as in :func:`build_apps`.
    With ``task`` (a user's model and data) the nodes train on its client data."""
    _, _, _, simulation = _flwr()
    sink: dict[str, Any] = {}
    if task is not None:
        if server_work is not None or client_work is not None:
            raise ValueError("task replaces the default server and client work")
        user_task = task

        def server_work(grid: "Grid", cfg: RunConfig, **kwargs: Any) -> RunResult:
            return serve(grid, cfg, task=user_task, **kwargs)

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
