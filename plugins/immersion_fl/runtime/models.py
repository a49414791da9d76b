"""The papers' models (seed 000 Table 3) as torch modules driven by one flat parameter vector.

* ``linear``: softmax regression (seed 001's linear model), e.g. 64 x 10 + 10 = 650 parameters;
* ``mlp``: fully connected with ReLU, e.g. 784-200-200-10 = 199,210 parameters;
* ``cnn``: Conv3x3(32)-Conv3x3(64)-MaxPool2-Dense128-Dense10 = 1,199,882 for 28x28 (valid padding);
* ``cnn2``: Conv5x5(32)-MaxPool2-Conv5x5(64)-MaxPool2-Dense512-Dense10 = 582,026 for 28x28.

Dropout is left out so that a run is a deterministic function of the data order (needed to
compare a scheme with plain FedAvg step by step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from immersion import InvalidArgumentError

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from torch.nn import Module


def _torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        from immersion import OptionalDependencyError

        raise OptionalDependencyError("torch", "torch", "federated learning models") from None
    return torch


def build_model(
    name: str,
    *,
    image_shape: tuple[int, int, int],
    n_classes: int,
    hidden: tuple[int, ...] = (200, 200),
) -> torch.nn.Module:
    """A torch ``nn.Module`` (float64) for ``name`` in ``linear``, ``mlp``, ``cnn``, ``cnn2``.

    Parameters
    ----------
    name:
        The model name.
    image_shape:
        ``(channels, height, width)`` of the inputs.
    n_classes:
        The number of outputs.
    hidden:
        Hidden layer sizes (``mlp`` only).

    Examples
    --------
    >>> count_parameters(build_model("mlp", image_shape=(1, 28, 28), n_classes=10))
    199210
    >>> count_parameters(build_model("cnn", image_shape=(1, 28, 28), n_classes=10))
    1199882
    >>> count_parameters(build_model("cnn2", image_shape=(1, 28, 28), n_classes=10))
    582026
    """
    torch = _torch()
    nn = torch.nn
    c, h, w = image_shape
    if name == "linear":
        model = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, n_classes))
    elif name == "mlp":
        if not hidden or any(k < 1 for k in hidden):
            raise InvalidArgumentError("hidden", f"expected positive layer sizes, got {hidden}")
        layers: list[Module] = [nn.Flatten()]
        width = c * h * w
        for k in hidden:
            layers += [nn.Linear(width, k), nn.ReLU()]
            width = k
        layers.append(nn.Linear(width, n_classes))
        model = nn.Sequential(*layers)
    elif name == "cnn":
        if h < 6 or w < 6:
            raise InvalidArgumentError(
                "model", f"cnn needs images of at least 6x6, got {h}x{w}; use digits28"
            )
        flat = 64 * ((h - 4) // 2) * ((w - 4) // 2)
        model = nn.Sequential(
            nn.Conv2d(c, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(flat, 128),
            nn.ReLU(),
            nn.Linear(128, n_classes),
        )
    elif name == "cnn2":
        if h < 16 or w < 16:
            raise InvalidArgumentError(
                "model", f"cnn2 needs images of at least 16x16, got {h}x{w}; use digits28"
            )
        flat = 64 * (((h - 4) // 2 - 4) // 2) * (((w - 4) // 2 - 4) // 2)
        model = nn.Sequential(
            nn.Conv2d(c, 32, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(flat, 512),
            nn.ReLU(),
            nn.Linear(512, n_classes),
        )
    else:
        raise InvalidArgumentError("model", f"expected linear, mlp, cnn or cnn2, got {name!r}")
    return model.to(torch.float64)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters.

    Parameters
    ----------
    model:
        A torch module.
    """
    return int(sum(p.numel() for p in model.parameters()))


@dataclass
class FlatModel:
    """A module evaluated at a flat parameter vector: loss gradients and accuracy (torch.func).

    Parameters
    ----------
    module:
        The torch module; its parameters' order and shapes define the flat vector.
    """

    module: torch.nn.Module

    def __post_init__(self) -> None:
        torch = _torch()
        self._torch = torch
        self._names = [n for n, _ in self.module.named_parameters()]
        self._shapes = [p.shape for _, p in self.module.named_parameters()]
        self._sizes = [p.numel() for _, p in self.module.named_parameters()]
        self.n_params = sum(self._sizes)

    def initial_vector(self, seed: int) -> torch.Tensor:
        """Deterministic initial parameters (torch's default initialisers under ``seed``).

        Parameters
        ----------
        seed:
            Seeds torch's initialisers (the global torch generator is restored after).
        """
        torch = self._torch
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for layer in self.module.modules():
                if hasattr(layer, "reset_parameters"):
                    layer.reset_parameters()  # type: ignore[operator]  # Module.__getattr__
        return torch.nn.utils.parameters_to_vector(self.module.parameters()).detach().clone()

    def _params(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        chunks = self._torch.split(vector, self._sizes)
        return {n: c.view(s) for n, c, s in zip(self._names, chunks, self._shapes, strict=True)}

    def logits(self, vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The module's output on ``x`` with parameters ``vector``.

        Parameters
        ----------
        vector:
            A flat parameter vector.
        x:
            A batch of inputs.
        """
        return self._torch.func.functional_call(self.module, self._params(vector), (x,))

    def loss_and_grad(
        self, vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """Mean cross-entropy (against class indices or probability rows ``y``) and its gradient
        with respect to the flat vector.

        Parameters
        ----------
        vector:
            A flat parameter vector.
        x, y:
            A batch of inputs and targets.
        """
        torch = self._torch
        w = vector.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(self.logits(w, x), y)
        (grad,) = torch.autograd.grad(loss, w)
        return float(loss.detach()), grad

    def evaluate(
        self, vector: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *, batch: int = 2048
    ) -> tuple[float, float]:
        """(accuracy, mean loss) on ``x, y`` (class indices, or rows whose argmax is the class).

        Parameters
        ----------
        vector:
            A flat parameter vector.
        x, y:
            Inputs and targets.
        batch:
            Rows evaluated at once.
        """
        torch = self._torch
        correct, total_loss = 0, 0.0
        with torch.no_grad():
            for i in range(0, len(x), batch):
                out = self.logits(vector, x[i : i + batch])
                total_loss += float(
                    torch.nn.functional.cross_entropy(out, y[i : i + batch], reduction="sum")
                )
                labels = y[i : i + batch]
                labels = labels.argmax(1) if labels.ndim == 2 else labels  # probability rows
                correct += int((out.argmax(1) == labels).sum())
        return correct / len(x), total_loss / len(x)
