"""Plain FedAvg, ``SecureAggregation`` and Flower's legacy ``SecAggPlusWorkflow``, side by side.

One process, one in-process grid for all: every message's content is serialised to Flower's
protobuf and read back (so the bytes are the wire's and the cost of (de)serialising is counted),
and each node's ClientApp (its mods included) runs in turn. Same model and training step
everywhere: one SGD step of a batch of 32 on the node's synthetic data, for the quickstart's CNN on
8x8 digits (float64) and a 1M-parameter MLP (784-1024-200-10, float32).

Per round (median over the rounds after the first), for each method:

* ``serial_s``: the round's wall time, nodes run one after another (the total work);
* ``parallel_s``: the server's own time plus, for each message exchange, the slowest node (the
  round time if every node had its own core);
* ``server_s``: the server's own time (the round's wall time less the nodes' time);
* ``bytes_per_node``: bytes to and from a node in the round (serialised records);

and their ratios over plain FedAvg. Methods: ``plain`` (the Message-API FedAvg); ``ours``
(``SecureAggregation(FedAvg)`` with its defaults: a random ring of ``k = ring_neighbours(n)``
peers, one fixed-point word per value); ``ours-2w`` (that ring, two words per value);
``ours-complete`` (every other member, one word) and ``ours-complete-2w`` (every other member, two
words: the defaults before the ring); and ``secagg+`` and ``secagg+-k``
(``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` with ``secaggplus_mod``:
``num_shares`` = every node, or ``k + 1``, the same neighbours as ours). Dropouts: the chosen
fraction of nodes fails every round after the key set-up (plain: at train; ours: at the masked
upload; SecAgg+: at ``collect_masked_vectors``).

With ``--repeat R`` every method of a row except SecAgg+ runs ``R`` times in turn (plain, ours,
..., plain, ours, ...) and keeps its least disturbed run (the smallest serial time): the machine
is shared with other work, which slows one method's run and not another's. Every run is kept in
the JSON (``runs``, each with the load average after it).

    python benchmarks/bench_flower_secagg.py [--nodes 10 50] [--dropouts 0 0.2] [--rounds 3]
        [--repeat 1] [--models cnn mlp1m] [--methods plain ours ours-2w ...] [--out FILE]
        [--rerun]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fl_demos" / "flower_quickstart"))
torch.set_num_threads(1)

#: The clock of every figure: wall time, or with ``--clock cpu`` this process's CPU time (all of
#: the run is in this one process: on a machine shared with other work, CPU time leaves out the
#: time the process waited for a core, which wall time counts whenever others are busy).
CLOCK = time.perf_counter

METHODS = (
    "plain",
    "ours",
    "ours-2w",
    "ours-complete",
    "ours-complete-2w",
    "secagg+",
    "secagg+-k",
)
BATCH = 32


def make_model(name: str) -> torch.nn.Module:
    """The quickstart's CNN (float64) or the 1M-parameter MLP (float32)."""
    if name == "cnn":
        from digitsexample.task import Net

        return Net()
    if name == "mlp1m":
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(784, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 200),
            torch.nn.ReLU(),
            torch.nn.Linear(200, 10),
        )
    raise SystemExit(f"unknown model {name!r}")


def batch_of(model_name: str, node: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The node's fixed synthetic batch."""
    g = torch.Generator().manual_seed(node)
    shape, dtype = (
        ((BATCH, 1, 8, 8), torch.float64) if model_name == "cnn" else ((BATCH, 784), torch.float32)
    )
    return torch.rand(shape, generator=g, dtype=dtype), torch.randint(0, 10, (BATCH,), generator=g)


def sgd_step(model: torch.nn.Module, model_name: str, node: int) -> float:
    """One SGD step on the node's batch; the loss."""
    x, y = batch_of(model_name, node)
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
    return float(loss.detach())


# ---------------------------------------------------------------------------------------- the grid
class Grid:
    """Runs each node's ClientApp in this process, messages through Flower's protobuf."""

    def __init__(self, app: Any, nodes: list[int], fail: dict[str, set[int]]) -> None:
        from flwr.app import Context, RecordDict

        self.app, self.nodes, self.fail = app, nodes, fail
        self.contexts = {
            n: Context(
                run_id=1,
                node_id=n,
                node_config={"partition-id": i, "num-partitions": len(nodes)},
                state=RecordDict(),
                run_config={},
            )
            for i, n in enumerate(nodes)
        }
        self.run = type("Run", (), {"run_id": 1})()
        self.log: list[dict[str, Any]] = []  # one entry per exchange

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Any]:
        from flwr.app import Error, Message
        from flwr.common.serde import recorddict_to_proto

        start, slowest, node_time, replies = CLOCK(), 0.0, 0.0, []
        traffic: dict[int, int] = {}
        for msg in messages:
            node = msg.metadata.dst_node_id
            proto = recorddict_to_proto(msg.content).SerializeToString()
            traffic[node] = traffic.get(node, 0) + len(proto)
            if node in self.fail.get(stage_of(msg), set()):
                continue
            tick = CLOCK()
            msg.content = _read(proto)
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as exc:  # as Flower's runtimes: an error reply
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            if not reply.has_error():
                blob = recorddict_to_proto(reply.content).SerializeToString()
                traffic[node] += len(blob)
                reply.content = _read(blob)
            spent = CLOCK() - tick
            slowest, node_time = max(slowest, spent), node_time + spent
            replies.append(reply)
        self.log.append(
            {
                "seconds": CLOCK() - start,
                "node_seconds": node_time,
                "slowest": slowest,
                "traffic": traffic,
            }
        )
        return replies


def _read(blob: bytes) -> Any:
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    proto = ProtoRecordDict()
    proto.ParseFromString(blob)
    return recorddict_from_proto(proto)


def stage_of(msg: Any) -> str:
    """Which protocol step a message is (dropouts are injected at one)."""
    content = msg.content
    if "secagg.stage" in content:
        return str(content["secagg.stage"]["stage"])
    if "secaggplus_configs" in content:
        return str(content["secaggplus_configs"]["stage"])
    return "train"


# ----------------------------------------------------------------------------- the Message API apps
def message_api_app(model_name: str, secure: bool) -> Any:
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from immersion_secagg import secure_aggregation_mod

    app = ClientApp()

    @app.train(mods=[secure_aggregation_mod] if secure else [])
    def train(msg: Any, context: Any) -> Any:
        model = make_model(model_name)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        loss = sgd_step(model, model_name, context.node_id)
        metrics = MetricRecord({"train_loss": loss, "num-examples": BATCH + context.node_id % 5})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    return app


def run_message_api(model_name: str, n: int, rounds: int, method: str, fail: dict) -> dict:
    from flwr.app import ArrayRecord
    from flwr.serverapp.strategy import FedAvg
    from immersion_secagg import SecureAggregation

    strategy: Any = FedAvg(fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=2)
    if method != "plain":
        threshold = max(2, math.ceil(0.6 * n))
        options: dict[str, Any] = {"words": 2} if method.endswith("-2w") else {}
        if method.startswith("ours-complete"):
            options["neighbours"] = None
        strategy = SecureAggregation(strategy, threshold=threshold, rng=0, **options)
    grid = Grid(message_api_app(model_name, method != "plain"), list(range(1, n + 1)), fail)
    marks: list[list[float]] = []
    configure, aggregate = strategy.configure_train, strategy.aggregate_train

    def configure_train(*args: Any) -> Any:
        marks.append([len(grid.log), CLOCK()])
        return configure(*args)

    def aggregate_train(*args: Any) -> Any:
        out = aggregate(*args)
        marks[-1] += [len(grid.log), CLOCK()]
        return out

    strategy.configure_train, strategy.aggregate_train = configure_train, aggregate_train
    rounds_s = _timed_rounds(
        lambda: strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(make_model(model_name).state_dict()),
            num_rounds=rounds,
        ),
        grid,
        marks,
    )
    return rounds_s


# ------------------------------------------------------------------------------ the legacy SecAgg+
def legacy_app(model_name: str, secure: bool) -> Any:
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod

    def client_fn(context: Any) -> Any:
        node = context.node_id

        class Node(NumPyClient):  # type: ignore[misc]
            def fit(self, parameters: list, config: dict) -> tuple:
                model = make_model(model_name)
                keys = list(model.state_dict())
                model.load_state_dict(
                    {k: torch.as_tensor(v) for k, v in zip(keys, parameters, strict=True)}
                )
                loss = sgd_step(model, model_name, node)
                values = [v.detach().numpy() for v in model.state_dict().values()]
                return values, BATCH + node % 5, {"train_loss": loss}

        return Node().to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if secure else [])


def run_secaggplus(model_name: str, n: int, rounds: int, method: str, fail: dict) -> dict:
    from flwr.app import Context, RecordDict
    from flwr.common import ndarrays_to_parameters
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    shares = n if method == "secagg+" else neighbours(n) + 1
    initial = [v.detach().numpy() for v in make_model(model_name).state_dict().values()]
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=2,
        min_evaluate_clients=0,
        min_available_clients=n,
        accept_failures=True,
        initial_parameters=ndarrays_to_parameters(initial),
    )
    context = LegacyContext(
        context=Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=rounds),
        strategy=strategy,
    )
    workflow = SecAggPlusWorkflow(
        num_shares=shares, reconstruction_threshold=max(2, math.ceil(0.6 * shares))
    )
    grid = Grid(legacy_app(model_name, True), list(range(1, n + 1)), fail)
    marks: list[list[float]] = []

    def fit(grid_: Any, ctx: Any) -> None:
        marks.append([len(grid.log), CLOCK()])
        workflow(grid_, ctx)
        marks[-1] += [len(grid.log), CLOCK()]

    return _timed_rounds(lambda: DefaultWorkflow(fit_workflow=fit)(grid, context), grid, marks)


# ------------------------------------------------------------------------------------------ timing
def _timed_rounds(work: Any, grid: Grid, marks: list[list[float]]) -> dict:
    """Run; per round: wall (serial), server + slowest node per exchange (parallel), bytes."""
    start = CLOCK()
    work()
    total = CLOCK() - start
    serial, parallel, traffic, servers = [], [], [], []
    for first, t0, last, t1 in marks:
        exchanges = grid.log[int(first) : int(last)]
        wall = t1 - t0
        server = wall - sum(e["node_seconds"] for e in exchanges)
        serial.append(wall)
        servers.append(server)
        parallel.append(server + sum(e["slowest"] for e in exchanges))
        per_node: dict[int, int] = {}
        for e in exchanges:
            for node, b in e["traffic"].items():
                per_node[node] = per_node.get(node, 0) + b
        traffic.append(statistics.mean(per_node.values()) if per_node else 0)
    return {
        "serial": serial,
        "parallel": parallel,
        "server": servers,
        "bytes": traffic,
        "total_s": total,
    }


def neighbours(n: int) -> int:
    """Our default ring's neighbours for ``n`` members (every other one when it is complete)."""
    from immersion_secagg.message_graph import ring_neighbours

    return ring_neighbours(n) or n - 1


def one_run(model_name: str, n: int, dropout: float, rounds: int, method: str) -> dict:
    nodes = list(range(1, n + 1))
    failing = set(
        np.random.default_rng(n).choice(nodes, int(round(dropout * n)), replace=False).tolist()
    )
    stage = (
        "train"
        if method == "plain"
        else "upload"
        if method.startswith("ours")
        else "collect_masked_vectors"
    )
    fail = {stage: failing} if failing else {}
    runner = run_secaggplus if method.startswith("secagg+") else run_message_api
    raw = runner(model_name, n, rounds, method, fail)
    after = slice(1, None) if rounds > 1 else slice(None)
    return {
        "serial_s": statistics.median(raw["serial"][after]),
        "parallel_s": statistics.median(raw["parallel"][after]),
        "server_s": statistics.median(raw["server"][after]),
        "bytes_per_node": statistics.median(raw["bytes"][after]),
        "run_s": raw["total_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp1m"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each method of a row this many times, in turn, and keep its least disturbed "
        "run (the smallest serial time; every run is in the JSON); SecAgg+ runs once",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (less sensitive to other work)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="replace in --out only the methods of the rows this run measures (disturbed by "
        "other work), keeping the others; ratios recomputed, each method rerun and the file "
        "record this command",
    )
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        metavar="MODEL:NODES:METHOD",
        help="cells not run (stated in the JSON), e.g. mlp1m:50:secagg+",
    )
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    args.base = None
    if args.rerun:
        if args.out is None or not args.out.exists():
            raise SystemExit("--rerun needs an existing --out file")
        args.base = json.loads(args.out.read_text())
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):  # messages made outside a Flower runtime
        setattr(TaskIdentity, name, 1)
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.getLogger("immersion").setLevel(logging.CRITICAL)
    rows = []
    for model_name in args.models:
        for n in args.nodes:
            for dropout in args.dropouts:
                row: dict[str, Any] = {"model": model_name, "nodes": n, "dropout": dropout}
                row["k"] = neighbours(n)
                for repeat in range(args.repeat):  # the methods in turn, `repeat` times
                    for method in args.methods:
                        if f"{model_name}:{n}:{method}" in args.skip:
                            row[method] = {"skipped": "not run (--skip)"}
                            continue
                        if repeat and method.startswith("secagg+"):
                            continue  # once: 5-100x slower, noise cannot change the comparison
                        got = one_run(model_name, n, dropout, args.rounds, method)
                        got["load_average_1min"] = os.getloadavg()[0]
                        runs = [*row.get(method, {}).get("runs", []), got]
                        best = min(runs, key=lambda r: r["serial_s"])  # least disturbed
                        row[method] = {**best, "runs": runs}
                        print(f"[bench-flower-secagg] {model_name} n={n} drop={dropout} {method}: "
                              f"{got}", file=sys.stderr)  # fmt: skip
                row["load_average_1min"] = os.getloadavg()[0]  # other work on the machine
                rows.append(row)
                _write(args, rows)
    print(_write(args, rows))


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """The results so far as JSON (and into ``--out``: a long run leaves what it measured);
    with ``--rerun``, the rows measured replace those of ``--out`` for the same cells."""
    command = "python benchmarks/bench_flower_secagg.py " + " ".join(sys.argv[1:])
    if args.base is not None:
        new = {_cell(r): r for r in rows}
        merged = [_merge(r, new.pop(_cell(r), None), command) for r in args.base["rows"]]
        merged += [_ratios(r) for r in new.values()]
        reruns = [*args.base.get("reruns", []), command]
        text = json.dumps({**args.base, "reruns": reruns, "rows": merged}, indent=1)
        args.out.write_text(text + "\n")
        return text
    rows = [_ratios(r) for r in rows]
    result = {
        "command": command,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical "
        "cores (shared with other work), torch on 1 thread",
        "flwr": __import__("flwr").__version__,
        "rounds": args.rounds,
        "clock": args.clock,
        "skipped": args.skip,
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return text


def _cell(row: dict[str, Any]) -> tuple[str, int, float]:
    return row["model"], row["nodes"], row["dropout"]


def _merge(old: dict[str, Any], new: dict[str, Any] | None, command: str) -> dict[str, Any]:
    """``old`` with the methods measured again in ``new`` replaced (each marked with the
    command), and the ratios recomputed."""
    if new is None:
        return old
    rerun = {m: {**v, "rerun": command} for m, v in new.items() if m in METHODS}
    rest = {k: v for k, v in new.items() if k not in METHODS}
    return _ratios({**old, **rest, **rerun})


def _ratios(row: dict[str, Any]) -> dict[str, Any]:
    """Each method's serial, parallel and bytes ratios over plain's in the row."""
    plain = row.get("plain", {})
    if "serial_s" not in plain:
        return row
    for method in METHODS:
        for key in ("serial_s", "parallel_s", "bytes_per_node"):
            if key in row.get(method, {}):
                row[method][key.replace("_s", "") + "_ratio"] = row[method][key] / plain[key]
    return row


if __name__ == "__main__":
    main()
