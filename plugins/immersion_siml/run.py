"""``run_siml``: user, service and plain training side by side in one process (seed 002
section VI-A).

The plain run and the service's target optimizer share the model, the initial weights, the
batch order and the optimizer code; the comparison is therefore exact up to rounding, epoch by
epoch (the decoded iterate ``Pi2_left x~_e`` against the plain ``x_e``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .dynamics import TrainingPlan
from .job import PrivacyDesign, decode_model, decode_state, prepare_job
from .references import plain_training


@dataclass
class SimlResult:
    """Figures of one run; ``summary()`` is the JSON of ``immersion siml run``."""

    model: str
    dataset: str
    plan: TrainingPlan
    n_params: int
    n_params_encoded: int
    n_sample: int
    n_sample_encoded: int
    n_train: int
    max_abs_diff_vs_plain: float
    max_abs_diff_per_epoch: list[float]
    accuracy: float
    accuracy_plain: float
    accuracy_curve: list[float]
    accuracy_curve_plain: list[float]
    train_seconds: float
    train_seconds_plain: float
    encode_seconds: float
    decode_seconds: float
    privacy: dict[str, Any]
    sample_original: np.ndarray = field(repr=False)
    sample_encoded: np.ndarray = field(repr=False)
    max_abs_diff_vs_float_plain: float = float("nan")
    accuracy_float_plain: float = float("nan")

    @property
    def time_ratio_vs_plain(self) -> float:
        return self.train_seconds / self.train_seconds_plain

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dataset": self.dataset,
            "optimizer": self.plan.optimizer,
            "lr": self.plan.lr,
            "epochs": self.plan.epochs,
            "batch_size": self.plan.batch_size,
            "sync": self.plan.sync,
            "n_params": self.n_params,
            "n_params_encoded": self.n_params_encoded,
            "n_sample": self.n_sample,
            "n_sample_encoded": self.n_sample_encoded,
            "n_train": self.n_train,
            "max_abs_diff_vs_plain": self.max_abs_diff_vs_plain,
            "max_abs_diff_per_epoch": self.max_abs_diff_per_epoch,
            "accuracy": self.accuracy,
            "accuracy_plain": self.accuracy_plain,
            "accuracy_curve": self.accuracy_curve,
            "accuracy_curve_plain": self.accuracy_curve_plain,
            "time_ratio_vs_plain": self.time_ratio_vs_plain,
            "train_seconds": self.train_seconds,
            "train_seconds_plain": self.train_seconds_plain,
            "encode_seconds": self.encode_seconds,
            "decode_seconds": self.decode_seconds,
            **self.privacy,
            **(
                {
                    "max_abs_diff_vs_float_plain": self.max_abs_diff_vs_float_plain,
                    "accuracy_float_plain": self.accuracy_float_plain,
                }
                if self.privacy.get("arithmetic") == "modular"
                else {}
            ),
        }


class _EpochRecorder:
    """Per-epoch parameters (copied) and the time spent recording them, to subtract from timings."""

    def __init__(
        self, read_params: Callable[[Any], Any], progress: Callable[[str], None] | None, label: str
    ) -> None:
        self.params: list[Any] = []
        self.seconds = 0.0
        self._read, self._progress, self._label = read_params, progress, label

    def __call__(self, epoch: int, state: Any) -> None:
        start = time.perf_counter()
        self.params.append(self._read(state).clone())
        if self._progress is not None:
            self._progress(f"{self._label} epoch {epoch + 1}")
        self.seconds += time.perf_counter() - start


#: What the SIML sensitivities assume (seed 002 section VI-A); nothing here enforces them.
SENSITIVITY_NOTE = (
    "the epsilons hold for neighbours that differ by at most sensitivity_data {data:g} in L1 "
    "(one sample) and sensitivity_model {model:g} in L1 (the model): seed 002's Delta^D = 1 and "
    "Delta^w = C = 1000, C being the paper's gradient-clipping threshold. SIML trains without "
    "clipping, so both are assumptions about your data and model, not enforced: pass the "
    "bounds you know (--sensitivity-data, --sensitivity-model); epsilon scales with them"
)


def privacy_figures(user: Any) -> dict[str, Any]:
    """Seed 002 Theorem 1 per element for the encoded data and the encoded model, from the drawn
    keys."""
    report = user.report()
    if getattr(report, "arithmetic", "float") == "modular":
        return {
            "arithmetic": "modular",
            "fraction_bits": report.fraction_bits,
            "quantisation_step": report.quantisation_step,
            "largest_magnitude": report.largest_magnitude,
            "epsilon_data": report.epsilon_input,
            "epsilon_model": report.epsilon_output,
            "epsilon_data_proven": report.epsilon_input_proven,
            "epsilon_model_proven": report.epsilon_output_proven,
            "decode_error_estimate": report.decode_error_estimate,
            "guarantee": "every entry of one encoded sample and of the encoded model is uniform "
            "modulo 2^64 (per-element epsilon 0), against parties without the target; the "
            "service decodes both (THREAT_MODEL.md)",
        }
    return {
        "arithmetic": "float",
        "epsilon_data": report.epsilon_input,
        "epsilon_model": report.epsilon_output,
        "epsilon_data_proven": report.epsilon_input_proven,
        "epsilon_model_proven": report.epsilon_output_proven,
        "sensitivity_data": report.sensitivity_input,
        "sensitivity_model": report.sensitivity_output,
        "noise_scale": report.noise_scale,
        "decode_error_estimate": report.decode_error_estimate,
        "guarantee": "per element of one encoded sample (epsilon_data) and of the encoded model "
        "(epsilon_model), against parties without the target; the service decodes both "
        "(THREAT_MODEL.md)",
        "epsilon_note": report.epsilon_note(input_name="data", output_name="model"),
        "sensitivity_note": SENSITIVITY_NOTE.format(
            data=report.sensitivity_input, model=report.sensitivity_output
        ),
    }


def run_siml(
    model_name: str,
    dataset: Any,
    plan: TrainingPlan,
    *,
    design: PrivacyDesign | None = None,
    init_seed: int = 0,
    rng: Any = 0,
    compare_plain: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SimlResult:
    """Encode ``dataset``, train with the target optimizer, decode.

    ``model_name`` is one of :data:`~immersion_siml.models.MODEL_NAMES` or the user's
    ``package.module:function`` (see :func:`~immersion_siml.job.prepare_job`); ``dataset`` an
    ``immersion_fl.runtime.data.Dataset`` or the user's :class:`~immersion_siml.inputs.UserData`
    (without a test split the accuracies are NaN). With ``compare_plain`` the plain optimizer
    runs on the same data, initial weights and batch order, and every epoch's decoded iterate is
    compared with the plain one.

    Examples
    --------
    >>> from immersion_fl.runtime.data import load_digits_dataset
    >>> plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=2, batch_size=64)
    >>> result = run_siml("nn-x2", load_digits_dataset(), plan)
    >>> result.max_abs_diff_vs_plain < 1e-9, result.accuracy == result.accuracy_plain
    (True, True)
    """
    import torch

    design = design or PrivacyDesign()
    x_train = torch.as_tensor(dataset.x_train, dtype=torch.float64)
    y_train = torch.as_tensor(dataset.y_train)
    has_test = dataset.x_test is not None
    x_test = torch.as_tensor(dataset.x_test, dtype=torch.float64) if has_test else None
    y_test = torch.as_tensor(dataset.y_test) if has_test else None

    start = time.perf_counter()
    user, job, x0 = prepare_job(
        model_name,
        x_train,
        y_train,
        plan,
        design=design,
        init_seed=init_seed,
        rng=rng,
        n_classes=getattr(dataset, "n_classes", None),
    )
    encode_seconds = time.perf_counter() - start
    target = user.target
    dynamics = target.dynamics
    model = dynamics.model

    service_epochs = _EpochRecorder(lambda x: decode_state(user, x), progress, "SIML")
    as_input = (lambda a: a) if target.modular else torch.as_tensor
    encoded_state = as_input(job.encoded_state)
    encoded_dataset = as_input(job.encoded_dataset)
    start = time.perf_counter()
    encoded_model, _ = target.train(encoded_state, encoded_dataset, plan, on_epoch=service_epochs)
    train_seconds = time.perf_counter() - start - service_epochs.seconds

    start = time.perf_counter()
    w_decoded = decode_model(user, encoded_model, encoded_dataset[0])
    decode_seconds = time.perf_counter() - start
    siml_params = [dynamics.params(x) for x in service_epochs.params]

    plain_params: list[Any] = []
    w_plain: Any = None
    w_float: Any = None
    train_seconds_plain = float("nan")
    if compare_plain:
        layout = target.layout
        images, targets = layout.split(layout.rows(x_train, y_train))
        plain_epochs = _EpochRecorder(lambda w: w, progress, "plain")
        start = time.perf_counter()
        w_float = plain_training(
            dynamics, x0, images, targets, plan, layout=layout, on_epoch=plain_epochs
        )
        train_seconds_plain = time.perf_counter() - start - plain_epochs.seconds
        plain_params, w_plain = plain_epochs.params, w_float
        if target.modular:  # the reference of exactness: the fixed-point twin
            twin_epochs = _EpochRecorder(lambda w: w, progress, "fixed-point twin")
            w_plain = plain_training(
                dynamics,
                x0,
                images,
                targets,
                plan,
                layout=layout,
                fraction_bits=target.fraction_bits,
                on_epoch=twin_epochs,
            )
            plain_params = twin_epochs.params

    def accuracy(w: Any) -> float:
        return model.accuracy(w, x_test, y_test) if has_test else float("nan")

    per_epoch = (
        [float((a - b).abs().max()) for a, b in zip(siml_params, plain_params, strict=True)]
        if compare_plain
        else []
    )
    sample = np.asarray(dataset.x_train[0], dtype=np.float64).reshape(-1)
    return SimlResult(
        model=model_name,
        dataset=dataset.name,
        plan=plan,
        n_params=dynamics.n_params,
        n_params_encoded=target.n_output_encoded,
        n_sample=target.layout.n_sample,
        n_sample_encoded=target.n_input_encoded,
        n_train=len(x_train),
        max_abs_diff_vs_plain=float((w_decoded - w_plain).abs().max())
        if compare_plain
        else float("nan"),
        max_abs_diff_per_epoch=per_epoch,
        accuracy=accuracy(w_decoded),
        accuracy_plain=accuracy(w_plain) if compare_plain else float("nan"),
        accuracy_curve=[accuracy(w) for w in siml_params] if has_test else [],
        accuracy_curve_plain=[accuracy(w) for w in plain_params] if has_test else [],
        train_seconds=train_seconds,
        train_seconds_plain=train_seconds_plain,
        encode_seconds=encode_seconds,
        decode_seconds=decode_seconds,
        privacy=privacy_figures(user),
        sample_original=sample,
        sample_encoded=job.encoded_dataset[0][: len(sample)].copy(),
        max_abs_diff_vs_float_plain=float((w_decoded - w_float).abs().max())
        if compare_plain
        else float("nan"),
        accuracy_float_plain=accuracy(w_float) if compare_plain else float("nan"),
    )
