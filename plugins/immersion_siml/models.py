"""The models of seed 002 Table I as float64 torch modules, and their digits-sized counterparts.

* ``mlp64``: MLP d-64-64-10 with ReLU (784 inputs: 55,050 parameters; digits' 64: 8,970);
* ``nn-x2``: d-16-10 with the square activation (784: 12,730; 64: 1,210), the network the
  paper trains under CKKS;
* ``cnn``: Conv5x5(32)-MaxPool2-Conv5x5(64)-MaxPool2-Dense512-Dense10 (28x28: 582,026). On
  images smaller than 16x16 (digits' 8x8) the convolutions pad by 2 ("same"), giving 188,810.

Loss: softmax cross-entropy against probability targets (one-hot rows), so decoded labels that
carry rounding noise go through exactly the same formula as exact ones.
"""

from __future__ import annotations

from typing import Any

from immersion import InvalidArgumentError
from immersion_fl.models import FlatModel, build_model, count_parameters

#: Model names accepted by ``immersion siml run --model``.
MODEL_NAMES = ("mlp64", "nn-x2", "cnn")


def _square_module() -> Any:
    import torch

    class Square(torch.nn.Module):
        """``x -> x**2`` (the activation CKKS can evaluate)."""

        def forward(self, x: Any) -> Any:
            return x * x

    return Square()


def build_siml_model(name: str, *, image_shape: tuple[int, int, int], n_classes: int = 10) -> Any:
    """A float64 ``nn.Module`` for ``name`` in :data:`MODEL_NAMES`.

    Examples
    --------
    >>> [count_parameters(build_siml_model(m, image_shape=(1, 28, 28))) for m in MODEL_NAMES]
    [55050, 12730, 582026]
    >>> [count_parameters(build_siml_model(m, image_shape=(1, 8, 8))) for m in MODEL_NAMES]
    [8970, 1210, 188810]
    """
    import torch

    nn = torch.nn
    c, h, w = image_shape
    if name == "mlp64":
        return build_model("mlp", image_shape=image_shape, n_classes=n_classes, hidden=(64, 64))
    if name == "nn-x2":
        model = nn.Sequential(
            nn.Flatten(), nn.Linear(c * h * w, 16), _square_module(), nn.Linear(16, n_classes)
        )
        return model.to(torch.float64)
    if name == "cnn":
        if h >= 16 and w >= 16:
            return build_model("cnn2", image_shape=image_shape, n_classes=n_classes)
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


class SimlModel(FlatModel):
    """A model evaluated at a flat parameter vector, trained against probability targets."""

    def loss_and_grad(self, vector: Any, x: Any, y: Any) -> tuple[float, Any]:
        """Mean softmax cross-entropy against the rows of ``y`` (one-hot or decoded) and its gradient."""
        torch = self._torch
        w = vector.detach().requires_grad_(True)
        logits = self.logits(w, x)
        loss = -(y * torch.log_softmax(logits, dim=1)).sum() / x.shape[0]
        (grad,) = torch.autograd.grad(loss, w)
        return float(loss.detach()), grad


def siml_model(name: str, *, image_shape: tuple[int, int, int], n_classes: int = 10) -> SimlModel:
    """:class:`SimlModel` around :func:`build_siml_model`."""
    return SimlModel(build_siml_model(name, image_shape=image_shape, n_classes=n_classes))


__all__ = ["MODEL_NAMES", "SimlModel", "build_siml_model", "count_parameters", "siml_model"]
