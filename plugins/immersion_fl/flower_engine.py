"""Flower engine: the same schemes as Flower ServerApp + ClientApp, run by Flower's simulation runtime.

Message flow (Flower's Message API, flwr 1.41):

* ``handshake``: the server sends each node the run configuration and the client kit (``Pi1``,
  ``Pi1_left`` and, for M2, ``Pi2^R``: what a SIFL client holds); the node keeps it in its
  ``context.state`` and answers with its partition id and dataset size |D_i|.
* ``train``: the server (or, for M2, server plus aggregator coding) sends the broadcast arrays; the
  node runs :func:`~immersion_fl.schemes.client_upload` (the code the local engine runs) and
  answers with its upload. Nodes that answer with an error are left out of the round (logged).

The ServerApp aggregates with weights |D_i| / sum over the nodes that answered.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any, Callable

import numpy as np
from immersion import OptionalDependencyError

from .data import load_dataset
from .engine import RunConfig, RunResult, Server, build_model_for, make_client
from .faults import FaultPlan, upload_problem
from .schemes import ClientKit, client_upload

LOG = logging.getLogger("immersion.fl")


def _flwr() -> Any:
    try:
        import flwr  # noqa: F401
        from flwr import app as flwr_app
        from flwr import clientapp, serverapp, simulation
    except ImportError:
        raise OptionalDependencyError("flwr[simulation]", "fl", "engine='flower'") from None
    return flwr_app, serverapp, clientapp, simulation


def _config_from_json(blob: str) -> RunConfig:
    raw = json.loads(blob)
    raw["hidden"] = tuple(raw["hidden"])
    return RunConfig(**raw)


_CLIENT_CACHE: dict[tuple[str, int], Any] = {}


def _client_for(cfg_json: str, index: int) -> Any:
    """The node's Client (data share and model), built once per worker process."""
    import torch

    key = (cfg_json, index)
    if key not in _CLIENT_CACHE:
        cfg = _config_from_json(cfg_json)
        data = load_dataset(cfg.dataset, seed=cfg.seed)
        _CLIENT_CACHE[key] = make_client(cfg, data, build_model_for(cfg, data), index, torch)
    return _CLIENT_CACHE[key]


def _flwr_types() -> Any:
    flwr_app = _flwr()[0]
    return (
        flwr_app.Array,
        flwr_app.ArrayRecord,
        flwr_app.ConfigRecord,
        flwr_app.Message,
        flwr_app.RecordDict,
    )


def _arrays(payload: dict[str, np.ndarray]) -> Any:
    Array, ArrayRecord = _flwr_types()[:2]
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in payload.items()})


def serve(
    grid: Any, cfg: RunConfig, *, plan: FaultPlan, progress: Callable[[str], None] | None
) -> RunResult:
    """The ServerApp's work for ``cfg`` (simulation and deployment runtimes alike)."""
    import torch

    _, _, ConfigRecord, Message, RecordDict = _flwr_types()
    cfg_json = json.dumps(asdict(cfg))
    plan_json = json.dumps([[c, t, k] for (c, t), k in plan.faults.items()])
    deadline = time.time() + 120
    nodes: list[int] = []
    while len(nodes) < cfg.clients and time.time() < deadline:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.05)
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    server = Server.create(cfg, data)  # keys drawn; noise calibrated after |D_i|
    kit = server.scheme.kit_arrays()
    msgs = [
        Message(
            content=RecordDict(
                {
                    "kit": _arrays(kit),
                    "config": ConfigRecord(
                        {"kind": "handshake", "cfg": cfg_json, "faults": plan_json}
                    ),
                }
            ),
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

    def flower_round(scheme: Any, name: str, t: int, dropped: list[dict[str, Any]]) -> float:
        start = time.perf_counter()
        payload = scheme.broadcast(t)
        msgs = [
            Message(
                content=RecordDict(
                    {
                        "w": _arrays({"w": payload.numpy()}),
                        "config": ConfigRecord({"kind": "train", "scheme": name, "round": t}),
                    }
                ),
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
            problem = (
                f"raised: {reply.error.reason}"
                if reply.has_error()
                else upload_problem(
                    torch.as_tensor(reply.content["w"]["w"].numpy()), scheme.upload_shape
                )
            )
            if problem:
                LOG.warning("round %d: client %d left out: %s", t, pid, problem)
                dropped.append({"round": t, "client": pid, "reason": problem})
                continue
            uploads.append(torch.as_tensor(reply.content["w"]["w"].numpy()))
            weights.append(sizes[pid])
        for pid in sorted(set(pid_of.values()) - answered):
            reason = f"no answer within {cfg.client_timeout} s"
            LOG.warning("round %d: client %d left out: %s", t, pid, reason)
            dropped.append({"round": t, "client": pid, "reason": reason})
        total = sum(weights)
        scheme.server_update(scheme.aggregate(uploads, [w / total for w in weights]))
        return time.perf_counter() - start

    for t in range(cfg.rounds):
        seconds = flower_round(server.scheme, "scheme", t, server.result.dropped)
        seconds_plain = (
            flower_round(server.plain, "fedavg", t, []) if server.plain is not None else None
        )
        server.record(t, seconds, seconds_plain, progress)
    return server.result


def client_train(msg: Any, context: Any) -> Any:
    """The ClientApp's ``train``: handshake (keep the kit), then one round of :func:`client_upload`."""
    import torch
    from immersion.backends import make_backend

    _, _, ConfigRecord, Message, RecordDict = _flwr_types()
    config = msg.content["config"]
    index = int(context.node_config["partition-id"])
    if config["kind"] == "handshake":
        context.state["kit"] = msg.content["kit"]
        context.state["run"] = ConfigRecord({"cfg": config["cfg"], "faults": config["faults"]})
        client = _client_for(config["cfg"], index)
        return Message(
            content=RecordDict(
                {"config": ConfigRecord({"pid": index, "n_samples": client.n_samples})}
            ),
            reply_to=msg,
        )
    cfg_blob = context.state["run"]["cfg"]
    client = _client_for(cfg_blob, index)
    kit = None
    if config["scheme"] != "fedavg":
        kit_arrays = {k: v.numpy() for k, v in context.state["kit"].items()}
        kit = ClientKit.from_arrays(
            kit_arrays, make_backend("torch", dtype="float64", device="cpu")
        )
    received = torch.as_tensor(msg.content["w"]["w"].numpy())
    t = int(config["round"])
    faults_here = FaultPlan({(c, r): k for c, r, k in json.loads(context.state["run"]["faults"])})
    timeout = _config_from_json(cfg_blob).client_timeout or 0.0
    upload = faults_here.apply(index, t, lambda: client_upload(kit, client, received, t), timeout)
    return Message(content=RecordDict({"w": _arrays({"w": upload.numpy()})}), reply_to=msg)


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
    def main(grid: Any, context: Any) -> None:
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
) -> Any:
    """Run ``cfg`` on Flower's simulation runtime (Ray backend) with ``cfg.clients`` virtual nodes
    (Ray gets no more CPUs than there are nodes); ``server_work``/``client_work`` as in :func:`build_apps`."""
    _, _, _, simulation = _flwr()
    sink: dict[str, Any] = {}
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
