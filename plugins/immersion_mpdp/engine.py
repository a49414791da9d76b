"""The in-process MP-DP engine: rounds of Algorithm 4 beside plain FedSGD with the same batches.

Plain FedSGD here is the reference the scheme must reproduce with noise off: every client takes
one gradient of the MSE loss on its round batch at the true model, the server averages them
without weights (1/K, as the paper) and steps with the learning rate.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable

import numpy as np
from immersion import InvalidArgumentError
from immersion.securesum.protocol import FixedPointRangeError
from immersion.securesum.round import RoundOutcome, RoundRecords, RoundTransport, run_round
from immersion_fl.runtime.data import load_dataset, split_clients
from immersion_fl.runtime.engine import EveryClientFailedError, FederatedTask, RunConfig, RunResult
from immersion_fl.runtime.faults import FaultPlan
from immersion_fl.runtime.secure import SecureAggregationError

from .agreement import (
    RoundGraph,
    components,
    edges_of,
    resolve_mask_graph,
)
from .calibration import Calibration, calibrate, resolve_noise_graph
from .ddp import Layout, NoiseSettings, Upload
from .mlp import (
    accuracy,
    init_weights,
    layer_sizes,
    mse_gradient,
    mse_loss,
    per_sample_gradient_norms,
    torch_module,
    weights_from_module,
)
from .options import MpdpOptions
from .protocol import MpdpClient, MpdpServer

LOG = logging.getLogger("immersion.fl")
MAX_ATTEMPTS = 3


class TrainingDivergedError(RuntimeError):
    """The model's test loss became non-finite (too much noise for the learning rate)."""


@dataclass
class MpdpResult(RunResult):
    """A run's figures plus MP-DP's own: sizes, privacy calibration, timings, aborted rounds."""

    upload_bytes: list[int] = field(default_factory=list)
    upload_bytes_plain: int = 0
    broadcast_bytes: int = 0
    broadcast_bytes_plain: int = 0
    calibration: Calibration | None = None
    sensitivity_observed: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(default_factory=dict)
    weights: list[Any] = field(default_factory=list)  # the server's final model (never sent)
    plain_name: str = "fedsgd (plain)"
    graphs: dict[str, str] = field(default_factory=dict)  # resolved: noise ("graph"), masks

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        cfg, cal = self.config, self.calibration
        releases = len(self.accuracy) + len(
            self.aborted
        )  # an aborted attempt's uploads were seen too
        out.update(
            {
                "noise": "on" if cal is not None else "off",
                "graph": self.graphs.get("graph", options_of(cfg).graph),
                "mask_graph": self.graphs.get("mask_graph", options_of(cfg).mask_graph),
                "mask_corrections": options_of(cfg).mask_corrections,
                "upload_bytes_per_client": float(np.mean(self.upload_bytes))
                if self.upload_bytes
                else None,
                "upload_bytes_ratio": (
                    float(np.mean(self.upload_bytes)) / self.upload_bytes_plain
                    if self.upload_bytes
                    else None
                ),
                "broadcast_bytes_ratio": self.broadcast_bytes / self.broadcast_bytes_plain,
                "epsilon": cal.epsilon if cal else None,
                "delta": cal.delta if cal else None,
                "epsilon_total": cal.epsilon * releases if cal else None,
                "delta_total": cal.delta * releases if cal else None,
                "releases": releases,
                "composition": "basic, over rounds" if cal else None,
                "theorem": cal.theorem if cal else None,
                "theta_reading": cal.reading if cal else None,
                "sigma_eta": cal.sigma_eta if cal else None,
                "sigma_delta": cal.sigma_delta if cal else None,
                "sensitivity_assumed": options_of(cfg).sensitivity if cal else None,
                "sensitivity_observed_max": max(self.sensitivity_observed)
                if self.sensitivity_observed
                else None,
                "phase_s_median": {k: float(np.median(v)) for k, v in self.phase_s.items()},
                "aborted_rounds": self.aborted,
                "loss": self.loss[-1] if self.loss else None,
                "loss_plain": self.loss_plain[-1] if self.loss_plain else None,
            }
        )
        return out


def validate(cfg: RunConfig, task: FederatedTask | None = None) -> None:
    """Refuse options MP-DP does not support, naming them."""
    if task is None and cfg.model != "mlp":
        raise InvalidArgumentError(
            "model", f"mpdp covers bias-free ReLU MLPs only (seed 004), got {cfg.model!r}"
        )
    if cfg.optimizer != "sgd":
        raise InvalidArgumentError(
            "optimizer",
            "mpdp is FedSGD: the server steps with the recovered mean gradient "
            f"(Algorithm 3); got {cfg.optimizer!r}",
        )
    if cfg.local_epochs != 1:
        raise InvalidArgumentError(
            "local_epochs",
            "mpdp takes one gradient per client per round (Theorem 4 holds "
            f"only at the received model); got {cfg.local_epochs}",
        )
    if cfg.clients < 2:
        raise InvalidArgumentError("clients", f"mpdp needs >= 2 clients, got {cfg.clients}")


def options_of(cfg: RunConfig) -> MpdpOptions:
    """``cfg.options``, typed (RunConfig has checked it is MP-DP's)."""
    assert isinstance(cfg.options, MpdpOptions)
    return cfg.options


def noise_settings(cfg: RunConfig) -> tuple[NoiseSettings, Calibration | None]:
    opt = options_of(cfg)
    if opt.noise == "off":
        return NoiseSettings(
            mask_corrections=opt.mask_corrections, words=opt.correction_words
        ), None
    cal = calibrate(opt.epsilon, opt.delta, cfg.clients, opt.graph, sensitivity=opt.sensitivity)
    return (
        NoiseSettings(cal.sigma_eta, cal.sigma_delta, opt.mask_corrections, opt.correction_words),
        cal,
    )


@dataclass
class Setup:
    """Everything both engines build the same way from a RunConfig."""

    cfg: RunConfig
    sizes: tuple[int, ...]
    clients: list[MpdpClient]
    x_test: Any
    y_test: Any
    n_classes: int
    w0: list[Any]


def make_setup(cfg: RunConfig, task: FederatedTask | None = None) -> Setup:
    """Clients, layer sizes, initial weights and held-out data: from the SDK's dataset and
    ``cfg.hidden``, or from a user's task (its module must be a bias-free ReLU MLP)."""
    if task is not None:
        return _setup_from_task(cfg, task)
    torch = torch_module()
    data = load_dataset(cfg.dataset, seed=cfg.seed)
    x = torch.as_tensor(data.x_train.reshape(len(data.x_train), -1), dtype=torch.float64)
    y = torch.as_tensor(data.y_train, dtype=torch.long)
    parts = split_clients(
        data.y_train, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed
    )
    clients = [
        MpdpClient(i, x[idx], y[idx], data.n_classes, cfg.batch_size, cfg.seed)
        for i, idx in enumerate(parts)
    ]
    sizes = layer_sizes(x.shape[1], cfg.hidden, data.n_classes)
    x_test = torch.as_tensor(data.x_test.reshape(len(data.x_test), -1), dtype=torch.float64)
    y_test = torch.as_tensor(data.y_test, dtype=torch.long)
    return Setup(cfg, sizes, clients, x_test, y_test, data.n_classes, init_weights(sizes, cfg.seed))


def _setup_from_task(cfg: RunConfig, task: FederatedTask) -> Setup:
    try:
        weights = weights_from_module(task.model.module)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError("model", f"mpdp: {str(exc).partition(': ')[2]}") from None
    sizes = (int(weights[0].shape[1]), *(int(w.shape[0]) for w in weights))
    n_classes = sizes[-1]

    def flat(x: Any, where: str) -> Any:
        x = x.reshape(len(x), -1)
        if x.shape[1] != sizes[0]:
            raise InvalidArgumentError(
                "client_data",
                f"{where}: samples have {x.shape[1]} features, the "
                f"model's first layer takes {sizes[0]}",
            )
        return x

    clients = [
        MpdpClient(
            i,
            flat(x, f"client {i}"),
            _labels(y, n_classes, f"client {i}"),
            n_classes,
            cfg.batch_size,
            cfg.seed,
            shuffle=task.shuffle,
        )
        for i, (x, y) in enumerate(task.client_data)
    ]
    x_test, y_test = (
        (flat(task.test[0], "test_data"), _labels(task.test[1], n_classes, "test_data"))
        if task.test is not None
        else (None, None)
    )
    return Setup(cfg, sizes, clients, x_test, y_test, n_classes, weights)


def _labels(y: Any, n_classes: int, where: str) -> Any:
    """Class indices from labels or one-hot rows (MP-DP trains the MSE to one-hot targets, seed
    004)."""
    torch = torch_module()
    if y.ndim == 2:
        if y.shape[1] != n_classes or not bool(
            ((y == 0) | (y == 1)).all() and (y.sum(1) == 1).all()
        ):
            raise InvalidArgumentError(
                "client_data",
                f"{where}: mpdp trains the MSE to one-hot targets (seed 004); "
                f"Y must be labels or one-hot rows of width {n_classes}",
            )
        y = y.argmax(1)
    if bool((y >= n_classes).any()):
        raise InvalidArgumentError(
            "client_data", f"{where}: labels must be < {n_classes} (the model's outputs)"
        )
    return y.to(torch.long)


def upload_problem(upload: Any, layout: Layout, masked: bool, words: int = 2) -> str | None:
    """Why an upload cannot be aggregated, or None."""
    if not isinstance(upload, Upload):
        return f"not an upload ({type(upload).__name__})"
    if upload.gradient.shape != (layout.gradient_size,):
        return f"gradient of shape {upload.gradient.shape}, expected ({layout.gradient_size},)"
    want = (words * layout.correction_size,) if masked else (layout.correction_size,)
    if upload.corrections.shape != want or upload.corrections.dtype != (
        np.uint64 if masked else np.float64
    ):
        return (
            f"corrections of shape {upload.corrections.shape} ({upload.corrections.dtype}), "
            f"expected {want}"
        )
    if not _all_finite(upload.gradient) or (not masked and not _all_finite(upload.corrections)):
        return "contains NaN or inf"
    return None


def _all_finite(values: np.ndarray) -> bool:
    """Every value finite: a finite sum proves it (NaN and inf propagate); an overflowing sum of
    finite values falls back to the element-wise test."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add.reduce(values)
    return bool(np.isfinite(total)) or bool(np.isfinite(values).all())


def apply_fault(kind: str | None, work: Callable[[], Upload]) -> Upload:
    """A client's upload with an injected fault (tests, demos); ``no-recovery`` acts at reveal."""
    if kind == "raise":
        raise RuntimeError("injected fault: client crashed after the key agreement")
    if kind == "timeout":
        raise TimeoutError("injected fault: no answer before the round deadline")
    upload = work()
    if kind == "malformed":
        grad = upload.gradient.copy()
        grad[0] = np.nan
        return Upload(grad, upload.corrections)
    if kind == "wrong-shape":
        return Upload(upload.gradient[:-1], upload.corrections)
    return upload


def graph_split(graph: RoundGraph, survivors: Iterable[int]) -> str | None:
    """Why the survivors' graph cannot be unmasked, or None: after a dropout, the edges of one
    purpose among the survivors must still connect them all, or the revealed seeds would give
    the server the sum of each part (one client alone: its upload)."""
    alive = sorted(survivors)
    for purpose, name in (("mask", "masks"), ("delta", "pairwise noise")):
        edges = edges_of(graph, purpose)
        if not any(edges.values()):
            continue
        parts = components(edges, alive)
        if len(parts) > 1:
            shown = "; ".join(", ".join(map(str, p)) for p in parts)
            return f"without the dropped clients the graph of the {name} falls apart ({shown})"
    return None


def mpdp_round(
    server: MpdpServer,
    clients: dict[int, MpdpClient],
    members: list[int],
    t: int,
    *,
    plan: FaultPlan,
    dropped: list[dict[str, Any]],
    aborted: list[dict[str, Any]],
    phase_s: dict[str, float],
) -> tuple[list[int], list[Upload]]:
    """One round of Algorithm 4 with dropout recovery; retried (fresh keys) if recovery fails.

    Returns the clients whose gradients were aggregated and their uploads.
    """
    transport = LocalMpdp(server, clients, t, plan, phase_s)
    outcome = run_round(
        transport,
        members,
        RoundRecords(t, dropped, aborted),
        max_attempts=MAX_ATTEMPTS,
        too_few=EveryClientFailedError,
        given_up=lambda: given_up(t),
        split=graph_split,
        name_dropped=True,
    )
    finish(server, outcome, phase_s)
    for k in outcome.members:
        clients[k].forget(t)
    server.noise = transport.one_word  # two words were for this round only
    return outcome.contributors, [outcome.uploads[k] for k in outcome.contributors]


def given_up(t: int) -> SecureAggregationError:
    """The error of a round aborted :data:`MAX_ATTEMPTS` times (read when raised)."""
    return SecureAggregationError(
        f"round {t}: aborted {MAX_ATTEMPTS} times; see the log for the clients that did not answer"
    )


def finish(server: MpdpServer, outcome: RoundOutcome, phase_s: dict[str, float]) -> None:
    """Phase 5 on the server: aggregate and recover (timed as ``server_recover``)."""
    tick = time.perf_counter()
    server.finish_round(outcome.uploads, outcome.revealed())
    phase_s["server_recover"] = phase_s.get("server_recover", 0.0) + time.perf_counter() - tick


class MpdpPhases(RoundTransport[Upload, dict[str, bytes]]):
    """What both engines' transports share: the server's round graph (timed with the advertise
    as ``server_mp``) and the fall back to two words per correction when a client's do not fit
    one (:func:`immersion.securesum.protocol.fixed_point_limit`)."""

    def __init__(self, server: MpdpServer, t: int, phase_s: dict[str, float]) -> None:
        self.server, self.t, self.phase_s = server, t, phase_s
        self.one_word = server.noise
        self.too_large: list[int] = []  # clients whose corrections need two words
        self.model: Any = None  # the perturbed model of the attempt
        self.tick = 0.0  # set by each advertise

    def graph(self, members: list[int], publics: Any) -> Any:
        self.model, graph = self.server.begin_round(members)
        self.phase_s["server_mp"] = (
            self.phase_s.get("server_mp", 0.0) + time.perf_counter() - self.tick
        )
        return graph

    def redo(self) -> str | None:
        if not self.too_large:
            return None
        self.server.noise = dataclasses.replace(self.one_word, words=2)
        return (
            f"corrections of client {', '.join(map(str, self.too_large))} exceed the one-word "
            "fixed-point range; retrying the round with two words per correction"
        )


class LocalMpdp(MpdpPhases):
    """The phases of :func:`mpdp_round` as calls in this process."""

    def __init__(
        self,
        server: MpdpServer,
        clients: dict[int, MpdpClient],
        t: int,
        plan: FaultPlan,
        phase_s: dict[str, float],
    ) -> None:
        super().__init__(server, t, phase_s)
        self.clients, self.plan = clients, plan

    def advertise(self, attempt: int, members: list[int]) -> dict[int, bytes | str]:
        self.tick = time.perf_counter()
        return {k: self.clients[k].advertise(self.t, attempt) for k in members}

    def upload(
        self, attempt: int, members: list[int], publics: Any, graph: Any
    ) -> dict[int, Upload | str]:
        server, t, out = self.server, self.t, {}
        self.too_large = []
        for k in members:
            kind = self.plan.faults.get((k, t))
            try:
                work = partial(
                    self.clients[k].upload,
                    t,
                    self.model,
                    publics,
                    graph[k],
                    len(members),
                    server.noise,
                )
                upload = apply_fault(kind if kind != "no-recovery" else None, work)
                problem = upload_problem(
                    upload, server.layout, server.noise.mask_corrections, server.noise.words
                )
            except FixedPointRangeError as exc:
                if server.noise.words == 1:
                    self.too_large.append(k)
                problem = f"raised {type(exc).__name__}: {exc}"
            except Exception as exc:  # noqa: BLE001 - left out, its noise recovered
                problem = f"raised {type(exc).__name__}: {exc}"
            out[k] = problem or upload
            for phase, seconds in self.clients[k].timings.items():
                self.phase_s[phase] = self.phase_s.get(phase, 0.0) + seconds
        return out

    def reveal(self, attempt: int, asked: Any, publics: Any) -> dict[int, Any]:
        return {
            v: "injected fault"
            if self.plan.faults.get((v, self.t)) == "no-recovery"
            else self.clients[v].reveal(self.t, ds, publics)
            for v, ds in asked.items()
        }


def fedsgd_step(weights: list[Any], clients: list[MpdpClient], t: int, lr: float) -> list[Any]:
    """Plain FedSGD: the unweighted mean of the clients' batch gradients, one step."""
    grads = [mse_gradient(weights, *c.batch(t)) for c in clients]
    return [w - lr * sum(g[i] for g in grads) / len(grads) for i, w in enumerate(weights)]


@dataclass
class Run:
    """The server side of a run, as both engines set it up: MP-DP and the FedSGD reference."""

    setup: Setup
    server: MpdpServer
    result: MpdpResult
    plain: list[Any]


def start(cfg: RunConfig, task: FederatedTask | None = None) -> Run:
    setup = make_setup(cfg, task)
    noise, cal = noise_settings(cfg)
    opt = options_of(cfg)
    graphs = {
        "graph": cal.graph
        if cal is not None
        else resolve_noise_graph(opt.graph, cfg.clients, opt.delta),
        "mask_graph": resolve_mask_graph(opt.mask_graph, cfg.clients),
    }
    w0 = setup.w0
    server = MpdpServer(
        [w.clone() for w in w0],
        cfg.lr,
        noise,
        graphs["graph"],
        rng=np.random.default_rng([cfg.seed, 1]),
        mask_graph=graphs["mask_graph"],
    )
    result = new_result(cfg, setup, cal)
    result.graphs = graphs
    return Run(setup, server, result, [w.clone() for w in w0])


def close_round(
    run: Run,
    t: int,
    survivors: list[int],
    uploads: list[Upload],
    seconds: float,
    phases: dict[str, float],
    progress: Callable[[str], None] | None,
) -> None:
    """Plain FedSGD over the same survivors (timed alone), the measured sensitivity, the record."""
    reference = [run.setup.clients[k] for k in survivors]
    if run.result.calibration is not None:
        run.result.sensitivity_observed.append(observed_sensitivity(run.plain, reference, t))
    start_plain = time.perf_counter()
    run.plain = fedsgd_step(run.plain, reference, t, run.result.config.lr)
    seconds_plain = time.perf_counter() - start_plain
    run.result.upload_bytes += [u.nbytes for u in uploads]
    record(
        run.result,
        run.setup,
        t,
        run.server.weights,
        run.plain,
        seconds,
        seconds_plain,
        phases,
        progress,
    )


def run_local(
    cfg: RunConfig,
    *,
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    task: FederatedTask | None = None,
) -> MpdpResult:
    """Train ``cfg`` with MP-DP in this process beside plain FedSGD (same batches, same survivors
    every round); with ``task``, on a user's bias-free ReLU MLP and data.

    :func:`immersion_mpdp.runner.run_mpdp` picks this engine or Flower's.
    """
    validate(cfg, task)
    tick = time.perf_counter()
    run = start(cfg, task)
    run.result.setup_s = time.perf_counter() - tick
    clients = {c.index: c for c in run.setup.clients}
    for t in range(cfg.rounds):
        phases: dict[str, float] = {}
        tick = time.perf_counter()
        survivors, uploads = mpdp_round(
            run.server,
            clients,
            sorted(clients),
            t,
            plan=faults or FaultPlan(),
            dropped=run.result.dropped,
            aborted=run.result.aborted,
            phase_s=phases,
        )
        close_round(run, t, survivors, uploads, time.perf_counter() - tick, phases, progress)
        del uploads  # summed: the clients build their next uploads in the same buffers
    run.result.weights = run.server.weights
    run.result.final_model = torch_module().cat([w.reshape(-1) for w in run.server.weights])
    return run.result


def new_result(cfg: RunConfig, setup: Setup, cal: Calibration | None) -> MpdpResult:
    layout = Layout(setup.sizes)
    n_params = layout.gradient_size
    broadcast = 8 * (n_params + sum(setup.sizes[1:-1]))  # odd layers + transitional diagonals
    return MpdpResult(
        cfg,
        n_params=n_params,
        n_encoded=n_params,
        calibration=cal,
        upload_bytes_plain=8 * n_params,
        broadcast_bytes=broadcast,
        broadcast_bytes_plain=8 * n_params,
        privacy={"epsilon_local": None, "epsilon_global": None},
    )


def observed_sensitivity(weights: list[Any], clients: list[MpdpClient], t: int) -> float:
    """``2 max_i ||g_i|| / batch`` over the clients' round batches at the true model (replace-one
    neighbours): what the DP theorems assume to be at most ``sensitivity``. Simulation-side only."""
    worst = 0.0
    for c in clients:
        x, targets = c.batch(t)
        worst = max(worst, 2 * float(per_sample_gradient_norms(weights, x, targets).max()) / len(x))
    return worst


def record(
    result: MpdpResult,
    setup: Setup,
    t: int,
    weights: list[Any],
    plain: list[Any],
    seconds: float,
    seconds_plain: float,
    phases: dict[str, float],
    progress: Callable[[str], None] | None,
) -> None:
    """Accuracy, loss and the distance to plain FedSGD after round ``t``."""
    res = result
    res.round_s.append(seconds)
    res.round_s_plain.append(seconds_plain)
    for phase, value in phases.items():
        res.phase_s.setdefault(phase, []).append(value)
    if setup.x_test is not None:
        for sink_acc, sink_loss, w in (
            (res.accuracy, res.loss, weights),
            (res.accuracy_plain, res.loss_plain, plain),
        ):
            sink_acc.append(accuracy(w, setup.x_test, setup.y_test))
            sink_loss.append(mse_loss(w, setup.x_test, setup.y_test, setup.n_classes))
    res.diff_vs_plain.append(
        max(float((a - b).abs().max()) for a, b in zip(weights, plain, strict=True))
    )
    finite = (
        np.isfinite(res.loss[-1]) if res.loss else all(bool(w.isfinite().all()) for w in weights)
    )
    if not finite:
        cal = res.calibration
        noise = f"sigma_eta {cal.sigma_eta:.3g} (epsilon {cal.epsilon:g}) " if cal else ""
        raise TrainingDivergedError(
            f"round {t + 1}: the model diverged "
            f"(test loss {res.loss[-1] if res.loss else 'n/a'}); the noise "
            f"{noise}is too large for lr {res.config.lr:g}: lower --lr or raise --epsilon"
        )
    if progress:
        progress(
            f"round {t + 1}/{res.config.rounds}: "
            f"{f'accuracy {res.accuracy[-1]:.4f}' if res.accuracy else 'done'}, "
            f"max|W - W_fedsgd| {res.diff_vs_plain[-1]:.2e}"
        )
