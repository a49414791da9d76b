"""The in-process federated engine: deterministic rounds, a scheme and plain FedAvg in lockstep."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from immersion import InvalidArgumentError
from immersion.backends import make_backend

from .checkpoint import Checkpoint
from .client import Client
from .data import Dataset, load_dataset, split_clients
from .faults import FaultPlan, run_client
from .models import FlatModel, build_model
from .optimizers import make_optimizer
from .schemes import FedAvg, SchemeOptions, check_client_noise, client_upload, make_scheme


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a federated run (the CLI's options)."""

    scheme: str = "sifl-m1"
    optimizer: str = "sgd"
    lr: float = 0.05
    model: str = "mlp"
    hidden: tuple[int, ...] = (200, 200)
    clients: int = 10
    rounds: int = 5
    local_epochs: int = 1
    batch_size: int = 32
    dataset: str = "digits"
    split: str = "iid"
    alpha: float = 0.5
    seed: int = 0
    extra: int | None = None
    p: int = 2
    epsilon_local: float = 1.0
    noise: str = "auto"  # sifl: laplace | gaussian (auto: laplace); mpdp: on | off (auto: on)
    delta: float = 1e-5
    epsilon: float = 1.0  # mpdp: per-round (epsilon, delta) of the distributed noise
    graph: str = "complete"  # mpdp: neighbour graph, complete or nout:N
    mask_corrections: bool = True  # mpdp: server sees only the sum of Psi and Phi
    sensitivity: float = 1.0  # mpdp: assumed per-record sensitivity (the paper's S_f = 1)
    grad_clip: float = 10.0  # sgd-dp, gsgd-dp, gd-dp: per-example gradient clip C (seed 001)
    sigma2: float | None = (
        None  # sgd-dp, gsgd-dp, gd-dp: noise level; None: calibrated to epsilon over all rounds
    )
    clip: float = (
        100.0  # bounds ||w_i|| (Remark 3); far above these models' norms, so it never clips
    )
    keys: str = "auto"
    block_size: int = 8  # block transforms are memory-bound: b = 8 reads 4x less than b = 32
    compare_plain: bool = True
    client_timeout: float | None = None
    client_noise: bool = (
        False  # sifl: each client adds its own noise in ker(Pi1_left) (local engine only)
    )


@dataclass
class RunResult:
    """Per-round figures of one run (and of the plain FedAvg run beside it)."""

    config: RunConfig
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy_plain: list[float] = field(default_factory=list)
    loss_plain: list[float] = field(default_factory=list)
    diff_vs_plain: list[float] = field(default_factory=list)
    round_s: list[float] = field(default_factory=list)
    round_s_plain: list[float] = field(default_factory=list)
    n_params: int = 0
    n_encoded: int = 0
    key_bytes: int = 0
    privacy: dict[str, Any] = field(default_factory=dict)
    dropped: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON object of ``immersion fl run --json``."""
        ratio = (
            float(np.median(self.round_s) / np.median(self.round_s_plain))
            if self.round_s_plain
            else None
        )
        return {
            "scheme": self.config.scheme,
            "optimizer": self.config.optimizer,
            "model": self.config.model,
            "dataset": self.config.dataset,
            "clients": self.config.clients,
            "rounds": self.config.rounds,
            "max_abs_diff_vs_plain": max(self.diff_vs_plain) if self.diff_vs_plain else None,
            "accuracy": self.accuracy[-1],
            "accuracy_plain": self.accuracy_plain[-1] if self.accuracy_plain else None,
            "round_time_ratio": ratio,
            "round_s_median": float(np.median(self.round_s)),
            "epsilon_local": self.privacy.get("epsilon_local"),
            "epsilon_global": self.privacy.get("epsilon_global"),
            "noise": self.privacy.get("noise"),
            "delta": self.privacy.get("delta"),
            "n_params": self.n_params,
            "n_encoded": self.n_encoded,
            "key_bytes": self.key_bytes,
            "accuracy_per_round": self.accuracy,
            "accuracy_plain_per_round": self.accuracy_plain,
            "diff_vs_plain_per_round": self.diff_vs_plain,
            "dropped": self.dropped,
        }


def make_client(cfg: RunConfig, data: Dataset, model: FlatModel, index: int, torch: Any) -> Client:
    """Client ``index`` with its share of the training data (same split on every engine)."""
    parts = split_clients(
        data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed
    )
    idx = parts[index]
    return Client(
        index,
        torch.as_tensor(data.x_train[idx], dtype=torch.float64),
        torch.as_tensor(data.y_train[idx], dtype=torch.long),
        model,
        make_optimizer(cfg.optimizer, cfg.lr),
        cfg.local_epochs,
        cfg.batch_size,
        cfg.seed,
        cfg.clip,
    )


def build_model_for(cfg: RunConfig, data: Dataset) -> FlatModel:
    return FlatModel(
        build_model(
            cfg.model, image_shape=data.image_shape, n_classes=data.n_classes, hidden=cfg.hidden
        )
    )


@dataclass
class Server:
    """Server-side state of a run: the scheme, FedAvg beside it, the test set and the history."""

    cfg: RunConfig
    model: FlatModel
    scheme: FedAvg
    plain: FedAvg | None
    x_test: Any
    y_test: Any
    result: RunResult

    @classmethod
    def create(
        cls, cfg: RunConfig, data: Dataset, client_sizes: list[int] | None = None
    ) -> "Server":
        """Draw keys and set up the scheme; with ``client_sizes`` also calibrate the noise (else later)."""
        import torch

        if cfg.rounds < 1:
            raise InvalidArgumentError("rounds", f"expected >= 1, got {cfg.rounds}")
        check_client_noise(cfg.client_noise)
        model = build_model_for(cfg, data)
        w0 = model.initial_vector(cfg.seed)
        backend = make_backend("torch", dtype="float64", device="cpu")
        scheme = make_scheme(
            cfg.scheme,
            SchemeOptions(
                backend=backend,
                rng=np.random.default_rng([cfg.seed, 1]),
                extra=cfg.extra,
                p=cfg.p,
                epsilon_local=cfg.epsilon_local,
                clip=cfg.clip,
                kind=cfg.keys,
                block_size=cfg.block_size,
                noise="laplace" if cfg.noise == "auto" else cfg.noise,
                delta=cfg.delta,
                client_noise=cfg.client_noise,
            ),
        )
        if cfg.client_noise and not getattr(scheme, "client_noise", False):
            check_client_noise(cfg.client_noise, cfg.scheme)  # a scheme that ignored the option
        scheme.setup(w0)
        plain = FedAvg() if cfg.compare_plain and cfg.scheme != "fedavg" else None
        if plain is not None:
            plain.setup(w0)
        result = RunResult(
            cfg, n_params=model.n_params, n_encoded=scheme.n_encoded, key_bytes=scheme.key_bytes
        )
        server = cls(
            cfg,
            model,
            scheme,
            plain,
            torch.as_tensor(data.x_test, dtype=torch.float64),
            torch.as_tensor(data.y_test, dtype=torch.long),
            result,
        )
        if client_sizes is not None:
            server.calibrate(client_sizes)
        return server

    def calibrate(self, client_sizes: list[int]) -> None:
        """Design the round noise for ``epsilon_local`` and record the privacy figures (needs |D_i|)."""
        if hasattr(self.scheme, "design_noise"):
            self.scheme.design_noise(client_sizes)
        self.result.privacy = self.scheme.privacy(client_sizes)

    def record(
        self,
        t: int,
        seconds: float,
        seconds_plain: float | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        res = self.result
        res.round_s.append(seconds)
        acc, loss = self.model.evaluate(self.scheme.global_model(), self.x_test, self.y_test)
        res.accuracy.append(acc)
        res.loss.append(loss)
        if self.plain is not None and seconds_plain is not None:
            res.round_s_plain.append(seconds_plain)
            acc_p, loss_p = self.model.evaluate(self.plain.global_model(), self.x_test, self.y_test)
            res.accuracy_plain.append(acc_p)
            res.loss_plain.append(loss_p)
            res.diff_vs_plain.append(
                float((self.scheme.global_model() - self.plain.global_model()).abs().max())
            )
        if progress:
            diff = f", max|w - w_fedavg| {res.diff_vs_plain[-1]:.2e}" if res.diff_vs_plain else ""
            progress(f"round {t + 1}/{self.cfg.rounds}: accuracy {acc:.4f}{diff}")


def _round(
    scheme: FedAvg,
    clients: list[Client],
    sizes: list[int],
    t: int,
    *,
    plan: FaultPlan,
    timeout_s: float | None,
    dropped: list[dict[str, Any]],
) -> float:
    """One round; failing clients are left out and the weights renormalised over the others."""
    start = time.perf_counter()
    received = scheme.broadcast(t)
    pool = ThreadPoolExecutor(max_workers=1) if timeout_s is not None else None
    uploads, kept = [], []
    try:
        for client in clients:
            upload = run_client(
                client.index,
                t,
                lambda c=client: scheme.client_upload(c, received, t),
                plan=plan,
                timeout_s=timeout_s,
                expected_shape=scheme.upload_shape,
                dropped=dropped,
                pool=pool,
            )
            if upload is not None:
                uploads.append(upload)
                kept.append(sizes[client.index])
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    if not uploads:
        raise RuntimeError(f"round {t}: every client failed; nothing to aggregate")
    total = sum(kept)
    scheme.server_update(
        scheme.aggregate(uploads, [n / total for n in kept])
    )  # |D_i| / |D| over survivors
    return time.perf_counter() - start


def run_federated(
    cfg: RunConfig,
    *,
    engine: str = "local",
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> RunResult:
    """Run ``cfg.scheme`` for ``cfg.rounds`` rounds, with plain FedAvg in lockstep if ``compare_plain``.

    ``engine="local"`` runs the clients in this process; ``engine="flower"`` runs them as Flower
    ClientApps under Flower's simulation runtime, with the same scheme code. ``faults`` injects
    client failures (tests, demos); ``checkpoint`` saves the server state after every round and
    ``resume`` continues from it to the same result as an uninterrupted run. ``stop_after``
    ends the run after that many rounds (to simulate an interruption).
    """
    plan = faults or FaultPlan()
    from immersion.plugin_manager import registry

    runner = registry().fl_scheme(cfg.scheme).runner
    check_client_noise(cfg.client_noise, cfg.scheme if runner is not None else None)
    if cfg.client_noise and engine == "flower":
        raise InvalidArgumentError("client_noise", "only the local engine supports it")
    if runner is not None:
        if checkpoint is not None or resume or stop_after is not None:
            raise InvalidArgumentError(
                "checkpoint", f"scheme {cfg.scheme!r} does not support checkpoints yet"
            )
        return runner(cfg, engine=engine, progress=progress, faults=plan)
    if engine == "flower":
        from .flower_engine import run_flower

        return run_flower(cfg, progress=progress, faults=plan)
    if engine != "local":
        raise InvalidArgumentError("engine", f"expected 'local' or 'flower', got {engine!r}")
    import torch

    data = load_dataset(cfg.dataset, seed=cfg.seed)
    model = build_model_for(cfg, data)
    clients = [make_client(cfg, data, model, i, torch) for i in range(cfg.clients)]
    sizes = [c.n_samples for c in clients]
    server = Server.create(cfg, data, sizes)
    store = Checkpoint(Path(checkpoint), cfg) if checkpoint is not None else None
    first = 0
    if resume:
        if store is None:
            raise InvalidArgumentError("resume", "needs a checkpoint folder")
        first = store.load(server)
    for t in range(first, cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)):
        seconds = _round(
            server.scheme,
            clients,
            sizes,
            t,
            plan=plan,
            timeout_s=cfg.client_timeout,
            dropped=server.result.dropped,
        )
        seconds_plain = (
            _round(
                server.plain, clients, sizes, t, plan=plan, timeout_s=cfg.client_timeout, dropped=[]
            )
            if server.plain is not None
            else None
        )
        server.record(t, seconds, seconds_plain, progress)
        if store is not None:
            store.save(server, t + 1)
    return server.result


def codec_seconds_per_round(cfg: RunConfig, *, repeats: int = 5) -> float:
    """Time of the coding work one round adds to FedAvg, measured alone (best of ``repeats``).

    Per round: the server's noisy encode and its decode, and for every client one decode and one
    lift (seed 000 Algorithm 1); for M2 also the aggregator's coding and the clients' ``Pi2^R``.
    The wall-clock ratio of two training runs on this 2-core machine moves by +-30 % between
    runs; this figure does not depend on the training time.
    """
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    server = Server.create(cfg, data, [1] * cfg.clients)
    scheme = server.scheme
    if scheme.kit is None:
        return 0.0
    w = server.model.initial_vector(cfg.seed)

    class NoTraining:  # a client whose training is free: only the coding is timed
        @staticmethod
        def train(w_start: Any, round_t: int) -> Any:
            return w

    no_training: Any = NoTraining()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        received = scheme.broadcast(0)
        uploads = [client_upload(scheme.kit, no_training, received, 0) for _ in range(cfg.clients)]
        scheme.server_update(scheme.aggregate(uploads, [1.0 / cfg.clients] * cfg.clients))
        best = min(best, time.perf_counter() - start)
    return best


def stderr_progress(message: str) -> None:
    """Progress lines on stderr (stdout stays for --json)."""
    print(f"[fl] {message}", file=sys.stderr, flush=True)


def progress_bar(total: int) -> Callable[[str], None]:
    """A progress callback drawing a bar on stderr (one line per round when stderr is not a terminal)."""
    from immersion.progress import Progress

    bar = Progress(total, "rounds")

    def update(message: str) -> None:
        bar.step(message.split(": ", 1)[-1])
        if bar.done == bar.total:
            bar.close()

    return update
