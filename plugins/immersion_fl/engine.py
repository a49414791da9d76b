"""The in-process federated engine: deterministic rounds, a scheme and plain FedAvg in lockstep.

The learning problem of a run is a :class:`FederatedTask` (model, each client's data, held-out
data); :func:`task_from_config` builds one from the SDK's model and dataset names (the runner,
``immersion fl run``), :func:`immersion_fl.api.run` from a user's own module and data. The rounds
are the same either way (:func:`train_rounds`). Registered names (schemes, optimizers) are
resolved here, at the edge, never inside the scheme or optimizer modules.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from immersion import ImmersionError, InvalidArgumentError
from immersion.backends import make_backend

from .checkpoint import Checkpoint
from .client import Client
from .config import RunConfig, SchemeOptions
from .data import load_dataset, split_clients
from .faults import FaultPlan, run_client
from .models import FlatModel, build_model
from .optimizers import GradientTransformation
from .scheme import Scheme, SchemeContext
from .schemes import FedAvg, client_upload

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


class EveryClientFailedError(ImmersionError):
    """Every client of a round failed (see the logged reasons); nothing could be aggregated."""


def optimizer_by_name(name: str, lr: float) -> GradientTransformation:
    """A registered optimizer (``sgd``, ``momentum``, ``adam`` or a plugin's) with learning rate ``lr``.

    Parameters
    ----------
    name:
        The registered name.
    lr:
        The learning rate, > 0.

    Examples
    --------
    >>> import numpy as np
    >>> opt = optimizer_by_name("sgd", 0.5)
    >>> opt.update(np.array([2.0]), opt.init(np.zeros(1)), None)[0].tolist()
    [-1.0]
    """
    from immersion.plugin_manager import registry

    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise InvalidArgumentError("lr", f"expected lr > 0, got {lr!r}")
    return registry().optimizer(name).factory(lr)


def make_scheme(name: str, options: SchemeOptions, context: SchemeContext) -> Scheme:
    """A fresh weight-averaging scheme by its registered name (plugins may add schemes).

    Parameters
    ----------
    name:
        The registered name.
    options:
        The scheme's own options (its ``SchemeSpec.options`` class).
    context:
        Backend and key generator.
    """
    from immersion.plugin_manager import registry

    spec = registry().fl_scheme(name)
    if spec.factory is None:
        raise InvalidArgumentError(
            "scheme", f"{name!r} runs its own rounds; run it with run_federated or immersion_fl.run"
        )
    if type(options) is not spec.options:
        raise InvalidArgumentError(
            "options", f"{name!r} takes {spec.options.__name__}, got {type(options).__name__}"
        )
    return spec.factory(options, context)


@dataclass
class FederatedTask:
    """The learning problem of a run.

    Parameters
    ----------
    model:
        The model as a function of a flat parameter vector.
    client_data:
        Each client's ``(x_i, y_i)`` tensors (targets: class indices or probability rows).
    w0:
        The initial flat parameter vector.
    test:
        Held-out ``(x, y)`` to report accuracy on every round, or None.
    shuffle:
        A fresh batch order every epoch (True) or in-order batches (False).
    """

    model: FlatModel
    client_data: list[tuple[Any, Any]]
    w0: Any
    test: tuple[Any, Any] | None = None
    shuffle: bool = True
    device: str = "cpu"

    def to(self, device: str) -> "FederatedTask":
        """The task with its model, data and initial vector on ``device`` (e.g. ``"cuda"``)."""
        move = lambda pair: (pair[0].to(device), pair[1].to(device))  # noqa: E731
        self.model.module.to(device)
        return FederatedTask(
            FlatModel(self.model.module),
            [move(p) for p in self.client_data],
            self.w0.to(device),
            move(self.test) if self.test is not None else None,
            self.shuffle,
            str(device),
        )

    @property
    def sizes(self) -> list[int]:
        """|D_i| of every client."""
        return [int(len(y)) for _, y in self.client_data]

    def client(
        self, cfg: RunConfig, index: int, optimizer: GradientTransformation, clip: float | None
    ) -> Client:
        """Client ``index`` training with ``optimizer`` under ``cfg``'s epochs, batches and seed."""
        x, y = self.client_data[index]
        return Client(
            index,
            x,
            y,
            self.model,
            optimizer,
            cfg.local_epochs,
            cfg.batch_size,
            cfg.seed,
            clip,
            self.shuffle,
        )

    def clients(self, cfg: RunConfig, clip: float | None) -> list[Client]:
        """Every client (the same objects serve the scheme and its plain twin: same batches)."""
        optimizer = optimizer_by_name(cfg.optimizer, cfg.lr)
        return [self.client(cfg, i, optimizer, clip) for i in range(len(self.client_data))]


def task_from_config(cfg: RunConfig) -> FederatedTask:
    """The runner's task: ``cfg.model`` on ``cfg.dataset`` split over ``cfg.clients`` clients,
    initial weights from ``cfg.seed`` (the same on every engine). Either may name user code as
    ``package.module:function`` (:func:`user_task`)."""
    import torch

    if uses_user_code(cfg):
        return user_task(cfg)
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    model = FlatModel(
        build_model(
            cfg.model, image_shape=data.image_shape, n_classes=data.n_classes, hidden=cfg.hidden
        )
    )
    parts = split_clients(
        data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed
    )
    client_data = [
        (
            torch.as_tensor(data.x_train[idx], dtype=torch.float64),
            torch.as_tensor(data.y_train[idx], dtype=torch.long),
        )
        for idx in parts
    ]
    test = (
        torch.as_tensor(data.x_test, dtype=torch.float64),
        torch.as_tensor(data.y_test, dtype=torch.long),
    )
    return FederatedTask(model, client_data, model.initial_vector(cfg.seed), test)


def uses_user_code(cfg: RunConfig) -> bool:
    """Whether ``cfg.model`` or ``cfg.dataset`` is an import path to the user's code."""
    from immersion.imports import is_import_path

    return is_import_path(cfg.model) or _user_dataset(cfg.dataset)


def _user_dataset(name: str) -> bool:
    """An import path, not one of the SDK's ``mnist:PATH`` / ``fashion:PATH`` IDX folders."""
    from immersion.imports import is_import_path

    return is_import_path(name) and name.partition(":")[0] not in ("mnist", "fashion")


def user_task(cfg: RunConfig) -> FederatedTask:
    """A task from the user's code: ``--model pkg.mod:build`` (called with no arguments under
    ``torch.manual_seed(cfg.seed)``; returns a float64 ``nn.Module``) and ``--dataset pkg.mod:load``
    (called with no arguments; returns ``(X, Y)`` or ``(X, Y, X_test, Y_test)``, ``Y`` as class
    indices or probability rows), split over ``cfg.clients`` clients by ``cfg.split``. The SDK's
    names may be mixed in: an SDK dataset with a user model, or the reverse."""
    import torch
    from immersion.imports import call_loader, is_import_path

    from .api import check_module, client_tensors

    if _user_dataset(cfg.dataset):
        loaded = call_loader(cfg.dataset, argument="dataset")
        if not isinstance(loaded, (tuple, list)) or len(loaded) not in (2, 4):
            raise InvalidArgumentError(
                "dataset", f"{cfg.dataset} must return (X, Y) or (X, Y, X_test, Y_test)"
            )
        x, y = client_tensors(-1, tuple(loaded[:2]), argument="dataset")
        test = (
            client_tensors(-1, tuple(loaded[2:]), argument="dataset") if len(loaded) == 4 else None
        )
    else:
        data = load_dataset(cfg.dataset, seed=cfg.seed)
        x, y = (
            torch.as_tensor(data.x_train, dtype=torch.float64),
            torch.as_tensor(data.y_train, dtype=torch.long),
        )
        test = (
            torch.as_tensor(data.x_test, dtype=torch.float64),
            torch.as_tensor(data.y_test, dtype=torch.long),
        )
    if is_import_path(cfg.model):
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            module = call_loader(cfg.model, argument="model")
        check_module(module)
        model = FlatModel(module)
        w0 = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    else:
        n_classes = int(y.shape[1]) if y.ndim == 2 else int(y.max()) + 1
        image_shape = tuple(x.shape[1:]) if x.ndim == 4 else (1, 1, int(np.prod(x.shape[1:])))
        model = FlatModel(
            build_model(
                cfg.model,
                image_shape=image_shape,
                n_classes=n_classes,  # type: ignore[arg-type]
                hidden=cfg.hidden,
            )
        )
        w0 = model.initial_vector(cfg.seed)
    labels = (y.argmax(1) if y.ndim == 2 else y).numpy()
    parts = split_clients(labels, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed)
    return FederatedTask(model, [(x[idx], y[idx]) for idx in parts], w0, test)


@dataclass
class RunResult:
    """Per-round figures of one run (and of the plain reference run beside it)."""

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
    final_model: Any = None

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
            "accuracy": self.accuracy[-1] if self.accuracy else None,
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


@dataclass
class Server:
    """Server-side state of a run: the scheme, FedAvg beside it, the held-out data and the history."""

    cfg: RunConfig
    model: FlatModel
    scheme: Scheme
    plain: Scheme | None
    test: tuple[Any, Any] | None
    result: RunResult

    @classmethod
    def create(
        cls,
        cfg: RunConfig,
        task: FederatedTask,
        client_sizes: list[int] | None = None,
        *,
        device: str | None = None,
    ) -> "Server":
        """Draw keys and set up the scheme; with ``client_sizes`` also calibrate the noise (else later)."""
        backend = make_backend("torch", dtype="float64", device=device or "cpu")
        context = SchemeContext(backend=backend, rng=np.random.default_rng([cfg.seed, 1]))
        scheme = make_scheme(cfg.scheme, cfg.options, context)
        w0 = backend.asarray(task.w0)
        scheme.setup(w0)
        plain = FedAvg() if cfg.compare_plain and cfg.scheme != "fedavg" else None
        if plain is not None:
            plain.setup(w0)
        result = RunResult(
            cfg,
            n_params=task.model.n_params,
            n_encoded=scheme.n_encoded,
            key_bytes=scheme.key_bytes,
        )
        server = cls(cfg, task.model, scheme, plain, task.test, result)
        if client_sizes is not None:
            server.calibrate(client_sizes)
        return server

    def calibrate(self, client_sizes: list[int]) -> None:
        """Design the round noise and record the privacy figures (needs the clients' |D_i|)."""
        self.scheme.design_noise(client_sizes)
        self.result.privacy = self.scheme.privacy(client_sizes)

    def record(
        self,
        t: int,
        seconds: float,
        seconds_plain: float | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        """The round's figures: accuracy (with held-out data), distance to the plain twin."""
        res = self.result
        res.round_s.append(seconds)
        if self.test is not None:
            acc, loss = self.model.evaluate(self.scheme.global_model(), *self.test)
            res.accuracy.append(acc)
            res.loss.append(loss)
        if self.plain is not None and seconds_plain is not None:
            res.round_s_plain.append(seconds_plain)
            if self.test is not None:
                acc_p, loss_p = self.model.evaluate(self.plain.global_model(), *self.test)
                res.accuracy_plain.append(acc_p)
                res.loss_plain.append(loss_p)
            res.diff_vs_plain.append(
                float((self.scheme.global_model() - self.plain.global_model()).abs().max())
            )
        if progress:
            acc_text = f"accuracy {res.accuracy[-1]:.4f}" if res.accuracy else "done"
            diff = f", max|w - w_fedavg| {res.diff_vs_plain[-1]:.2e}" if res.diff_vs_plain else ""
            progress(f"round {t + 1}/{self.cfg.rounds}: {acc_text}{diff}")


def _round(
    scheme: Scheme,
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
        raise EveryClientFailedError(f"round {t}: every client failed; nothing to aggregate")
    total = sum(kept)
    scheme.server_update(
        scheme.aggregate(uploads, [n / total for n in kept])
    )  # |D_i| / |D| over survivors
    return time.perf_counter() - start


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
    twin in lockstep on the same clients and batches; checkpoint after every round if ``store``."""
    cfg, plan = server.cfg, plan or FaultPlan()
    sizes = [c.n_samples for c in clients]
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    for t in range(first, last):
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
) -> RunResult:
    """Run ``cfg.scheme`` for ``cfg.rounds`` rounds, with plain FedAvg in lockstep if ``compare_plain``.

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
    """
    from immersion.plugin_manager import registry

    plan = faults or FaultPlan()
    spec = registry().fl_scheme(cfg.scheme)
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
        from .flower_engine import run_flower

        if checkpoint is not None or resume or stop_after is not None:
            raise InvalidArgumentError("checkpoint", "checkpoints work with engine='local'")
        return run_flower(cfg, progress=progress, faults=plan, task=task)
    if engine != "local":
        raise InvalidArgumentError("engine", f"expected 'local' or 'flower', got {engine!r}")
    task = task or task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes, device=task.device)
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    store = Checkpoint(Path(checkpoint), cfg) if checkpoint is not None else None
    first = 0
    if resume:
        if store is None:
            raise InvalidArgumentError("resume", "needs a checkpoint folder")
        first = store.load(server)
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
    The wall-clock ratio of two training runs on this 2-core machine moves by +-30 % between
    runs; this figure does not depend on the training time.
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
        def train(w_start: Any, round_t: int) -> Any:
            return w

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        received = scheme.broadcast(0)
        uploads = [client_upload(scheme.kit, NoTraining(), received, 0) for _ in range(cfg.clients)]
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
