"""The user side of SIML and the two files that cross to the service (seed 002 eqs. 42-45).

* :func:`prepare_job` (user): draws the keys, encodes every sample ``y~_i = Pi1 y_i + N1 s_i``
  (eq. 42, fresh noise per sample) and the initial state ``x~_0 = Pi2 x_0`` (eq. 43).
* :func:`save_job` / :func:`load_job`: the *job file* the service receives: the public target
  (the key geometry eq. 44 needs, without the noise law), the encoded dataset, the encoded
  initial state (the initial weights travel only encoded, eq. 43), the model (a name of
  :data:`~immersion_siml.models.MODEL_NAMES`, or the import path ``package.module:function`` of
  the user's builder with the names and shapes of its parameters), the loss and the training
  plan. Nothing in it is decoded data, and nothing is a pickle: the service rebuilds the module
  by importing the path (it must have the user's code installed, and allow it explicitly).
* :func:`save_encoded_model` / :func:`load_encoded_model`: the service's answer ``w~*``.
* :func:`decode_model` (user): ``w* = Pi3_left (w~* - Pi4 y~_0)`` (eq. 45).

Files are single ``.npz`` payloads behind a magic line and a SHA-256 (no pickle), written
atomically with mode 0600. Job files are version 2 (``IMMERSION-SIML-JOB-2``: any feature
shape, target rows, the user's model by path); version-1 files (images, built-in models) load.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

import numpy as np
from immersion import Design, Immersion, ImmersionError, InvalidArgumentError
from immersion import validation as v
from immersion.backends import make_backend
from immersion.coding.keygen import split_rng
from immersion.coding.modular import DEFAULT_FRACTION_BITS, ModularImmersion
from immersion.files import as_path, read_signed, writable_path, write_signed
from immersion.integer import check_fraction_bits, encode_fixed
from immersion.keys.store import (
    key_arrays,
    keys_from_arrays,
    keys_meta,
    modular_keys_from_arrays,
    modular_meta,
)
from immersion.privacy.precision import refuse_infeasible_precision

from .dynamics import OptimizerDynamics, TrainingPlan
from .inputs import (
    build_module,
    check_outputs,
    feature_shape_of,
    initial_weights,
    parameter_manifest,
    sample_tensors,
)
from .models import LOSSES, SimlModel
from .target import SampleLayout, TargetOptimizer

#: The job format written now (version 2); :data:`JOB_MAGIC_V1` files still load.
JOB_MAGIC = b"IMMERSION-SIML-JOB-2\n"
JOB_MAGIC_V1 = b"IMMERSION-SIML-JOB-1\n"
MODEL_MAGIC = b"IMMERSION-SIML-MODEL-1\n"

#: Most memory that drawing dense keys may take (bytes). Measured: drawing and validating dense
#: codes of immersed sizes ``s`` peaks at about ``7 x 8 s^2`` bytes (0.9 GiB for a 4,028-entry
#: state with a 1,361-entry output, 50 s); block keys need ``O(s b)``.
DENSE_KEY_BUDGET = 2 * 2**30


#: The arithmetics of SIML (``PrivacyDesign.arithmetic``).
ARITHMETICS = ("float", "modular")
#: Design options of the float arithmetic's noise and precision, refused with ``"modular"``.
FLOAT_ONLY = (
    "epsilon_data",
    "epsilon_model",
    "sensitivity_data",
    "sensitivity_model",
    "tolerance",
)


class SimlFileError(ImmersionError):
    """A SIML job or encoded-model file is missing, foreign, truncated or modified."""


@dataclass(frozen=True)
class PrivacyDesign:
    """Per-element DP targets of seed 002 Theorem 1 for the data (input) and the model (output).

    Defaults: the paper's sensitivities (``Delta^D = 1``, ``Delta^w = C = 1000``) and epsilons
    that float64 can decode to well below 1e-9 (the paper's 1e-12 cannot, notes section 5).

    Parameters
    ----------
    epsilon_data, epsilon_model:
        Per-element epsilon of each encoded sample ``y~_i`` (eq. 42) and of the encoded model
        ``w~*`` (Theorem 1, against parties without the target). Float arithmetic only.
    sensitivity_data, sensitivity_model:
        L1 sensitivities ``Delta^D`` of one sample and ``Delta^w`` of the model. Float only.
    extra_data, extra_state, extra_model:
        Extra dimensions of the immersion (noise directions) for the samples, the optimizer
        state and the model.
    keys:
        ``"dense"``, ``"block"`` (block-structured, memory ``O(n b)``) or ``"auto"`` (dense
        while small).
    block_size:
        Block size ``b`` of block keys.
    tolerance:
        Refuse float designs whose predicted decoding error exceeds it (None: no check). Float
        only.
    arithmetic:
        ``"float"`` (seed 002's float64 coding: a smaller epsilon costs precision) or
        ``"modular"`` (fixed-point integers modulo ``2^64``, noise uniform modulo ``2^64``:
        per-element epsilon 0 and the decoded model bit-identical to fixed-point training).
    fraction_bits:
        ``f`` of ``q(v) = round(v 2^f)`` under ``"modular"`` (None: 32); every value must stay
        below ``2^(63 - f)`` in magnitude (the optimizer state below ``2^(62 - f)``).

    Examples
    --------
    >>> PrivacyDesign(arithmetic="modular").modular_bits, PrivacyDesign().modular_bits is None
    (32, True)
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
    arithmetic: str = "float"
    fraction_bits: int | None = None

    def __post_init__(self) -> None:
        for name in ("epsilon_data", "epsilon_model", "sensitivity_data", "sensitivity_model"):
            v.positive_float(name, getattr(self, name))
        for name in ("extra_data", "extra_state", "extra_model", "block_size"):
            v.positive_int(name, getattr(self, name))
        v.one_of("keys", self.keys, ("auto", "dense", "block"))
        if self.tolerance is not None:
            v.positive_float("tolerance", self.tolerance)
        v.one_of("arithmetic", self.arithmetic, ARITHMETICS)
        if self.fraction_bits is not None:
            if self.arithmetic != "modular":
                raise InvalidArgumentError(
                    "fraction_bits", "applies to arithmetic='modular' only (fixed-point integers)"
                )
            check_fraction_bits(self.fraction_bits)

    @property
    def modular_bits(self) -> int | None:
        """``f`` of the fixed-point values under ``arithmetic="modular"`` (default 32), or None."""
        if self.arithmetic != "modular":
            return None
        return DEFAULT_FRACTION_BITS if self.fraction_bits is None else self.fraction_bits

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "PrivacyDesign":
        """A design from keyword options (``train(..., **design)``), refusing unknown names.

        With ``arithmetic="modular"`` the float arithmetic's options (:data:`FLOAT_ONLY`) are
        refused too: they would have no effect.

        Parameters
        ----------
        options:
            Field names of :class:`PrivacyDesign` and their values.

        Examples
        --------
        >>> PrivacyDesign.from_options({"epsilon_data": 0.5}).epsilon_data
        0.5
        >>> PrivacyDesign.from_options({"epsilon": 0.5})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        immersion.errors.InvalidArgumentError: epsilon: is not an option of SIML's privacy ...
        """
        known = sorted(f.name for f in dataclasses.fields(cls))
        for name in options:
            if name not in known:
                raise InvalidArgumentError(
                    name,
                    f"is not an option of SIML's privacy design; its options: {', '.join(known)}",
                )
            if name in FLOAT_ONLY and options.get("arithmetic") == "modular":
                raise InvalidArgumentError(
                    name,
                    "applies to arithmetic='float' only: modular coding draws noise uniform "
                    "modulo 2^64 (per-element epsilon 0) and decodes exactly",
                )
        return cls(**options)


@dataclass(frozen=True)
class SimlJob:
    """Everything the service needs (all public or encoded), plus how to rebuild its target.

    ``model`` is a name of :data:`~immersion_siml.models.MODEL_NAMES` or the import path of the
    user's builder; ``parameters`` the names and shapes of its parameters (``None`` in version-1
    files), which the service checks against the module it rebuilds; ``fraction_bits`` is None
    for float keys and ``f`` for integer keys (encoded arrays ``uint64``, modulo ``2^64``).
    """

    model: str
    feature_shape: tuple[int, ...]
    n_targets: int
    plan: TrainingPlan
    public_keys: Any  # Keys (float) or ModularKeys
    encoded_dataset: np.ndarray
    encoded_state: np.ndarray
    loss: str = "cross_entropy"
    parameters: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    fraction_bits: int | None = None

    def target(
        self,
        *,
        backend: str = "torch",
        device: str | None = None,
        allowed_models: Collection[str] = (),
    ) -> TargetOptimizer:
        """The target optimizer of eq. 44 for this job (float64).

        ``allowed_models``: import paths of user code this process trusts; a job naming another
        path is refused (importing it would run its code here).
        """
        be = make_backend(backend, dtype="float64", device=device)
        module = build_module(
            self.model,
            feature_shape=self.feature_shape,
            n_targets=self.n_targets,
            seed=0,
            allow_import=self.model in allowed_models,
        )
        if self.parameters is not None and parameter_manifest(module) != self.parameters:
            raise InvalidArgumentError(
                "model",
                f"{self.model} builds parameters {_describe(parameter_manifest(module))}, but the "
                f"job was encoded for {_describe(self.parameters)}: the service needs the same "
                "version of the user's code",
            )
        if getattr(be, "device", "cpu") != "cpu":
            module = module.to(be.device)
        return TargetOptimizer(
            keys=self.public_keys,
            dynamics=plan_dynamics(SimlModel(module, loss=self.loss), self.plan),
            layout=SampleLayout(self.feature_shape, self.n_targets),
            backend=be,
            fraction_bits=self.fraction_bits,
        )


def _describe(manifest: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    shown = ", ".join(f"{name}{list(shape)}" for name, shape in manifest[:4])
    return f"[{shown}{', ...' if len(manifest) > 4 else ''}] ({len(manifest)} tensors)"


def plan_dynamics(model: Any, plan: TrainingPlan) -> OptimizerDynamics:
    """The plan's optimizer (resolved by its registered name) as a dynamical system on ``model``."""
    from immersion_fl.runtime.engine import optimizer_by_name

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
) -> tuple[Any, np.random.Generator]:
    """Keys for SIML and the noise generator; refuses dense keys beyond :data:`DENSE_KEY_BUDGET`
    (naming ``keys``) and designs float64 cannot decode to ``design.tolerance``. With
    ``design.arithmetic == "modular"``: integer keys (:class:`~immersion.keys.ModularKeys`, noise
    uniform modulo ``2^64``, exact decoding: no precision check)."""
    coding = coding_design(n_sample, n_state, n_params, design)
    if coding.keys == "dense":
        need = 7 * 8 * sum(s * s for s in coding.immersed_sizes)
        if need > DENSE_KEY_BUDGET:
            raise InvalidArgumentError(
                "keys",
                f"dense keys for an optimizer state of {n_state} entries ({n_params} parameters) "
                f"would need about {need / 2**30:.1f} GiB to draw (limit "
                f"{DENSE_KEY_BUDGET / 2**30:.0f} GiB): use keys='block' (memory O(n b)) or 'auto'",
            )
    key_rng, noise_rng = split_rng(rng, secure)
    keys = coding.draw(key_rng)
    if coding.targets is not None and design.tolerance is not None:
        refuse_infeasible_precision(keys, backend, design.tolerance, coding.targets, 1.0)
    return keys, noise_rng


def coding_design(n_sample: int, n_state: int, n_params: int, design: PrivacyDesign) -> Design:
    """The :class:`immersion.Design` of SIML's immersion (seed 002 eqs. 42-45): the samples are
    the input ``y``, the optimizer state the state ``x``, the model the output ``u``.

    Parameters
    ----------
    n_sample, n_state, n_params:
        Entries of one sample row, of the optimizer state and of the model.
    design:
        SIML's privacy design (the float options are left out under ``"modular"``).
    """
    noise_design: dict[str, Any] = {
        "epsilon_input": design.epsilon_data,
        "epsilon_output": design.epsilon_model,
        "sensitivity_input": design.sensitivity_data,
        "sensitivity_output": design.sensitivity_model,
    }
    return Design(
        n_state,
        n_sample,
        n_params,
        extra_state=design.extra_state,
        extra_input=design.extra_data,
        extra_output=design.extra_model,
        keys=design.keys,  # type: ignore[arg-type]  # checked by PrivacyDesign
        block_size=design.block_size,
        arithmetic=design.arithmetic,  # type: ignore[arg-type]
        tolerance=None,  # checked here with SIML's input gain 1
        **(noise_design if design.arithmetic == "float" else {}),
    )


def encode_training(
    model: SimlModel,
    features: Any,
    targets: Any,
    plan: TrainingPlan,
    w0: Any,
    *,
    design: PrivacyDesign,
    backend: Any,
    rng: Any = None,
    secure: bool = False,
) -> tuple[Immersion, Any, Any, Any]:
    """User side for any model: keys, ``y~_i`` (eq. 42) and ``x~_0`` (eq. 43).

    Returns ``(user, encoded_dataset, encoded_state, x_0)`` as arrays of ``backend``; ``user`` is
    an :class:`immersion.Immersion` whose ``target`` is the service's :class:`TargetOptimizer`.
    ``features`` ``(N, ...)`` and ``targets`` ``(N, C)`` are checked tensors
    (:func:`~immersion_siml.inputs.sample_tensors`), ``w0`` the initial parameter vector.
    """
    dynamics = plan_dynamics(model, plan)
    layout = SampleLayout(feature_shape_of(features), int(targets.shape[1]))
    keys, noise_rng = draw_siml_keys(
        layout.n_sample,
        dynamics.n_state,
        dynamics.n_params,
        design,
        backend=backend,
        rng=rng,
        secure=secure,
    )
    bits = design.modular_bits
    target = TargetOptimizer(
        keys=keys, dynamics=dynamics, layout=layout, backend=backend, fraction_bits=bits
    )
    x0 = dynamics.initial_state(backend.asarray(w0))
    rows = layout.rows(backend.asarray(features), backend.asarray(targets))
    if bits is None:
        user = Immersion(
            keys=keys,
            target=target,  # type: ignore[arg-type]  # a TargetOptimizer serves as the target
            backend=backend,
            noise_rng=noise_rng,
        )
        return user, user.encode_input(rows), user.encode_state(x0), x0
    modular = ModularImmersion(
        keys=keys,
        target=target,  # type: ignore[arg-type]
        noise_rng=noise_rng,
        fraction_bits=bits,
    )
    # range refusals name the signal the user knows (the handle's own would say y and state)
    for name, value in (("X", features), ("Y", targets), ("model", w0)):
        encode_fixed(backend.asarray(value).detach().cpu().numpy(), bits, name=name)
    encoded_rows = modular.encode_input(rows.detach().cpu().numpy())
    return modular, encoded_rows, modular.encode_state(x0.detach().cpu().numpy()), x0


def prepare_job(
    model: str,
    features: Any,
    targets: Any,
    plan: TrainingPlan,
    *,
    design: PrivacyDesign,
    init_seed: int = 0,
    rng: Any = None,
    secure: bool = False,
    n_classes: int | None = None,
    loss: str = "cross_entropy",
) -> tuple[Immersion, SimlJob, Any]:
    """User side: keys, encoded dataset and encoded initial state; returns ``(user, job, x_0)``.

    Parameters
    ----------
    model:
        A name of :data:`~immersion_siml.models.MODEL_NAMES` (initial weights drawn under
        ``init_seed``), or ``package.module:function`` returning a float64 ``nn.Module`` (called
        with no arguments under ``torch.manual_seed(init_seed)``; its weights are the initial ones).
    features, targets:
        ``X`` ``(N, ...)`` and ``Y`` (rows ``(N, C)`` or integer labels, one-hot encoded with
        ``n_classes`` columns), as :func:`~immersion_siml.inputs.sample_tensors` takes them.
    plan, design:
        The training plan and the privacy design.
    init_seed, rng, secure:
        Initial weights; keys and noise (``secure``: from OS entropy).
    n_classes, loss:
        One-hot width for integer labels; ``"cross_entropy"`` or ``"mse"``.

    Returns
    -------
    tuple
        ``user`` (an :class:`immersion.Immersion`: keys, decoders, ``report()``), the
        :class:`SimlJob` for the service, and the plain initial state ``x_0``.
    """
    if loss not in LOSSES:
        raise InvalidArgumentError("loss", f"expected one of {LOSSES}, got {loss!r}")
    x, y = sample_tensors(features, targets, loss=loss, n_classes=n_classes)
    feature_shape = feature_shape_of(x)
    module = build_module(
        model, feature_shape=feature_shape, n_targets=int(y.shape[1]), seed=init_seed
    )
    flat = SimlModel(module, loss=loss)
    w0 = initial_weights(model, flat, init_seed)
    check_outputs(flat, w0, x, y)
    backend = make_backend("torch", dtype="float64")
    user, encoded_dataset, encoded_state, x0 = encode_training(
        flat, x, y, plan, w0, design=design, backend=backend, rng=rng, secure=secure
    )
    bits = design.modular_bits
    job = SimlJob(
        model,
        feature_shape,
        int(y.shape[1]),
        plan,
        user.keys if bits is not None else dataclasses.replace(user.keys, noise=None),
        np.asarray(encoded_dataset),
        np.asarray(encoded_state),
        loss,
        parameter_manifest(module),
        bits,
    )
    return user, job, x0


def key_holder(keys: Any, job: SimlJob) -> Immersion:
    """The user's handle rebuilt from saved keys and the job they encoded (to decode the service's
    answer); the user's own model code is trusted here."""
    if (job.fraction_bits is None) != (getattr(keys, "arithmetic", "float") == "float"):
        raise InvalidArgumentError(
            "keys",
            f"are {getattr(keys, 'arithmetic', 'float')} keys, but the job was encoded in "
            f"{'float' if job.fraction_bits is None else 'modular'} arithmetic",
        )
    target = job.target(allowed_models=(job.model,))
    if job.fraction_bits is not None:
        return ModularImmersion(
            keys=keys,
            target=target,  # type: ignore[arg-type]
            noise_rng=np.random.default_rng(),
            fraction_bits=job.fraction_bits,
        )
    return Immersion(
        keys=keys,
        target=target,
        backend=target.backend,  # type: ignore[arg-type]
        noise_rng=np.random.default_rng(),
    )


def decoded_tensor(user: Immersion, values: Any) -> Any:
    """A value the user decoded, as a float64 tensor of the target's backend (integer keys decode
    to numpy)."""
    return user.target.backend.asarray(values) if isinstance(values, np.ndarray) else values


def decode_model(user: Immersion, encoded_model: Any, encoded_first_sample: Any) -> Any:
    """``w* = Pi3_left (w~* - Pi4 y~_0)`` (eq. 45), as a float64 tensor.

    With integer keys (``arithmetic="modular"``) the decoding is exact modulo ``2^64``: ``w*`` is
    ``2^-f q(w_T)``, bit for bit the fixed-point twin's model.

    Parameters
    ----------
    user:
        The key holder's handle (:func:`prepare_job`'s first output, or rebuilt from saved keys).
    encoded_model:
        The service's answer ``w~*``.
    encoded_first_sample:
        ``y~_0``, the first row of the encoded dataset (its noise masks the model).

    Returns
    -------
    torch.Tensor
        The flat parameter vector ``w*``.
    """
    return decoded_tensor(user, user.decode_output(encoded_model, encoded_first_sample))


def decode_state(user: Immersion, encoded_state: Any) -> Any:
    """``x_t = Pi2_left x~_t``, as a float64 tensor (the user's view of an iterate)."""
    return decoded_tensor(user, user.decode_state(encoded_state))


def _checked_path(path: str | os.PathLike[str], overwrite: bool) -> Path:
    return writable_path(
        path, overwrite=overwrite, error=SimlFileError, overwrite_hint="overwrite=True (--force)"
    )


def job_meta(job: SimlJob) -> dict[str, Any]:
    """The JSON part of a version-2 job file."""
    return {
        "model": job.model,
        "feature_shape": list(job.feature_shape),
        "n_targets": job.n_targets,
        "loss": job.loss,
        "parameters": None
        if job.parameters is None
        else [[name, list(shape)] for name, shape in job.parameters],
        "plan": dataclasses.asdict(job.plan),
        "keys": keys_meta(job.public_keys)
        if job.fraction_bits is None
        else modular_meta(job.public_keys),
        "arithmetic": "float" if job.fraction_bits is None else "modular",
        "fraction_bits": job.fraction_bits,
    }


def save_job(job: SimlJob, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write the job file for the service (atomic, mode 0600).

    Parameters
    ----------
    job:
        :func:`prepare_job`'s :class:`SimlJob` (public target, encoded dataset and state, plan).
    path:
        Where to write it; nothing is left there if writing fails.
    overwrite:
        Replace an existing file (otherwise it is refused).

    Returns
    -------
    pathlib.Path
        The file written.
    """
    if not isinstance(job, SimlJob):
        raise InvalidArgumentError("job", f"expected a SimlJob, got {type(job).__name__}")
    target = _checked_path(path, overwrite)
    meta = job_meta(job)
    arrays = {
        **(key_arrays(job.public_keys) if job.fraction_bits is None else job.public_keys.arrays()),
        "encoded_dataset": job.encoded_dataset,
        "encoded_state": job.encoded_state,
    }
    write_signed(target, JOB_MAGIC, meta, arrays, prefix=".siml-job-")
    return target


def load_job(path: str | os.PathLike[str]) -> SimlJob:
    """Read a job file written by :func:`save_job` (version 2, or version 1 of the first SIML
    releases); refuse foreign, truncated or modified files. Imports nothing.

    Parameters
    ----------
    path:
        The job file.

    Returns
    -------
    SimlJob
        Its contents (integer keys and ``uint64`` arrays for a modular job).

    Raises
    ------
    SimlFileError
        The file is missing, foreign, truncated, modified or malformed.
    """
    source = as_path(path)
    try:
        with open(source, "rb") as fh:
            head = fh.read(len(JOB_MAGIC_V1))
    except OSError:
        head = b""
    version = 1 if head == JOB_MAGIC_V1 else 2
    meta, arrays = read_signed(
        source,
        JOB_MAGIC_V1 if version == 1 else JOB_MAGIC,
        what="SIML job",
        error=SimlFileError,
        private=False,
    )
    try:
        if not isinstance(meta, dict):
            raise ValueError("its metadata is not a JSON object")
        plan = TrainingPlan(**meta["plan"])
        arithmetic = meta.get("arithmetic", "float")
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic {arithmetic!r} is not one of {ARITHMETICS}")
        bits = None if arithmetic == "float" else check_fraction_bits(meta["fraction_bits"])
        keys: Any = (
            keys_from_arrays(meta["keys"], arrays, source=source)
            if bits is None
            else modular_keys_from_arrays(meta["keys"], arrays, source=source)
        )
        model = meta["model"]
        if not isinstance(model, str):
            raise ValueError(f"model {model!r} is not a name or an import path")
        if version == 1:
            feature_shape, n_targets = _shape(meta["image_shape"]), _count(meta["n_classes"])
            if len(feature_shape) != 3:
                raise ValueError(f"image shape {feature_shape} is not (C, H, W)")
            loss, parameters = "cross_entropy", None
        else:
            feature_shape, n_targets = _shape(meta["feature_shape"]), _count(meta["n_targets"])
            loss = meta["loss"]
            if loss not in LOSSES:
                raise ValueError(f"loss {loss!r} is not one of {LOSSES}")
            parameters = _manifest(meta["parameters"])
        if SampleLayout(feature_shape, n_targets).n_sample != keys.dims["n_input"]:
            raise ValueError(
                f"samples of shape {feature_shape} with {n_targets} targets do not fit the keys"
            )
        dataset = _finite(
            arrays["encoded_dataset"],
            "encoded_dataset",
            (None, keys.input_code.n_total),
            modular=bits is not None,
        )
        state = _finite(
            arrays["encoded_state"],
            "encoded_state",
            (keys.state_code.n_total,),
            modular=bits is not None,
        )
        return SimlJob(
            model, feature_shape, n_targets, plan, keys, dataset, state, loss, parameters, bits
        )
    except (KeyError, TypeError, ValueError, InvalidArgumentError) as exc:
        raise SimlFileError(f"path: {source} is malformed ({exc})") from None


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is not a count >= 1")
    return value


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 8:
        raise ValueError(f"{value!r} is not a sample shape")
    return tuple(_count(s) for s in value)


def _manifest(value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError("its parameter list is empty or not a list")
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"parameter entry {item!r} is not [name, shape]")
        out.append((item[0], _shape(item[1])))
    return tuple(out)


def _finite(
    arr: np.ndarray, name: str, shape: tuple[int | None, ...], *, modular: bool = False
) -> np.ndarray:
    """``arr`` as float64 if it is a finite real array of ``shape`` (``None``: any length >= 1);
    with ``modular``, a ``uint64`` array of ``shape`` (integers modulo ``2^64``), unchanged."""
    if modular and arr.dtype != np.uint64:
        raise ValueError(f"{name} is not a uint64 array (integers modulo 2^64): {arr.dtype}")
    if (
        arr.dtype.kind not in "fiu"
        or arr.ndim != len(shape)
        or arr.size == 0
        or any(want is not None and got != want for got, want in zip(arr.shape, shape, strict=True))
    ):
        raise ValueError(f"{name} is not a real array of shape {shape}: {arr.dtype}, {arr.shape}")
    if modular:
        return arr
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
        encoded = arrays["encoded_model"]
        modular = encoded.dtype == np.uint64
        return _finite(encoded, "encoded_model", (None,), modular=modular), info
    except (KeyError, ValueError) as exc:
        raise SimlFileError(f"path: {source} is malformed ({exc})") from None
