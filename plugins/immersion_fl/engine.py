"""The in-process federated engine: deterministic rounds, a scheme and plain FedAvg in lockstep."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from immersion import InvalidArgumentError
from immersion.backends import make_backend

from .client import Client
from .data import Dataset, load_dataset, split_clients
from .models import FlatModel, build_model
from .optimizers import make_optimizer
from .schemes import FedAvg, make_scheme


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
    clip: float = 1000.0
    keys: str = "auto"
    block_size: int = 32
    compare_plain: bool = True


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

    def summary(self) -> dict[str, Any]:
        """The JSON object of ``immersion fl run --json``."""
        ratio = (float(np.median(self.round_s) / np.median(self.round_s_plain))
                 if self.round_s_plain else None)
        return {
            "scheme": self.config.scheme, "optimizer": self.config.optimizer, "model": self.config.model,
            "dataset": self.config.dataset, "clients": self.config.clients, "rounds": self.config.rounds,
            "max_abs_diff_vs_plain": max(self.diff_vs_plain) if self.diff_vs_plain else None,
            "accuracy": self.accuracy[-1], "accuracy_plain": self.accuracy_plain[-1] if self.accuracy_plain else None,
            "round_time_ratio": ratio, "round_s_median": float(np.median(self.round_s)),
            "epsilon_local": self.privacy.get("epsilon_local"), "epsilon_global": self.privacy.get("epsilon_global"),
            "n_params": self.n_params, "n_encoded": self.n_encoded, "key_bytes": self.key_bytes,
            "accuracy_per_round": self.accuracy, "accuracy_plain_per_round": self.accuracy_plain,
            "diff_vs_plain_per_round": self.diff_vs_plain,
        }


def _clients(cfg: RunConfig, data: Dataset, model: FlatModel, torch: Any) -> list[Client]:
    parts = split_clients(data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed)
    x = torch.as_tensor(data.x_train, dtype=torch.float64)
    y = torch.as_tensor(data.y_train, dtype=torch.long)
    return [Client(i, x[idx], y[idx], model, make_optimizer(cfg.optimizer, cfg.lr), cfg.local_epochs,
                   cfg.batch_size, cfg.seed, cfg.clip) for i, idx in enumerate(parts)]


def _round(scheme: FedAvg, clients: list[Client], weights: list[float], t: int) -> float:
    start = time.perf_counter()
    received = scheme.broadcast(t)
    uploads = [scheme.client_upload(c, received, t) for c in clients]
    scheme.server_update(scheme.aggregate(uploads, weights))
    return time.perf_counter() - start


def run_federated(cfg: RunConfig, *, progress: Callable[[str], None] | None = None) -> RunResult:
    """Run ``cfg.scheme`` for ``cfg.rounds`` rounds, with plain FedAvg in lockstep if ``compare_plain``."""
    import torch

    if cfg.rounds < 1:
        raise InvalidArgumentError("rounds", f"expected >= 1, got {cfg.rounds}")
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    model = FlatModel(build_model(cfg.model, image_shape=data.image_shape, n_classes=data.n_classes,
                                  hidden=cfg.hidden))
    clients = _clients(cfg, data, model, torch)
    total = sum(c.n_samples for c in clients)
    weights = [c.n_samples / total for c in clients]                 # |D_i| / |D| (eq. 2)
    w0 = model.initial_vector(cfg.seed)
    backend = make_backend("torch", dtype="float64", device="cpu")
    scheme = make_scheme(cfg.scheme, backend=backend, rng=np.random.default_rng([cfg.seed, 1]), extra=cfg.extra,
                         p=cfg.p, epsilon_local=cfg.epsilon_local, clip=cfg.clip, kind=cfg.keys,
                         block_size=cfg.block_size)
    scheme.setup(w0)
    if hasattr(scheme, "design_noise"):
        scheme.design_noise(clients)
    plain = FedAvg() if cfg.compare_plain and cfg.scheme != "fedavg" else None
    if plain is not None:
        plain.setup(w0)
    x_test = torch.as_tensor(data.x_test, dtype=torch.float64)
    y_test = torch.as_tensor(data.y_test, dtype=torch.long)
    result = RunResult(cfg, n_params=model.n_params, n_encoded=scheme.n_encoded, key_bytes=scheme.key_bytes,
                       privacy=scheme.privacy(clients))
    for t in range(cfg.rounds):
        result.round_s.append(_round(scheme, clients, weights, t))
        acc, loss = model.evaluate(scheme.global_model(), x_test, y_test)
        result.accuracy.append(acc)
        result.loss.append(loss)
        if plain is not None:
            result.round_s_plain.append(_round(plain, clients, weights, t))
            acc_p, loss_p = model.evaluate(plain.global_model(), x_test, y_test)
            result.accuracy_plain.append(acc_p)
            result.loss_plain.append(loss_p)
            result.diff_vs_plain.append(float((scheme.global_model() - plain.global_model()).abs().max()))
        if progress:
            diff = f", max|w - w_fedavg| {result.diff_vs_plain[-1]:.2e}" if plain is not None else ""
            progress(f"round {t + 1}/{cfg.rounds}: accuracy {acc:.4f}{diff}")
    return result


def stderr_progress(message: str) -> None:
    """Progress lines on stderr (stdout stays for --json)."""
    print(f"[fl] {message}", file=sys.stderr, flush=True)
