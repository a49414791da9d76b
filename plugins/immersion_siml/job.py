"""The user side of SIML and the two files that cross to the service (seed 002 eqs. 42-45).

* :func:`prepare_job` (user): draws the keys, encodes every sample ``y~_i = Pi1 y_i + N1 s_i``
  (eq. 42, fresh noise per sample) and the initial state ``x~_0 = Pi2 x_0`` (eq. 43).
* :func:`save_job` / :func:`load_job`: the *job file* the service receives: the public target
  (the key geometry eq. 44 needs, without the noise law), the encoded dataset, the encoded
  initial state, the model name and the training plan. Nothing in it is decoded data.
* :func:`save_encoded_model` / :func:`load_encoded_model`: the service's answer ``w~*``.
* :func:`decode_model` (user): ``w* = Pi3_left (w~* - Pi4 y~_0)`` (eq. 45).

Files are single ``.npz`` payloads behind a magic line and a SHA-256 (no pickle), written
atomically with mode 0600.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from immersion import ImmersionError, InvalidArgumentError, Keys
from immersion._files import as_path, read_signed, writable_path, write_signed
from immersion.backends import make_backend
from immersion.coding import Immersion
from immersion.keygen import draw_geometry, split_rng, validated_design
from immersion.keys.store import key_arrays, keys_from_arrays, keys_meta
from immersion.privacy.precision import refuse_infeasible_precision

from .dynamics import OptimizerDynamics, TrainingPlan
from .models import siml_model
from .target import SampleLayout, TargetOptimizer

JOB_MAGIC = b"IMMERSION-SIML-JOB-1\n"
MODEL_MAGIC = b"IMMERSION-SIML-MODEL-1\n"


class SimlFileError(ImmersionError):
    """A SIML job or encoded-model file is missing, foreign, truncated or modified."""


@dataclass(frozen=True)
class PrivacyDesign:
    """Per-element DP targets of seed 002 Theorem 1 for the data (input) and the model (output).

    Defaults: the paper's sensitivities (``Delta^D = 1``, ``Delta^w = C = 1000``) and epsilons
    that float64 can decode to well below 1e-9 (the paper's 1e-12 cannot, notes section 5).
    """

    epsilon_data: float = 1.0
    epsilon_model: float = 1.0
    sensitivity_data: float = 1.0
    sensitivity_model: float = 1000.0
    extra_data: int = 28
    extra_state: int = 28
    extra_model: int = 28
    keys: str = "auto"
    block_size: int = 32
    tolerance: float | None = 1e-6


@dataclass(frozen=True)
class SimlJob:
    """Everything the service needs (all public or encoded), plus how to rebuild its target."""

    model: str
    image_shape: tuple[int, int, int]
    n_classes: int
    plan: TrainingPlan
    public_keys: Keys
    encoded_dataset: np.ndarray
    encoded_state: np.ndarray

    def target(self, *, backend: str = "torch", device: str | None = None) -> TargetOptimizer:
        """The target optimizer of eq. 44 for this job (float64)."""
        model = siml_model(self.model, image_shape=self.image_shape, n_classes=self.n_classes)
        return TargetOptimizer(
            keys=self.public_keys,
            dynamics=plan_dynamics(model, self.plan),
            layout=SampleLayout(self.image_shape, self.n_classes),
            backend=make_backend(backend, dtype="float64", device=device),
        )


def plan_dynamics(model: Any, plan: TrainingPlan) -> OptimizerDynamics:
    """The plan's optimizer (resolved by its registered name) as a dynamical system on ``model``."""
    from immersion_fl.engine import optimizer_by_name

    return OptimizerDynamics(model, optimizer_by_name(plan.optimizer, plan.lr))


def draw_siml_keys(
    n_sample: int,
    n_state: int,
    n_params: int,
    design: PrivacyDesign,
    *,
    backend: Any,
    rng: Any = None,
    secure: bool = False,
) -> tuple[Keys, np.random.Generator]:
    """Keys for SIML and the noise generator; refuses designs float64 cannot decode to ``design.tolerance``."""
    dims, targets = validated_design(
        n_state=n_state,
        n_input=n_sample,
        n_output=n_params,
        extra_state=design.extra_state,
        extra_input=design.extra_data,
        extra_output=design.extra_model,
        noise="laplace",
        epsilon_input=design.epsilon_data,
        epsilon_output=design.epsilon_model,
        delta_input=None,
        delta_output=None,
        sensitivity_input=design.sensitivity_data,
        sensitivity_output=design.sensitivity_model,
        noise_mean=0.0,
    )
    key_rng, noise_rng = split_rng(rng, secure)
    keys = targets.apply(draw_geometry(design.keys, dims, design.block_size, key_rng))
    if design.tolerance is not None:
        refuse_infeasible_precision(keys, backend, design.tolerance, targets, 1.0)
    return keys, noise_rng


def prepare_job(
    model_name: str,
    images: Any,
    labels: Any,
    plan: TrainingPlan,
    *,
    design: PrivacyDesign,
    init_seed: int = 0,
    rng: Any = None,
    secure: bool = False,
    n_classes: int = 10,
) -> tuple[Immersion, SimlJob, Any]:
    """User side: keys, encoded dataset and encoded initial state; returns ``(user, job, x_0)``.

    ``user`` is an :class:`immersion.Immersion` (keys, decoders, ``report()``); ``x_0`` is the
    plain initial state (for comparing with plain training).
    """
    import torch

    if images.ndim != 4 or len(images) != len(labels) or len(images) == 0:
        raise InvalidArgumentError(
            "images",
            f"expected (N, C, H, W) images with N labels, got {tuple(images.shape)} "
            f"and {tuple(labels.shape)}",
        )
    image_shape = tuple(int(s) for s in images.shape[1:])
    model = siml_model(model_name, image_shape=image_shape, n_classes=n_classes)  # type: ignore[arg-type]
    dynamics = plan_dynamics(model, plan)
    layout = SampleLayout(image_shape, n_classes)  # type: ignore[arg-type]
    backend = make_backend("torch", dtype="float64")
    keys, noise_rng = draw_siml_keys(
        layout.n_sample,
        dynamics.n_state,
        dynamics.n_params,
        design,
        backend=backend,
        rng=rng,
        secure=secure,
    )
    target = TargetOptimizer(keys=keys, dynamics=dynamics, layout=layout, backend=backend)
    user = Immersion(keys=keys, target=target, backend=backend, noise_rng=noise_rng)  # type: ignore[arg-type]
    x0 = dynamics.initial_state(model.initial_vector(init_seed))
    rows = layout.rows(torch.as_tensor(images, dtype=torch.float64), torch.as_tensor(labels))
    job = SimlJob(
        model_name,
        image_shape,
        n_classes,
        plan,
        dataclasses.replace(keys, noise=None),  # type: ignore[arg-type]
        user.encode_input(rows).numpy(),
        user.encode_state(x0).numpy(),
    )
    return user, job, x0


def key_holder(keys: Keys, job: SimlJob) -> Immersion:
    """The user's handle rebuilt from saved keys and the job they encoded (to decode the service's answer)."""
    target = job.target()
    return Immersion(
        keys=keys,
        target=target,
        backend=target.backend,  # type: ignore[arg-type]
        noise_rng=np.random.default_rng(),
    )


def decode_model(user: Immersion, encoded_model: Any, encoded_first_sample: Any) -> Any:
    """``w* = Pi3_left (w~* - Pi4 y~_0)`` (eq. 45)."""
    return user.decode_output(encoded_model, encoded_first_sample)


def _checked_path(path: str | os.PathLike[str], overwrite: bool) -> Path:
    return writable_path(
        path, overwrite=overwrite, error=SimlFileError, overwrite_hint="overwrite=True (--force)"
    )


def save_job(job: SimlJob, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write the job file for the service (atomic, mode 0600)."""
    if not isinstance(job, SimlJob):
        raise InvalidArgumentError("job", f"expected a SimlJob, got {type(job).__name__}")
    target = _checked_path(path, overwrite)
    meta = {
        "model": job.model,
        "image_shape": list(job.image_shape),
        "n_classes": job.n_classes,
        "plan": dataclasses.asdict(job.plan),
        "keys": keys_meta(job.public_keys),
    }
    arrays = {
        **key_arrays(job.public_keys),
        "encoded_dataset": job.encoded_dataset,
        "encoded_state": job.encoded_state,
    }
    write_signed(target, JOB_MAGIC, meta, arrays, prefix=".siml-job-")
    return target


def load_job(path: str | os.PathLike[str]) -> SimlJob:
    """Read a job file written by :func:`save_job`; refuse foreign, truncated or modified files."""
    source = as_path(path)
    meta, arrays = read_signed(
        source, JOB_MAGIC, what="SIML job", error=SimlFileError, private=False
    )
    try:
        plan = TrainingPlan(**meta["plan"])
        keys = keys_from_arrays(meta["keys"], arrays, source=source)
        image_shape = tuple(int(s) for s in meta["image_shape"])
        n_classes = int(meta["n_classes"])
        if len(image_shape) != 3 or min(image_shape) < 1 or n_classes < 1:
            raise ValueError(f"image shape {image_shape} and {n_classes} classes")
        if SampleLayout(image_shape, n_classes).n_sample != keys.dims["n_input"]:  # type: ignore[arg-type]
            raise ValueError(
                f"samples of {image_shape} images and {n_classes} classes do not fit the keys"
            )
        dataset = _finite(
            arrays["encoded_dataset"], "encoded_dataset", (None, keys.input_code.n_total)
        )
        state = _finite(arrays["encoded_state"], "encoded_state", (keys.state_code.n_total,))
        return SimlJob(str(meta["model"]), image_shape, n_classes, plan, keys, dataset, state)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise SimlFileError(f"path: {source} is malformed ({exc})") from None


def _finite(arr: np.ndarray, name: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """``arr`` as float64 if it is a finite real array of ``shape`` (``None``: any length >= 1)."""
    if (
        arr.dtype.kind not in "fiu"
        or arr.ndim != len(shape)
        or arr.size == 0
        or any(want is not None and got != want for got, want in zip(arr.shape, shape, strict=True))
    ):
        raise ValueError(f"{name} is not a real array of shape {shape}: {arr.dtype}, {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr.astype(np.float64)


def save_encoded_model(
    encoded_model: Any,
    path: str | os.PathLike[str],
    *,
    info: dict[str, Any],
    overwrite: bool = False,
) -> Path:
    """Write the service's answer ``w~*`` with a small JSON ``info`` (timings, model name)."""
    target = _checked_path(path, overwrite)
    write_signed(
        target,
        MODEL_MAGIC,
        info,
        {"encoded_model": np.asarray(encoded_model)},
        prefix=".siml-model-",
    )
    return target


def load_encoded_model(path: str | os.PathLike[str]) -> tuple[np.ndarray, dict[str, Any]]:
    """``(w~*, info)`` from a file written by :func:`save_encoded_model`."""
    source = as_path(path)
    info, arrays = read_signed(
        source, MODEL_MAGIC, what="SIML encoded-model", error=SimlFileError, private=False
    )
    try:
        if not isinstance(info, dict):
            raise ValueError("its info is not a JSON object")
        return _finite(arrays["encoded_model"], "encoded_model", (None,)), info
    except (KeyError, ValueError) as exc:
        raise SimlFileError(f"path: {source} is malformed ({exc})") from None
