"""The in-process federated engine: deterministic rounds, a scheme and plain FedAvg in lockstep.

The learning problem of a run is a :class:`FederatedTask` (model, each client's data, held-out
data); :func:`task_from_config` builds one from the SDK's model and dataset names (the runner,
``immersion fl run``), :func:`immersion_fl.api.run` from a user's own module and data. The rounds
are the same either way (:func:`train_rounds`). Registered names (schemes, optimizers) are
resolved at the edge (:mod:`immersion_fl.runtime.federation`, whose names this module
re-exports), never inside the scheme or optimizer modules.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from immersion import InvalidArgumentError

from ..config import RunConfig
from ..scheme import AggregateT, AnyScheme, BroadcastT, Scheme, UploadT
from .checkpoint import Checkpoint
from .client import Client
from .faults import FaultPlan, run_client
from .federation import (
    EveryClientFailedError,
    FederatedTask,
    RunResult,
    Server,
    make_scheme,
    optimizer_by_name,
    task_from_config,
    uses_user_code,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "EveryClientFailedError",
    "FederatedTask",
    "RunConfig",
    "RunResult",
    "Server",
    "make_scheme",
    "optimizer_by_name",
    "run_federated",
    "task_from_config",
    "train_rounds",
]


@dataclass
class _Recording:
    """A client whose trained model is kept (the one-step error compares the aggregate to it)."""

    client: Client
    sink: dict[int, "torch.Tensor"]

    @property
    def index(self) -> int:
        return self.client.index

    @property
    def n_samples(self) -> int:
        return self.client.n_samples

    def train(self, w_start: "torch.Tensor", round_t: int) -> "torch.Tensor":
        w_end = self.client.train(w_start, round_t)
        self.sink[self.client.index] = w_end
        return w_end


def _round(
    scheme: AnyScheme,
    clients: list[Client],
    sizes: list[int],
    t: int,
    *,
    plan: FaultPlan,
    timeout_s: float | None,
    dropped: list[dict[str, Any]],
    aborted: list[dict[str, Any]],
    locals_sink: dict[int, "torch.Tensor"] | None = None,
) -> tuple[float, list[int], "torch.Tensor | None"]:
    """One round; failing clients are left out and the weights renormalised over the others.

    With ``scheme.secure_aggregation`` the aggregation is a secure sum
    (:func:`immersion_fl.runtime.secure.local_round`). Returns the seconds, the clients whose
    uploads were aggregated and, with ``locals_sink``, the plain weighted average of their local
    models (their true ``w_i``: the reference of the one-step error).
    """
    if locals_sink is not None:
        clients = [_Recording(c, locals_sink) for c in clients]  # type: ignore[misc]
    if scheme.secure_aggregation:
        from .secure import local_round

        seconds, contributors = local_round(
            scheme,
            clients,
            sizes,
            t,
            plan=plan,
            timeout_s=timeout_s,
            dropped=dropped,
            aborted=aborted,
        )
    else:
        seconds, contributors = _plain_round(
            scheme, clients, sizes, t, plan=plan, timeout_s=timeout_s, dropped=dropped
        )
    if locals_sink is None:
        return seconds, contributors, None
    total = sum(sizes[i] for i in contributors)
    average = sum(sizes[i] / total * locals_sink[i] for i in contributors)
    return seconds, contributors, average  # type: ignore[return-value]


def _plain_round(
    scheme: Scheme[BroadcastT, UploadT, AggregateT],
    clients: list[Client],
    sizes: list[int],
    t: int,
    *,
    plan: FaultPlan,
    timeout_s: float | None,
    dropped: list[dict[str, Any]],
) -> tuple[float, list[int]]:
    """A round whose aggregator receives the uploads themselves."""
    start = time.perf_counter()
    received = scheme.broadcast(t)
    pool = ThreadPoolExecutor(max_workers=1) if timeout_s is not None else None
    uploads: list[UploadT] = []
    kept: list[int] = []
    contributors: list[int] = []
    try:
        for client in clients:
            upload = run_client(
                client.index,
                t,
                partial(scheme.client_upload, client, received, t),
                plan=plan,
                timeout_s=timeout_s,
                expected_shape=scheme.upload_shape,
                expected_dtype=scheme.upload_dtype,
                dropped=dropped,
                pool=pool,
            )
            if upload is not None:
                uploads.append(upload)
                kept.append(sizes[client.index])
                contributors.append(client.index)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    if not uploads:
        raise EveryClientFailedError(f"round {t}: every client failed; nothing to aggregate")
    scheme.server_update(scheme.aggregate(uploads, kept))  # weights |D_i| / |D| over survivors
    return time.perf_counter() - start, contributors


def train_rounds(
    server: Server,
    clients: list[Client],
    *,
    plan: FaultPlan | None = None,
    first: int = 0,
    stop_after: int | None = None,
    store: Checkpoint | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Rounds ``first .. cfg.rounds - 1`` (or up to ``stop_after``) of the scheme, with its plain
    twin in lockstep on the same clients and batches; checkpoint after every round if ``store``.

    Parameters
    ----------
    server:
        The server (:meth:`Server.create`), calibrated.
    clients:
        Every client (:meth:`FederatedTask.clients`).
    plan:
        Client failures to inject (tests, demos).
    first:
        The first round to run (a resumed run starts later).
    stop_after:
        End after that many rounds (to simulate an interruption).
    store:
        Where to checkpoint after every round, or None.
    progress:
        Called with one line per round.

    Returns
    -------
    RunResult
        ``server.result``, with the final decoded model.
    """
    cfg, plan = server.cfg, plan or FaultPlan()
    sizes = [c.n_samples for c in clients]
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    for t in range(first, last):
        seconds, contributors, local_average = _round(
            server.scheme,
            clients,
            sizes,
            t,
            plan=plan,
            timeout_s=cfg.client_timeout,
            dropped=server.result.dropped,
            aborted=server.result.aborted,
            locals_sink={} if server.scheme.kit is not None else None,
        )
        # the twins aggregate the same contributors (a secure round may give up on a silent client)
        same = [c for c in clients if c.index in contributors]
        twins = [server.plain] if server.plain is not None else []
        timings = [
            _round(
                twin,
                same,
                sizes,
                t,
                plan=plan,
                timeout_s=cfg.client_timeout,
                dropped=[],
                aborted=[],
            )[0]
            for twin in twins + list(server.references.values())
        ]
        server.record(t, seconds, timings[0] if twins else None, progress, local_average)
        if store is not None:
            store.save(server, t + 1)
    server.result.final_model = server.scheme.global_model()
    return server.result


def run_federated(
    cfg: RunConfig,
    *,
    engine: str = "local",
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    task: FederatedTask | None = None,
    reference_drift: bool = False,
) -> RunResult:
    """Run ``cfg.scheme`` for ``cfg.rounds`` rounds, with plain FedAvg in lockstep if
    ``compare_plain``.

    Parameters
    ----------
    cfg:
        The run (common fields and the scheme's options).
    engine:
        ``"local"`` runs the clients in this process; ``"flower"`` runs them as Flower ClientApps
        under Flower's simulation runtime, with the same scheme code.
    progress:
        Called with one line per round.
    faults:
        Client failures to inject (tests, demos).
    checkpoint, resume:
        Save the server state after every round in this folder; continue a saved run (the
        result equals that of an uninterrupted run).
    stop_after:
        End after that many rounds (to simulate an interruption).
    task:
        The learning problem (default: :func:`task_from_config`).
    reference_drift:
        Also run plain FedAvg summing its uploads in reverse order, beside the plain twin
        (``compare_plain``; weight-averaging schemes, both engines): ``reference_drift`` per round.

    Returns
    -------
    RunResult
        The per-round figures and the final decoded model.
    """
    from ..registry import fl_registry

    plan = faults or FaultPlan()
    spec = fl_registry().fl_scheme(cfg.scheme)
    cfg.options.check_engine(engine)
    if task is None and uses_user_code(cfg):
        task = task_from_config(cfg)
    if spec.runner is not None:
        if checkpoint is not None or resume or stop_after is not None:
            raise InvalidArgumentError(
                "checkpoint", f"scheme {cfg.scheme!r} does not support checkpoints yet"
            )
        return spec.runner(cfg, engine=engine, progress=progress, faults=plan, task=task)
    if engine == "flower":
        from ..flower.engine import run_flower

        if checkpoint is not None or resume or stop_after is not None:
            raise InvalidArgumentError("checkpoint", "checkpoints work with engine='local'")
        return run_flower(
            cfg, progress=progress, faults=plan, task=task, reference_drift=reference_drift
        )
    if engine != "local":
        raise InvalidArgumentError("engine", f"expected 'local' or 'flower', got {engine!r}")
    task = task or task_from_config(cfg)
    if resume and checkpoint is None:
        raise InvalidArgumentError("resume", "needs a checkpoint folder")
    start = time.perf_counter()
    server = Server.create(
        cfg, task, task.sizes, device=task.device, reference_drift=reference_drift
    )
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    store = Checkpoint(Path(checkpoint), cfg) if checkpoint is not None else None
    first = store.load(server) if resume and store is not None else 0
    server.result.setup_s = time.perf_counter() - start
    return train_rounds(
        server,
        clients,
        plan=plan,
        first=first,
        stop_after=stop_after,
        store=store,
        progress=progress,
    )


def codec_seconds_per_round(cfg: RunConfig, *, repeats: int = 5) -> float:
    """Time of the coding work one round adds to FedAvg, measured alone (best of ``repeats``).

    Per round: the server's noisy encode and its decode, and for every client one decode and one
    lift (seed 000 Algorithm 1); for M2 also the aggregator's coding and the clients' ``Pi2^R``.

    Parameters
    ----------
    cfg:
        The run (scheme, model, dataset, clients).
    repeats:
        Timed repetitions; the best is kept.

    Notes
    -----
    The wall-clock ratio of two whole training runs moved by +-30 % between runs on a 2-core
    machine; this figure does not depend on the training time.
    """
    task = task_from_config(cfg)
    server = Server.create(cfg, task, [1] * cfg.clients)
    scheme = server.scheme
    if scheme.kit is None:
        return 0.0
    w = task.w0

    class NoTraining:  # a client whose training is free: only the coding is timed
        index, n_samples = 0, 1

        @staticmethod
        def train(w_start: "torch.Tensor", round_t: int) -> "torch.Tensor":
            return w

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        received = scheme.broadcast(0)
        uploads = [scheme.client_upload(NoTraining(), received, 0) for _ in range(cfg.clients)]
        scheme.server_update(scheme.aggregate(uploads, [1] * cfg.clients))
        best = min(best, time.perf_counter() - start)
    return best


def stderr_progress(message: str) -> None:
    """Progress lines on stderr (stdout stays for --json).

    Parameters
    ----------
    message:
        One progress line.
    """
    print(f"[fl] {message}", file=sys.stderr, flush=True)


def progress_bar(total: int) -> Callable[[str], None]:
    """A progress callback drawing a bar on stderr (one line per round when stderr is not a
    terminal).

    Parameters
    ----------
    total:
        The number of rounds.
    """
    from immersion.progress import Progress

    bar = Progress(total, "rounds")

    def update(message: str) -> None:
        bar.step(message.split(": ", 1)[-1])
        if bar.done == bar.total:
            bar.close()

    return update
