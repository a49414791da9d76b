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

``engine="flower"`` runs the users as Flower nodes and, by default (``secure_sum="core"``), the
sum through the SDK's secure sum (:mod:`immersion_secagg.core_flower`: cryptographic pairwise
masks, a sum within ``N 2^-61`` of the exact one). ``secure_sum="secagg+"`` uses Flower's SecAgg+
instead (:mod:`immersion_secagg.flower_secagg`): a fixed-point sum (coordinates clipped to
``C + 8 sqrt(sigma2 + C^2 / B)``, 2^22 levels), so the trained model differs from the exact sum's
by the quantisation error, the accountant's guarantee is for the exact sum, not the quantised
one, and every mask comes from a 32-bit Mersenne Twister seed (audit row ``secagg-mask-seed``).
The nodes draw their sampling and noise from OS entropy; the reference run and the round-time
ratio are computed in-process. The local engine sums the updates in process (a simulation).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import InvalidArgumentError
from immersion_fl.runtime.engine import FederatedTask, RunConfig, RunResult
from immersion_fl.runtime.faults import FaultPlan
from immersion_fl.runtime.optimizers import (
    EmptyState,
    sgd,
)

from .accountant import Guarantee, Setting, gd_guarantee, guarantee, sgd_guarantee
from .users import NodeUpdates, make_users, options_of, users_from_task

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
                "grad_clip": options_of(self.config).grad_clip,
                "update_s_median": float(np.median(self.update_s)),
            }
        )
        out["n_encoded"] = self.n_params
        return out


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


def run_secagg(
    cfg: RunConfig,
    *,
    engine: str = "local",
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    task: FederatedTask | None = None,
) -> SecaggResult:
    """Train ``cfg`` with ``cfg.scheme`` in ``SCHEMES`` beside the same run without noise; with
    ``task``, on a user's module and data (every user must hold the same number of records)."""
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
    opt = options_of(cfg)
    setup_start = time.perf_counter()  # users, model, noise calibration and accounting
    if task is not None:
        check_task(cfg, task, engine)
        users, model, test = users_from_task(task), task.model, task.test
        w = task.w0.clone()
    else:
        users, model, data = make_users(cfg)
        test = (
            torch.as_tensor(data.x_test, dtype=torch.float64),
            torch.as_tensor(data.y_test, dtype=torch.long),
        )
        w = model.initial_vector(cfg.seed)
    samples = len(users[0].y)
    s = Setting(cfg.clients, samples, cfg.batch_size, opt.grad_clip)
    if opt.noise == "off":
        sigma2 = 0.0
    else:
        sigma2 = (
            opt.sigma2
            if opt.sigma2 is not None
            else calibrate(cfg.scheme, s, opt.epsilon, opt.delta, cfg.rounds)
        )
    result = SecaggResult(
        cfg,
        n_params=model.n_params,
        n_encoded=samples,
        sigma2=sigma2,
        guarantee=account(cfg.scheme, s, sigma2, opt.delta, cfg.rounds),
    )
    plain = w.clone()
    result.setup_s = time.perf_counter() - setup_start
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
            w = server_step(w, total, cfg)
            seconds = time.perf_counter() - start
        start = time.perf_counter()
        total_plain = sum(user.update(cfg, model, plain, 0.0, t) for user in users)
        plain = server_step(plain, total_plain, cfg)
        _record(
            result,
            model,
            w,
            plain,
            test,
            seconds,
            time.perf_counter() - start,
            update_s,
            t,
            progress,
        )
    result.final_model = w
    return result


def server_step(w: Any, total: np.ndarray, cfg: RunConfig) -> Any:
    """FedSGD's server: ``sgd(lr)`` on the mean of the users' uploads."""
    import torch

    step, _ = sgd(cfg.lr).update(torch.as_tensor(total) / cfg.clients, EmptyState(), w)
    return w + step


def check_task(cfg: RunConfig, task: FederatedTask, engine: str) -> None:
    """What seed 001's analysis needs from a user's run: FedSGD (one clipped-gradient update per
    user and round, ``optimizer="sgd"``, ``local_epochs=1``), the same number of records ``D`` at
    every user, IID sampling for sgd-dp, and the local engine (the Flower engine's users load the
    SDK's datasets)."""
    if cfg.optimizer != "sgd" or cfg.local_epochs != 1:
        raise InvalidArgumentError(
            "optimizer",
            f"{cfg.scheme} is FedSGD (seed 001): use optimizer='sgd' and "
            f"local_epochs=1, got {cfg.optimizer!r} and {cfg.local_epochs}",
        )
    sizes = task.sizes
    if len(set(sizes)) != 1:
        raise InvalidArgumentError(
            "client_data",
            f"seed 001's analysis assumes every user holds the same number "
            f"of records D; got {sizes}",
        )
    if cfg.batch_size > sizes[0]:
        raise InvalidArgumentError(
            "batch_size", f"expected <= the {sizes[0]} records each user holds"
        )
    if cfg.scheme == "sgd-dp" and not task.shuffle:
        raise InvalidArgumentError(
            "shuffle", "sgd-dp's guarantee rests on IID sampling of each batch"
        )
    if engine != "local":
        raise InvalidArgumentError(
            "engine", "a user's model and data run on engine='local' for these schemes"
        )


def _flower_models(cfg: RunConfig, w0: Tensor, sigma2: float) -> AggregationRun:
    """The run on Flower with SecAgg+: the server's model after every round (see flower_secagg)."""
    from .flower_secagg import secagg_sum

    lr = cfg.lr
    clip = options_of(cfg).grad_clip
    clipping_range = clip + 8.0 * math.sqrt(max(sigma2, 0.0) + clip**2 / cfg.batch_size)

    def step(model: np.ndarray, total: np.ndarray, contributors: list[int]) -> np.ndarray:
        return model - lr * total / len(contributors)  # FedSGD: the mean over who contributed

    if options_of(cfg).secure_sum == "core":
        from .core_flower import core_secure_models

        return core_secure_models(cfg, w0.numpy(), sigma2, step=step)
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
    test: tuple[Tensor, Tensor] | None,
    seconds: float,
    seconds_plain: float,
    update_s: float,
    t: int,
    progress: Callable[[str], None] | None,
) -> None:
    if test is not None:
        acc, loss = model.evaluate(w, *test)
        acc_p, loss_p = model.evaluate(plain, *test)
        result.accuracy.append(acc)
        result.loss.append(loss)
        result.accuracy_plain.append(acc_p)
        result.loss_plain.append(loss_p)
    result.round_s.append(seconds)
    result.round_s_plain.append(seconds_plain)
    result.update_s.append(update_s)
    result.diff_vs_plain.append(float((w - plain).abs().max()))
    if progress:
        figures = f"accuracy {acc:.4f} (no noise {acc_p:.4f})" if test is not None else "done"
        progress(f"round {t + 1}/{result.config.rounds}: {figures}")
