"""Seed 001's three FedSGD schemes under secure aggregation, beside noise-free FedSGD (Fig. 5).

Every round each of the N users computes its D per-example gradients at the global model, clips
them to C and uploads one update; the server sees only the sum (secure aggregation) and steps
with ``lr`` times the mean:

* ``sgd-dp``: IID sampling of B of the D examples + isotropic ``N(0, sigma2 I)`` (Table 1 row 1);
* ``gsgd-dp``: Gaussian sampling (Assumption 2) + WF-NA noise with floor ``sigma2`` (Theorem 4);
* ``gd-dp``: the full mean + isotropic ``N(0, sigma2 I)`` (Table 1 row 3).

``sigma2`` is calibrated so that the whole run meets ``epsilon`` (total over all rounds, delta),
or given. The reference ("plain") run takes the same steps without any noise: the same batches
for ``sgd-dp``, the clipped full mean for the others. Users are trimmed to the same D (the
analysis assumes |D_i| = D).

``engine="flower"`` runs the users as Flower nodes and the sum through Flower's SecAgg+
(:mod:`immersion_secagg.flower_secagg`): a fixed-point sum (coordinates clipped to
``C + 8 sqrt(sigma2 + C^2 / B)``, 2^22 levels), so the trained model differs from the exact sum's
by the quantisation error, and the accountant's guarantee is for the exact sum, not the quantised
one (see that module). There the nodes draw their sampling and noise from OS entropy; the
reference run and the round-time ratio are computed in-process.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import InvalidArgumentError
from immersion_fl.data import load_dataset, split_clients
from immersion_fl.engine import RunConfig, RunResult, build_model_for
from immersion_fl.faults import FaultPlan

from .accountant import Guarantee, Setting, gd_guarantee, guarantee, sgd_guarantee
from .updates import (
    clip_rows,
    full_gradient_update,
    gaussian_sampling_update,
    iid_sampling_update,
    isotropic_noise,
)
from .wfna import wfna_noise

if TYPE_CHECKING:
    from torch import Tensor

    from .flower_secagg import AggregationRun

SCHEMES = ("sgd-dp", "gsgd-dp", "gd-dp")


@dataclass
class SecaggResult(RunResult):
    """A run's figures plus the privacy calibration."""

    sigma2: float = 0.0
    guarantee: Guarantee | None = None
    plain_name: str = "no noise (plain)"
    update_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        g = self.guarantee
        out.update(
            {
                "sigma2": self.sigma2,
                "epsilon": g.epsilon if g else None,
                "delta": g.delta if g else None,
                "alpha": g.alpha if g else None,
                "accountant": g.mechanism if g else None,
                "users": self.config.clients,
                "samples_per_user": self.n_encoded,
                "batch": self.config.batch_size,
                "grad_clip": self.config.grad_clip,
                "update_s_median": float(np.median(self.update_s)),
            }
        )
        out["n_encoded"] = self.n_params
        return out


def unsupported_factory(options: Any) -> Any:
    """These schemes have their own rounds: run them with run_federated or ``immersion fl run``."""
    raise InvalidArgumentError(
        "scheme", "sgd-dp, gsgd-dp and gd-dp run through run_federated / immersion fl run"
    )


def account(scheme: str, s: Setting, sigma2: float, delta: float, rounds: int) -> Guarantee:
    """``(epsilon, delta)`` of a whole run of ``scheme`` with per-user noise ``sigma2``."""
    if sigma2 <= 0:
        return Guarantee(math.inf, delta, math.nan, rounds, math.inf, f"{scheme} without noise")
    if scheme == "sgd-dp":
        return sgd_guarantee(s, sigma2, delta, rounds=rounds)
    if scheme == "gd-dp":
        return gd_guarantee(s, sigma2, delta, rounds=rounds)
    return guarantee("4", s, delta, rounds=rounds, sigma2=sigma2)


def calibrate(scheme: str, s: Setting, epsilon: float, delta: float, rounds: int) -> float:
    """The smallest ``sigma2`` (to 0.1 %) whose run meets ``epsilon`` (bisection on log sigma2)."""
    lo, hi = 1e-12, 1.0
    while account(scheme, s, hi, delta, rounds).epsilon > epsilon:
        hi *= 10
        if hi > 1e12:
            raise InvalidArgumentError(
                "epsilon",
                f"{scheme} cannot reach epsilon {epsilon} with any noise "
                f"(sigma2 <= 1e12) at grad_clip {s.clip:g}",
            )
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (
            (mid, hi) if account(scheme, s, mid, delta, rounds).epsilon > epsilon else (lo, mid)
        )
    return hi


@dataclass
class User:
    """A user's data (exactly D records) and its per-example clipped gradients at a model."""

    index: int
    x: Tensor
    y: Tensor

    def gradients(self, model: Any, w: Any, clip: float) -> np.ndarray:
        """The paper's ``G`` (K x D): per-example cross-entropy gradients, clipped to ``clip``."""
        import torch

        def loss(wv: Any, xi: Any, yi: Any) -> Any:
            return torch.nn.functional.cross_entropy(model.logits(wv, xi[None]), yi[None])

        rows = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(w, self.x, self.y)
        return clip_rows(rows.numpy(), clip).T

    def update(
        self, cfg: RunConfig, model: Any, w: Any, sigma2: float, t: int, *, secret: bool = False
    ) -> np.ndarray:
        """This user's upload in round ``t``. Its sampling and noise come from the run seed (the
        in-process simulation: reproducible, and the same batches as the reference run) or, with
        ``secret``, from OS entropy (Flower nodes: nobody else can recompute the noise)."""
        rng = (
            np.random.default_rng() if secret else np.random.default_rng([cfg.seed, t, self.index])
        )
        if cfg.scheme == "sgd-dp":  # IID sampling first: only the batch's gradients are needed
            idx = rng.choice(len(self.y), cfg.batch_size, replace=False)
            batch = User(self.index, self.x[idx], self.y[idx])
            G = batch.gradients(model, w, cfg.grad_clip)
            return user_update("gd-dp", G, cfg.batch_size, sigma2, rng)
        return user_update(
            cfg.scheme, self.gradients(model, w, cfg.grad_clip), cfg.batch_size, sigma2, rng
        )


def user_update(
    scheme: str, G: np.ndarray, batch: int, sigma2: float, rng: np.random.Generator
) -> np.ndarray:
    """One user's upload for ``scheme`` from its clipped gradients ``G`` (K x D).

    With ``sigma2 = 0`` no noise is added and, for gsgd-dp, nothing is sampled (the reference run).
    """
    if scheme == "sgd-dp":
        update = iid_sampling_update(G, batch, rng)
    elif scheme == "gsgd-dp":
        if sigma2 <= 0:
            return full_gradient_update(G)
        return gaussian_sampling_update(G, batch, rng) + wfna_noise(G, batch, sigma2, rng)
    else:
        update = full_gradient_update(G)
    return update + isotropic_noise(G.shape[0], sigma2, rng) if sigma2 > 0 else update


def run_secagg(
    cfg: RunConfig,
    *,
    engine: str = "local",
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
) -> SecaggResult:
    """Train ``cfg`` with ``cfg.scheme`` in ``SCHEMES`` beside the same run without noise."""
    import torch

    if cfg.scheme not in SCHEMES:
        raise InvalidArgumentError("scheme", f"expected one of {SCHEMES}, got {cfg.scheme!r}")
    if engine not in ("local", "flower"):
        raise InvalidArgumentError("engine", f"expected 'local' or 'flower', got {engine!r}")
    if faults is not None and faults.faults:
        raise InvalidArgumentError(
            "inject_fault",
            "seed 001's analysis assumes every user in every round; dropouts are not modelled",
        )
    if cfg.noise not in ("auto", "on", "off"):
        raise InvalidArgumentError("noise", f"{cfg.scheme} expects on or off, got {cfg.noise!r}")
    users, model, data = make_users(cfg)
    samples = len(users[0].y)
    s = Setting(cfg.clients, samples, cfg.batch_size, cfg.grad_clip)
    if cfg.noise == "off":
        sigma2 = 0.0
    else:
        sigma2 = (
            cfg.sigma2
            if cfg.sigma2 is not None
            else calibrate(cfg.scheme, s, cfg.epsilon, cfg.delta, cfg.rounds)
        )
    result = SecaggResult(
        cfg,
        n_params=model.n_params,
        n_encoded=samples,
        sigma2=sigma2,
        guarantee=account(cfg.scheme, s, sigma2, cfg.delta, cfg.rounds),
    )
    x_test = torch.as_tensor(data.x_test, dtype=torch.float64)
    y_test = torch.as_tensor(data.y_test, dtype=torch.long)
    w = model.initial_vector(cfg.seed)
    plain = w.clone()
    flower = _flower_models(cfg, w, sigma2) if engine == "flower" else None
    for t in range(cfg.rounds):
        start = time.perf_counter()
        update_s = 0.0
        if flower is not None:
            w, seconds = torch.as_tensor(flower.models[t]), flower.round_seconds[t]
        else:
            total = np.zeros(model.n_params)
            for user in users:
                tick = time.perf_counter()
                total += user.update(cfg, model, w, sigma2, t)
                update_s += time.perf_counter() - tick
            w = w - cfg.lr * torch.as_tensor(total) / cfg.clients
            seconds = time.perf_counter() - start
        start = time.perf_counter()
        total_plain = sum(user.update(cfg, model, plain, 0.0, t) for user in users)
        plain = plain - cfg.lr * torch.as_tensor(total_plain) / cfg.clients
        _record(
            result,
            model,
            w,
            plain,
            x_test,
            y_test,
            seconds,
            time.perf_counter() - start,
            update_s,
            t,
            progress,
        )
    return result


def make_users(cfg: RunConfig) -> tuple[list[User], Any, Any]:
    """The users (each trimmed to the same D records), the model and the dataset."""
    import torch

    data = load_dataset(cfg.dataset, seed=cfg.seed)
    parts = split_clients(
        data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed
    )
    samples = min(len(p) for p in parts)
    if cfg.batch_size > samples:
        raise InvalidArgumentError(
            "batch_size",
            f"expected <= the {samples} records each user holds "
            f"({len(data.y_train)} training records over {cfg.clients} users)",
        )
    users = [
        User(
            i,
            torch.as_tensor(data.x_train[p[:samples]], dtype=torch.float64),
            torch.as_tensor(data.y_train[p[:samples]], dtype=torch.long),
        )
        for i, p in enumerate(parts)
    ]
    return users, build_model_for(cfg, data), data


class NodeUpdates:
    """``updates(round, user, model)`` for :func:`immersion_secagg.flower_secagg.secagg_sum`.

    Runs on the node; builds its user from the run configuration (once per worker process).
    """

    _cache: dict[tuple[str, int], tuple[User, Any]] = {}

    def __init__(self, cfg: RunConfig, sigma2: float) -> None:
        self.cfg, self.sigma2 = cfg, sigma2

    def __call__(self, t: int, user: int, model_vector: np.ndarray) -> np.ndarray:
        import torch

        key = (repr(self.cfg), user)
        if key not in self._cache:
            users, model, _ = make_users(self.cfg)
            self._cache[key] = (users[user], model)
        node, model = self._cache[key]
        return node.update(
            self.cfg, model, torch.as_tensor(model_vector), self.sigma2, t, secret=True
        )


def _flower_models(cfg: RunConfig, w0: Tensor, sigma2: float) -> AggregationRun:
    """The run on Flower with SecAgg+: the server's model after every round (see flower_secagg)."""
    from .flower_secagg import secagg_sum

    lr = cfg.lr
    clipping_range = cfg.grad_clip + 8.0 * math.sqrt(
        max(sigma2, 0.0) + cfg.grad_clip**2 / cfg.batch_size
    )

    def step(model: np.ndarray, total: np.ndarray, contributors: list[int]) -> np.ndarray:
        return model - lr * total / len(contributors)  # FedSGD: the mean over who contributed

    return secagg_sum(
        NodeUpdates(cfg, sigma2),
        cfg.clients,
        cfg.rounds,
        clipping_range=clipping_range,
        quantization_range=2**22,
        modulus_range=2**32,
        initial=w0.numpy(),
        step=step,
    )


def _record(
    result: SecaggResult,
    model: Any,
    w: Tensor,
    plain: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    seconds: float,
    seconds_plain: float,
    update_s: float,
    t: int,
    progress: Callable[[str], None] | None,
) -> None:
    acc, loss = model.evaluate(w, x_test, y_test)
    acc_p, loss_p = model.evaluate(plain, x_test, y_test)
    result.accuracy.append(acc)
    result.loss.append(loss)
    result.accuracy_plain.append(acc_p)
    result.loss_plain.append(loss_p)
    result.round_s.append(seconds)
    result.round_s_plain.append(seconds_plain)
    result.update_s.append(update_s)
    result.diff_vs_plain.append(float((w - plain).abs().max()))
    if progress:
        progress(f"round {t + 1}/{result.config.rounds}: accuracy {acc:.4f} (no noise {acc_p:.4f})")
