"""The user's module and data, checked: what :func:`immersion_fl.run` and the runner's
``--model pkg.mod:fn`` / ``--dataset pkg.mod:fn`` take (:func:`check_module`,
:func:`client_tensors`, :func:`check_targets`, :func:`check_outputs`).

A leaf of the package: it imports neither the engines nor :mod:`immersion_fl.api` (which
re-exports these names), so :mod:`immersion_fl.runtime.federation` can use it without an import
cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from immersion import InvalidArgumentError

if TYPE_CHECKING:
    from types import ModuleType

    import torch

__all__ = ["check_module", "check_outputs", "check_targets", "client_tensors", "require_torch"]


def check_module(
    model: Any,
    *,
    carrier: str = "federated averaging of parameters",
    purpose: str = "immersion_fl.run",
) -> None:
    """Refuse what the federated schemes cannot train: not a module, no parameters, buffers,
    parameters other than float64 (SIML's check adds its own rules to this one).

    Parameters
    ----------
    model:
        The user's module.
    carrier:
        What does not carry buffers, for the refusal's message.
    purpose:
        What needs torch, for the error without it.
    """
    torch = require_torch(purpose)
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            "model", f"expected a torch.nn.Module, got {type(model).__name__}"
        )
    params = list(model.named_parameters())
    if not params:
        raise InvalidArgumentError("model", "has no parameters to train")
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise InvalidArgumentError(
            "model",
            f"has buffers {buffers[:3]} (e.g. BatchNorm running statistics), which {carrier} "
            "does not carry; use a module without buffers (e.g. GroupNorm/LayerNorm instead of "
            "BatchNorm)",
        )
    wrong = [f"{name} ({p.dtype})" for name, p in params if p.dtype != torch.float64]
    if wrong:
        raise InvalidArgumentError(
            "model", f"parameters must be float64 (call model.double()); got {wrong[:3]}"
        )


def require_torch(purpose: str = "immersion_fl.run") -> ModuleType:
    """torch, or an error naming the ``torch`` extra.

    Parameters
    ----------
    purpose:
        What needs torch, for the message.
    """
    try:
        import torch
    except ImportError:
        from immersion import OptionalDependencyError

        raise OptionalDependencyError("torch", "torch", purpose) from None
    return torch


def client_tensors(
    index: int, item: Any, *, argument: str = "client_data", part: str = ""
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``(X, Y)`` as float64 inputs and targets (int64 labels or float64 rows), checked.

    Parameters
    ----------
    index:
        The client's index for messages (-1: not a client's data).
    item:
        An ``(X, Y)`` pair of arrays or tensors, or a torch ``Dataset`` of ``(x, y)`` items.
    argument:
        The argument name errors start with.
    part:
        What the data is, after the argument name in errors (e.g. the loader and split), when
        it is not a client's (``index`` -1); empty: nothing.

    Returns
    -------
    tuple of torch.Tensor
        ``X`` as float64 and ``Y`` as int64 class indices or float64 rows.
    """
    torch = require_torch()
    where = f"client {index}: " if index >= 0 else f"{part}: " if part else ""
    if isinstance(item, torch.utils.data.Dataset) and not isinstance(item, tuple):
        try:
            pairs = [item[i] for i in range(len(item))]  # type: ignore[arg-type]
            x = torch.stack([torch.as_tensor(p[0]) for p in pairs])
            y = torch.stack([torch.as_tensor(p[1]) for p in pairs])
        except Exception as exc:  # noqa: BLE001 - any dataset that does not give (x, y) items
            raise InvalidArgumentError(
                argument, f"{where}a Dataset must give (x, y) items ({exc})"
            ) from None
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        x, y = (
            torch.as_tensor(np.asarray(v) if not isinstance(v, torch.Tensor) else v) for v in item
        )
    else:
        raise InvalidArgumentError(argument, f"{where}expected an (X, Y) pair or a torch Dataset")
    if x.ndim < 1 or len(x) == 0:
        raise InvalidArgumentError(argument, f"{where}X is empty")
    if len(x) != len(y):
        raise InvalidArgumentError(argument, f"{where}X has {len(x)} rows but Y has {len(y)}")
    if not (x.is_floating_point() or x.dtype in (torch.int64, torch.int32, torch.uint8)):
        raise InvalidArgumentError(argument, f"{where}X must be numeric, got {x.dtype}")
    x = x.to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise InvalidArgumentError(argument, f"{where}X contains NaN or inf")
    if y.ndim == 1 and not y.is_floating_point():
        y = y.to(torch.long)
        if bool((y < 0).any()):
            raise InvalidArgumentError(argument, f"{where}class indices in Y must be >= 0")
    elif y.ndim == 2:
        y = y.to(torch.float64)
        if not bool(torch.isfinite(y).all()) or bool((y < 0).any()):
            raise InvalidArgumentError(
                argument, f"{where}Y rows must be finite probabilities (>= 0)"
            )
    else:
        raise InvalidArgumentError(
            argument,
            f"{where}Y must be 1-D class indices or 2-D probability rows, "
            f"got shape {tuple(y.shape)}",
        )
    return x, y


def check_targets(clients: list[tuple["torch.Tensor", "torch.Tensor"]]) -> None:
    """Refuse clients whose targets are of different kinds or whose samples differ in shape.

    Parameters
    ----------
    clients:
        Every client's ``(X, Y)`` from :func:`client_tensors`.
    """
    kinds = {(y.ndim, y.shape[1] if y.ndim == 2 else None) for _, y in clients}
    if len(kinds) > 1:
        raise InvalidArgumentError(
            "client_data",
            f"every client's Y must be of one kind (labels or rows of one "
            f"width); got {sorted(kinds, key=str)}",
        )
    shapes = {tuple(x.shape[1:]) for x, _ in clients}
    if len(shapes) > 1:
        raise InvalidArgumentError(
            "client_data", f"every client's X must have one sample shape; got {sorted(shapes)}"
        )


def check_outputs(
    model: "torch.nn.Module",
    data: list[tuple["torch.Tensor", "torch.Tensor"]],
    *,
    argument: str = "client_data",
) -> None:
    """Run the module once on two samples: refuse inputs it cannot take and outputs that do not
    fit the targets (one logit per class: as many as ``Y``'s columns, more than its largest class
    index), naming ``argument`` (or ``model`` for an output that is not one row per sample).

    Parameters
    ----------
    model:
        The user's module (checked by :func:`check_module`).
    data:
        ``(X, Y)`` pairs from :func:`client_tensors` (every client's, or the held-out data).
    argument:
        The argument name of ``data`` for errors.
    """
    torch = require_torch()
    x = data[0][0][:2]
    where = (lambda i: f"client {i}: ") if argument == "client_data" else (lambda i: "")
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:  # noqa: BLE001 - any error of the user's forward on these samples
        raise InvalidArgumentError(
            argument,
            f"the model cannot take samples of shape {tuple(x.shape[1:])} "
            f"({type(exc).__name__}: {exc})",
        ) from None
    shape = tuple(getattr(out, "shape", ()))
    if not isinstance(out, torch.Tensor) or len(shape) != 2 or shape[0] != len(x):
        raise InvalidArgumentError(
            "model",
            f"its output for {len(x)} samples must be one row of class logits per sample, "
            f"got {type(out).__name__} of shape {shape}",
        )
    classes = shape[1]
    for i, (_, y) in enumerate(data):
        if y.ndim == 2 and y.shape[1] != classes:
            raise InvalidArgumentError(
                argument,
                f"{where(i)}Y has {y.shape[1]} columns, but the model's output for {len(x)} "
                f"samples has shape {shape} (one column per class)",
            )
        if y.ndim == 1 and int(y.max()) >= classes:
            raise InvalidArgumentError(
                argument,
                f"{where(i)}Y has class index {int(y.max())}, but the model outputs {classes} "
                f"logits (classes 0 to {classes - 1})",
            )
