"""The learning problem and the server state of a run, shared by the local and Flower engines.

:class:`FederatedTask` (model, each client's data, held-out data; :func:`task_from_config` builds
one from the SDK's model and dataset names or a user's import paths), :class:`Server` (the scheme
with its keys, plain FedAvg beside it, the history in a :class:`RunResult`), and the registry
lookups :func:`make_scheme` and :func:`optimizer_by_name`. The in-process rounds are in
:mod:`immersion_fl.runtime.engine`, the Flower ones in :mod:`immersion_fl.flower.engine`; both
import this module and neither imports the other's rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import ImmersionError, InvalidArgumentError
from immersion.backends import make_backend

from ..config import RunConfig, SchemeOptions
from ..scheme import AnyScheme, SchemeContext
from ..schemes import FedAvg
from .client import Client
from .data import load_dataset, split_clients
from .models import FlatModel, build_model
from .optimizers import GradientTransformation
from .user_model import check_module, check_outputs, client_tensors

if TYPE_CHECKING:
    import torch


class EveryClientFailedError(ImmersionError):
    """Every client of a round failed (see the logged reasons); nothing could be aggregated."""


def optimizer_by_name(name: str, lr: float) -> GradientTransformation:
    """A registered optimizer (``sgd``, ``momentum``, ``adam`` or a plugin's) with learning rate
    ``lr``.

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
    from ..registry import fl_registry

    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise InvalidArgumentError("lr", f"expected lr > 0, got {lr!r}")
    return fl_registry().optimizer(name).factory(lr)


def make_scheme(name: str, options: SchemeOptions, context: SchemeContext) -> AnyScheme:
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
    from ..registry import fl_registry

    spec = fl_registry().fl_scheme(name)
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
    device:
        Where the model, data and initial vector live (:meth:`to` moves them).
    """

    model: FlatModel
    client_data: list[tuple["torch.Tensor", "torch.Tensor"]]
    w0: "torch.Tensor"
    test: tuple["torch.Tensor", "torch.Tensor"] | None = None
    shuffle: bool = True
    device: str = "cpu"

    def to(self, device: str) -> "FederatedTask":
        """The task with its model, data and initial vector on ``device`` (e.g. ``"cuda"``).

        Parameters
        ----------
        device:
            A torch device name.
        """
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
        """Client ``index`` training with ``optimizer`` under ``cfg``'s epochs, batches and seed.

        Parameters
        ----------
        cfg:
            The run (local epochs, batch size, seed).
        index:
            The client's position in :attr:`client_data`.
        optimizer:
            Its local optimizer.
        clip:
            The norm bound its trained model is projected onto, or None.
        """
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
        """Every client (the same objects serve the scheme and its plain twin: same batches).

        Parameters
        ----------
        cfg:
            The run (optimizer, learning rate, local epochs, batch size, seed).
        clip:
            The scheme's model norm bound, or None.
        """
        optimizer = optimizer_by_name(cfg.optimizer, cfg.lr)
        return [self.client(cfg, i, optimizer, clip) for i in range(len(self.client_data))]


def task_from_config(cfg: RunConfig) -> FederatedTask:
    """The runner's task: ``cfg.model`` on ``cfg.dataset`` split over ``cfg.clients`` clients,
    initial weights from ``cfg.seed`` (the same on every engine). Either may name user code as
    ``package.module:function`` (:func:`user_task`).

    Parameters
    ----------
    cfg:
        The run.
    """
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
    """Whether ``cfg.model`` or ``cfg.dataset`` is an import path to the user's code.

    Parameters
    ----------
    cfg:
        The run.
    """
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
    names may be mixed in: an SDK dataset with a user model, or the reverse.

    Parameters
    ----------
    cfg:
        The run (``model`` and ``dataset`` name the user's code or the SDK's).
    """
    import torch
    from immersion.imports import call_loader, is_import_path

    if _user_dataset(cfg.dataset):
        loaded = call_loader(cfg.dataset, argument="dataset")
        if not isinstance(loaded, (tuple, list)) or len(loaded) not in (2, 4):
            raise InvalidArgumentError(
                "dataset", f"{cfg.dataset} must return (X, Y) or (X, Y, X_test, Y_test)"
            )
        x, y = client_tensors(-1, tuple(loaded[:2]), argument="dataset", part=cfg.dataset)
        test = (
            client_tensors(
                -1, tuple(loaded[2:]), argument="dataset", part=f"{cfg.dataset} (test split)"
            )
            if len(loaded) == 4
            else None
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
                image_shape=image_shape,  # type: ignore[arg-type]  # 3 entries: (C, H, W)
                n_classes=n_classes,
                hidden=cfg.hidden,
            )
        )
        w0 = model.initial_vector(cfg.seed)
    check_outputs(model.module, [(x, y)], argument="dataset")
    if test is not None:
        check_outputs(model.module, [test], argument="dataset")
    labels = (y.argmax(1) if y.ndim == 2 else y).numpy()
    parts = split_clients(labels, cfg.clients, split=cfg.split, alpha=cfg.alpha, seed=cfg.seed)
    return FederatedTask(model, [(x[idx], y[idx]) for idx in parts], w0, test)


@dataclass
class RunResult:
    """Per-round figures of one run (and of the plain reference run beside it).

    Parameters
    ----------
    config:
        The run.
    accuracy, loss:
        Held-out accuracy and mean loss of the decoded global model, per round.
    accuracy_plain, loss_plain:
        The same for the plain twin (``compare_plain``).
    diff_vs_plain:
        ``max |w - w_plain|`` per round.
    round_s, round_s_plain:
        Seconds per round of the scheme and of its plain twin.
    n_params, n_encoded:
        Model size and encoded size.
    key_bytes:
        Bytes of key material the server holds.
    privacy:
        The scheme's privacy figures (:meth:`~immersion_fl.scheme.Scheme.privacy`).
    dropped:
        One ``{"round", "client", "reason"}`` entry per client left out of a round.
    aborted:
        One entry per attempt of a round given up (secure aggregation: a survivor did not reveal
        its seeds; the round was retried with fresh keys).
    final_model:
        The decoded global model after the last round.
    one_step_error:
        Per round, ``max |w - sum_i a_i w_i|``: the decoded aggregate against the plain weighted
        average of the same round's local models (the scheme's own error in one round).
    reference_drift:
        Per round (``reference_drift=True``), ``max |w_fedavg - w_fedavg_reversed|``: plain FedAvg
        against plain FedAvg summing its uploads in reverse order (float64 chaos, no encoding).
    diff_vs_float_plain:
        Per round, for integer schemes: ``max |w - w_fedavg|`` against float FedAvg (the
        quantisation carried through training; ``diff_vs_plain`` is then against the fixed-point
        twin).
    secure_aggregation:
        Whether the rounds ran as secure sums (the scheme's
        :attr:`~immersion_fl.scheme.Scheme.secure_aggregation`).
    setup_s:
        Seconds of the one-time set-up before round 1 (keys drawn, noise calibrated, clients
        built), counted in no round; None where the engine does not time it.
    """

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
    aborted: list[dict[str, Any]] = field(default_factory=list)
    final_model: "torch.Tensor | None" = None
    one_step_error: list[float] = field(default_factory=list)
    reference_drift: list[float] = field(default_factory=list)
    diff_vs_float_plain: list[float] = field(default_factory=list)
    secure_aggregation: bool = False
    setup_s: float | None = None

    def summary(self) -> dict[str, Any]:
        """The JSON object of ``immersion fl run --json``.

        Times: ``setup_s`` is the one-time set-up; ``first_round_s`` the first round (it also
        pays first-use costs: lazy imports, allocations, caches); ``round_s_median`` and
        ``round_time_ratio`` (scheme / plain twin, the same clients and batches) are the steady
        state, medians over rounds 2..R (round 1 where only one ran; ``steady_rounds`` says how
        many).
        """
        steady, steady_plain = _steady(self.round_s), _steady(self.round_s_plain)
        ratio = float(np.median(steady) / np.median(steady_plain)) if steady_plain else None
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
            "round_s_median": float(np.median(steady)) if steady else None,
            "steady_rounds": len(steady),
            "first_round_s": self.round_s[0] if self.round_s else None,
            "first_round_s_plain": self.round_s_plain[0] if self.round_s_plain else None,
            "setup_s": self.setup_s,
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
            "one_step_error_max": max(self.one_step_error) if self.one_step_error else None,
            "one_step_error_per_round": self.one_step_error,
            "reference_drift_max": max(self.reference_drift) if self.reference_drift else None,
            "reference_drift_per_round": self.reference_drift,
            "max_abs_diff_vs_float_fedavg": max(self.diff_vs_float_plain)
            if self.diff_vs_float_plain
            else None,
            "diff_vs_float_fedavg_per_round": self.diff_vs_float_plain,
            "arithmetic": self.privacy.get("arithmetic", "float"),
            "dropped": self.dropped,
            "aborted_rounds": self.aborted,
            "secure_aggregation": self.secure_aggregation,
        }


def _steady(seconds: list[float]) -> list[float]:
    """The steady-state rounds: all but the first (which pays first-use costs), if more ran."""
    return seconds[1:] if len(seconds) > 1 else seconds


@dataclass
class Server:
    """Server-side state of a run: the scheme, FedAvg beside it, the held-out data and the
    history (:meth:`create` builds one).

    Parameters
    ----------
    cfg:
        The run.
    model:
        The model, to evaluate the global model on ``test``.
    scheme:
        The scheme, set up (keys drawn).
    plain:
        The scheme's plain twin in lockstep (``compare_plain``), or None.
    test:
        Held-out ``(x, y)``, or None.
    result:
        The history, filled round by round.
    references:
        Further plain runs in lockstep: ``"float"`` (float FedAvg, when the twin is fixed point)
        and ``"reversed"`` (FedAvg summing in reverse order, with ``reference_drift``).
    """

    cfg: RunConfig
    model: FlatModel
    scheme: AnyScheme
    plain: AnyScheme | None
    test: tuple["torch.Tensor", "torch.Tensor"] | None
    result: RunResult
    references: dict[str, AnyScheme] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        cfg: RunConfig,
        task: FederatedTask,
        client_sizes: list[int] | None = None,
        *,
        device: str | None = None,
        reference_drift: bool = False,
    ) -> "Server":
        """Draw keys and set up the scheme; with ``client_sizes`` also calibrate the noise (else
        later, :meth:`calibrate`).

        Parameters
        ----------
        cfg:
            The run (scheme, options, seed, ``compare_plain``).
        task:
            The learning problem (model and initial vector).
        client_sizes:
            The clients' |D_i|, or None to calibrate later.
        device:
            The torch device of keys and models (default ``"cpu"``).
        reference_drift:
            Also run plain FedAvg summing its uploads in reverse order (needs ``compare_plain``).
        """
        backend = make_backend("torch", dtype="float64", device=device or "cpu")
        context = SchemeContext(backend=backend, rng=np.random.default_rng([cfg.seed, 1]))
        scheme = make_scheme(cfg.scheme, cfg.options, context)
        w0 = backend.asarray(task.w0)
        scheme.setup(w0)
        plain = (
            (scheme.plain_twin() or FedAvg())
            if cfg.compare_plain and cfg.scheme != "fedavg"
            else None
        )
        references: dict[str, AnyScheme] = {}
        if plain is not None and not isinstance(plain, FedAvg):
            references["float"] = FedAvg()
        if plain is not None and reference_drift:
            references["reversed"] = FedAvg(reverse_sum=True)
        for twin in (plain, *references.values()):
            if twin is not None:
                twin.setup(w0)
        result = RunResult(
            cfg,
            n_params=task.model.n_params,
            n_encoded=scheme.n_encoded,
            key_bytes=scheme.key_bytes,
            secure_aggregation=scheme.secure_aggregation,
        )
        server = cls(cfg, task.model, scheme, plain, task.test, result, references)
        if client_sizes is not None:
            server.calibrate(client_sizes)
        return server

    def calibrate(self, client_sizes: list[int]) -> None:
        """Design the round noise and record the privacy figures.

        Parameters
        ----------
        client_sizes:
            The clients' dataset sizes |D_i|.
        """
        self.scheme.design_noise(client_sizes)
        self.result.privacy = self.scheme.privacy(client_sizes)

    def record(
        self,
        t: int,
        seconds: float,
        seconds_plain: float | None,
        progress: Callable[[str], None] | None,
        local_average: "torch.Tensor | None" = None,
    ) -> None:
        """The round's figures: accuracy (with held-out data), distance to the plain twin and to
        the references, the one-step error.

        Parameters
        ----------
        t:
            The round.
        seconds, seconds_plain:
            Its duration for the scheme and for the plain twin (None without one).
        progress:
            Called with one line for the round, or None.
        local_average:
            The plain weighted average of the round's local models (for the one-step error).
        """
        res = self.result
        w = self.scheme.global_model()
        if local_average is not None:
            res.one_step_error.append(_max_abs(w - local_average))
        if "float" in self.references:
            res.diff_vs_float_plain.append(_max_abs(w - self.references["float"].global_model()))
        if "reversed" in self.references and self.plain is not None:
            forward = self.references.get("float", self.plain)  # the float FedAvg run
            drift = forward.global_model() - self.references["reversed"].global_model()
            res.reference_drift.append(_max_abs(drift))
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
            res.diff_vs_plain.append(_max_abs(w - self.plain.global_model()))
        if progress:
            acc_text = f"accuracy {res.accuracy[-1]:.4f}" if res.accuracy else "done"
            diff = f", max|w - w_fedavg| {res.diff_vs_plain[-1]:.2e}" if res.diff_vs_plain else ""
            progress(f"round {t + 1}/{self.cfg.rounds}: {acc_text}{diff}")


def _max_abs(difference: "torch.Tensor") -> float:
    return float(difference.abs().max())
