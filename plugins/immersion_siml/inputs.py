"""The user's own module and data for SIML, checked: what :func:`immersion_siml.train` and the
CLI's ``--model package.module:function`` / ``--dataset package.module:function`` accept.

* a module: a float64 ``torch.nn.Module`` with parameters only (no buffers such as BatchNorm's
  running statistics, which the target optimizer of seed 002 eq. 44 does not carry) and no
  dropout in training mode (a random step could not be reproduced);
* features ``X``: a real array ``(N, ...)`` of any sample shape; targets ``Y``: probability or
  one-hot rows ``(N, C)``, or integer class labels ``(N,)`` (one-hot encoded here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from immersion import InvalidArgumentError, NonFiniteError
from immersion import validation as v
from immersion.imports import call_loader, is_import_path

from .models import MODEL_NAMES, SimlModel, build_siml_model


def require_torch() -> Any:
    """torch, or an OptionalDependencyError naming the ``torch`` extra."""
    from immersion_fl.runtime.user_model import require_torch as torch_or_error

    return torch_or_error("SIML on a torch module")


def check_module(model: Any) -> None:
    """Refuse what the target optimizer cannot train, naming ``model``.

    Parameters
    ----------
    model:
        The user's module.

    Examples
    --------
    >>> import torch
    >>> check_module(torch.nn.Linear(3, 2).double())
    >>> check_module(torch.nn.BatchNorm1d(3).double())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: model: has buffers ['running_mean', ...] ...
    """
    from immersion_fl.runtime.user_model import check_module as check_parameters

    check_parameters(model, carrier="SIML's encoded state", purpose="SIML on a torch module")
    torch = require_torch()
    dropout = [
        name or type(m).__name__
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]
    if dropout:
        raise InvalidArgumentError(
            "model",
            f"has dropout in training mode ({dropout[:3]}): a random step cannot be reproduced "
            "exactly; call model.eval() to train without it, or remove it",
        )


def parameter_manifest(model: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``((name, shape), ...)`` of the module's parameters in order: what a job file records so
    that the service can check it rebuilt the same architecture.

    Examples
    --------
    >>> import torch
    >>> parameter_manifest(torch.nn.Linear(3, 2))
    (('weight', (2, 3)), ('bias', (2,)))
    """
    return tuple((name, tuple(int(s) for s in p.shape)) for name, p in model.named_parameters())


def sample_tensors(
    X: Any, Y: Any, *, loss: str = "cross_entropy", n_classes: int | None = None
) -> tuple[Any, Any]:
    """``(features, target rows)`` as float64 tensors, checked, naming ``X`` or ``Y``.

    Parameters
    ----------
    X:
        A real array or tensor ``(N, ...)``.
    Y:
        Probability or one-hot rows ``(N, C)``; integer class labels ``(N,)`` (one-hot encoded
        with ``n_classes`` columns, default ``max(Y) + 1``); with ``loss="mse"`` also real rows of
        any sign, or a real vector ``(N,)`` (one column).
    loss:
        ``"cross_entropy"`` (rows must be >= 0) or ``"mse"``.
    n_classes:
        Columns of the one-hot rows for integer labels.

    Examples
    --------
    >>> x, y = sample_tensors([[0.5, 1.0], [2.0, 0.0], [1.0, 1.0]], [2, 0, 1])
    >>> tuple(x.shape), y.tolist()
    ((3, 2), [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    """
    torch = require_torch()
    x = _real_tensor(X, "X")
    if x.ndim < 1 or len(x) == 0:
        raise InvalidArgumentError(
            "X", f"expected an array (N, ...) with N >= 1, got shape {tuple(x.shape)}"
        )
    y = _real_tensor(Y, "Y", integers=True)
    if y.ndim not in (1, 2):
        raise InvalidArgumentError(
            "Y", f"expected rows (N, C) or class labels (N,), got shape {tuple(y.shape)}"
        )
    if len(y) != len(x):
        raise InvalidArgumentError("Y", f"has {len(y)} rows but X has {len(x)} samples")
    if y.ndim == 1 and not y.is_floating_point():
        if bool((y < 0).any()):
            raise InvalidArgumentError("Y", "class labels must be >= 0")
        width = int(y.max()) + 1 if n_classes is None else v.positive_int("n_classes", n_classes)
        if int(y.max()) >= width:
            raise InvalidArgumentError("Y", f"has label {int(y.max())}, but n_classes is {width}")
        y = torch.nn.functional.one_hot(y.long(), width).to(torch.float64)
    elif y.ndim == 1:
        if loss != "mse":
            raise InvalidArgumentError(
                "Y",
                "is a real vector: give integer class labels (N,) or probability rows (N, C) "
                "for cross-entropy (a real vector is a target column for loss='mse')",
            )
        y = y.reshape(-1, 1)
    y = y.to(torch.float64)
    if loss != "mse" and bool((y < 0).any()):
        raise InvalidArgumentError("Y", "rows must be probabilities (>= 0) for cross-entropy")
    return x, y


def _real_tensor(value: Any, name: str, *, integers: bool = False) -> Any:
    """A float64 tensor from a real array (integer arrays stay integers if ``integers``)."""
    torch = require_torch()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(name, f"expected a real array ({exc})") from None
        if arr.dtype.kind not in "fiub":
            raise InvalidArgumentError(name, f"expected a real array, got dtype {arr.dtype}")
        t = torch.as_tensor(arr)
    if t.is_complex() or t.dtype == torch.bool:
        raise InvalidArgumentError(name, f"expected a real array, got {t.dtype}")
    if not (integers and not t.is_floating_point()):
        t = t.to(torch.float64)
        if not bool(torch.isfinite(t).all()):
            raise NonFiniteError(name, "contains NaN or inf")
    return t


def check_outputs(model: SimlModel, w0: Any, features: Any, targets: Any) -> None:
    """Run the module on two samples: refuse features it cannot take (naming ``X``) and outputs
    that do not match the target rows (naming ``Y``)."""
    try:
        out = model.logits(w0, features[:2])
    except Exception as exc:  # noqa: BLE001 - any error of the user's forward on these features
        raise InvalidArgumentError(
            "X",
            f"the model cannot take samples of shape {tuple(features.shape[1:])} "
            f"({type(exc).__name__}: {exc})",
        ) from None
    want = (min(2, len(features)), int(targets.shape[1]))
    if tuple(out.shape) != want:
        raise InvalidArgumentError(
            "Y",
            f"has {want[1]} columns, but the model's output for {want[0]} samples has shape "
            f"{tuple(out.shape)} (expected {want})",
        )


@dataclass(frozen=True)
class UserData:
    """A dataset from the user's loader: training features and target rows, optional test split."""

    x_train: Any
    y_train: Any
    x_test: Any | None
    y_test: Any | None
    name: str

    @property
    def n_targets(self) -> int:
        return int(self.y_train.shape[1])


def load_user_data(path: str, *, n_classes: int | None = None) -> UserData:
    """Call ``package.module:function`` (no arguments); it returns ``(X, Y)`` or
    ``(X, Y, X_test, Y_test)`` (numpy arrays or torch tensors, as :func:`sample_tensors` takes).

    Parameters
    ----------
    path:
        The loader's import path.
    n_classes:
        Columns of the one-hot rows for integer labels (default: the largest label + 1 over
        both splits).
    """
    loaded = call_loader(path, argument="dataset")
    if not isinstance(loaded, (tuple, list)) or len(loaded) not in (2, 4):
        raise InvalidArgumentError(
            "dataset", f"{path} must return (X, Y) or (X, Y, X_test, Y_test)"
        )
    if n_classes is None:
        labels = [np.asarray(y) for y in loaded[1::2] if np.asarray(y).ndim == 1]
        if labels and all(y.dtype.kind in "iu" and y.size for y in labels):
            n_classes = int(max(y.max() for y in labels)) + 1
    try:
        x, y = sample_tensors(loaded[0], loaded[1], n_classes=n_classes)
        test = (
            sample_tensors(loaded[2], loaded[3], n_classes=n_classes) if len(loaded) == 4 else None
        )
    except InvalidArgumentError as exc:
        raise InvalidArgumentError("dataset", f"{path}: {exc}") from None
    if test is not None and (test[0].shape[1:] != x.shape[1:] or test[1].shape[1] != y.shape[1]):
        raise InvalidArgumentError(
            "dataset", f"{path}: the test split's shapes differ from the training split's"
        )
    x_test, y_test = test if test is not None else (None, None)
    return UserData(x, y, x_test, y_test, name=path)


def load_data(spec: str, *, seed: int = 0) -> Any:
    """A dataset by name: the SDK's (``digits``, ``digits28``, ``mnist:PATH``, ``fashion:PATH``,
    an ``immersion_fl.runtime.data.Dataset``) or the user's loader ``package.module:function``
    (:func:`load_user_data`).

    Parameters
    ----------
    spec:
        The name or import path.
    seed:
        The SDK datasets' train/test split seed.
    """
    if is_import_path(spec) and spec.partition(":")[0] not in ("mnist", "fashion"):
        return load_user_data(spec)
    from immersion_fl.runtime.data import load_dataset

    return load_dataset(spec, seed=seed)


def build_module(
    source: str,
    *,
    feature_shape: tuple[int, ...],
    n_targets: int,
    seed: int,
    allow_import: bool = True,
) -> Any:
    """The module named by ``source``: one of :data:`MODEL_NAMES`, or ``package.module:function``
    called with no arguments under ``torch.manual_seed(seed)`` (so its initial weights repeat).

    ``allow_import=False`` refuses import paths (the service imports only code it trusts).
    """
    torch = require_torch()
    if isinstance(source, str) and source in MODEL_NAMES:
        return build_siml_model(source, feature_shape=feature_shape, n_classes=n_targets)
    if not is_import_path(source):
        raise InvalidArgumentError(
            "model",
            f"expected one of {', '.join(MODEL_NAMES)} or package.module:function, got {source!r}",
        )
    if not allow_import:
        raise InvalidArgumentError(
            "model",
            f"{source} is user code: the service imports it only when allowed "
            f"(immersion siml serve --allow-model {source})",
        )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        module = call_loader(source, argument="model")
    check_module(module)
    return module


def initial_weights(source: str, model: SimlModel, seed: int) -> Any:
    """``w_0``: the SDK's initialiser under ``seed`` for :data:`MODEL_NAMES`, the module's own
    parameters (built under that seed) for user code."""
    torch = require_torch()
    if source in MODEL_NAMES:
        return model.initial_vector(seed)
    return torch.nn.utils.parameters_to_vector(model.module.parameters()).detach().clone()


def feature_shape_of(features: Any) -> tuple[int, ...]:
    """The sample shape ``X.shape[1:]``, refused if one sample has no entries."""
    shape = tuple(int(s) for s in features.shape[1:])
    if math.prod(shape) == 0:
        raise InvalidArgumentError("X", f"samples of shape {shape} have no entries")
    return shape
