"""The models of seed 002 Table I as float64 torch modules, and their digits-sized counterparts.

* ``mlp64``: MLP d-64-64-10 with ReLU (784 inputs: 55,050 parameters; digits' 64: 8,970);
* ``nn-x2``: d-16-10 with the square activation (784: 12,730; 64: 1,210), the network the
  paper trains under CKKS;
* ``cnn``: Conv5x5(32)-MaxPool2-Conv5x5(64)-MaxPool2-Dense512-Dense10 (28x28: 582,026). On
  images smaller than 16x16 (digits' 8x8) the convolutions pad by 2 ("same"), giving 188,810.

``mlp64`` and ``nn-x2`` flatten features of any shape; ``cnn`` needs images ``(C, H, W)``.
A user's own module is trained the same way (:func:`immersion_siml.train`).

Loss: softmax cross-entropy against probability targets (one-hot rows), so decoded labels that
carry rounding noise go through exactly the same formula as exact ones; or the mean squared error
against target rows (``loss="mse"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from immersion import InvalidArgumentError
from immersion_fl.runtime.models import FlatModel, build_model, count_parameters

#: Model names accepted by ``immersion siml run --model`` (besides ``package.module:function``).
MODEL_NAMES = ("mlp64", "nn-x2", "cnn")
#: Losses of :class:`SimlModel`.
LOSSES = ("cross_entropy", "mse")


def _square_module() -> Any:
    import torch

    class Square(torch.nn.Module):
        """``x -> x**2`` (the activation CKKS can evaluate)."""

        def forward(self, x: Any) -> Any:
            return x * x

    return Square()


def build_siml_model(name: str, *, feature_shape: tuple[int, ...], n_classes: int = 10) -> Any:
    """A float64 ``nn.Module`` for ``name`` in :data:`MODEL_NAMES` on samples of ``feature_shape``.

    Examples
    --------
    >>> [count_parameters(build_siml_model(m, feature_shape=(1, 28, 28))) for m in MODEL_NAMES]
    [55050, 12730, 582026]
    >>> [count_parameters(build_siml_model(m, feature_shape=(1, 8, 8))) for m in MODEL_NAMES]
    [8970, 1210, 188810]
    >>> count_parameters(build_siml_model("nn-x2", feature_shape=(13,), n_classes=3))
    275
    """
    import torch

    nn = torch.nn
    n_features = math.prod(feature_shape)
    if name == "mlp64":
        return build_model(
            "mlp", image_shape=(1, 1, n_features), n_classes=n_classes, hidden=(64, 64)
        )
    if name == "nn-x2":
        model = nn.Sequential(
            nn.Flatten(), nn.Linear(n_features, 16), _square_module(), nn.Linear(16, n_classes)
        )
        return model.to(torch.float64)
    if name == "cnn":
        if len(feature_shape) != 3:
            raise InvalidArgumentError(
                "model", f"cnn needs images (C, H, W), got samples of shape {feature_shape}"
            )
        c, h, w = feature_shape
        if h >= 16 and w >= 16:
            return build_model("cnn2", image_shape=(c, h, w), n_classes=n_classes)
        if h < 4 or w < 4:
            raise InvalidArgumentError("model", f"cnn needs images of at least 4x4, got {h}x{w}")
        flat = 64 * (h // 4) * (w // 4)
        model = nn.Sequential(
            nn.Conv2d(c, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(flat, 512),
            nn.ReLU(),
            nn.Linear(512, n_classes),
        )
        return model.to(torch.float64)
    raise InvalidArgumentError("model", f"expected one of {', '.join(MODEL_NAMES)}, got {name!r}")


@dataclass
class SimlModel(FlatModel):
    """A model evaluated at a flat parameter vector, trained against target rows.

    Parameters
    ----------
    module:
        A float64 ``nn.Module`` (its parameters only are used; it is never modified by training).
    loss:
        ``"cross_entropy"``: mean softmax cross-entropy against probability rows (what SIML
        uses); ``"mse"``: mean squared error over every output entry (``torch``'s ``mse_loss``).
    """

    loss: str = "cross_entropy"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in LOSSES:
            raise InvalidArgumentError("loss", f"expected one of {LOSSES}, got {self.loss!r}")

    def _loss(self, logits: Any, y: Any) -> Any:
        if self.loss == "mse":
            return ((logits - y) ** 2).mean()
        return -(y * self._torch.log_softmax(logits, dim=1)).sum() / logits.shape[0]

    def loss_and_grad(self, vector: Any, x: Any, y: Any) -> tuple[float, Any]:
        """The loss against the rows of ``y`` (one-hot, probabilities or decoded) and its
        gradient."""
        torch = self._torch
        w = vector.detach().requires_grad_(True)
        loss = self._loss(self.logits(w, x), y)
        (grad,) = torch.autograd.grad(loss, w)
        return float(loss.detach()), grad

    def mean_loss(self, vector: Any, x: Any, y: Any, *, batch: int = 2048) -> float:
        """The loss over all of ``x, y`` (target rows), evaluated in chunks of ``batch``."""
        total = 0.0
        with self._torch.no_grad():
            for i in range(0, len(x), batch):
                chunk = self._loss(self.logits(vector, x[i : i + batch]), y[i : i + batch])
                total += float(chunk) * len(x[i : i + batch])
        return total / len(x)

    def accuracy(self, vector: Any, x: Any, y: Any, *, batch: int = 2048) -> float:
        """Share of samples whose largest output is the class of ``y`` (labels or rows' argmax)."""
        labels = y.argmax(1) if y.ndim == 2 else y
        correct = 0
        with self._torch.no_grad():
            for i in range(0, len(x), batch):
                out = self.logits(vector, x[i : i + batch])
                correct += int((out.argmax(1) == labels[i : i + batch]).sum())
        return correct / len(x)


def siml_model(
    name: str, *, feature_shape: tuple[int, ...], n_classes: int = 10, loss: str = "cross_entropy"
) -> SimlModel:
    """:class:`SimlModel` around :func:`build_siml_model`."""
    return SimlModel(
        build_siml_model(name, feature_shape=feature_shape, n_classes=n_classes), loss=loss
    )


__all__ = [
    "LOSSES",
    "MODEL_NAMES",
    "SimlModel",
    "build_siml_model",
    "count_parameters",
    "siml_model",
]
