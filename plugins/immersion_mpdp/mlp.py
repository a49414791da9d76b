"""The model MP-DP is derived for (seed 004 section 3): a bias-free ReLU MLP with the MSE loss.

``weights[l]`` has shape ``(n_(l+1), n_l)``; ReLU follows every layer but the last; the loss of a
batch is ``mean_i 1/2 ||y_i - onehot_i||^2``. Biases, other activations and other losses are not
covered by the paper's algebra (Theorems 4 and 12), so :func:`weights_from_module` refuses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from immersion import InvalidArgumentError, OptionalDependencyError

if TYPE_CHECKING:
    from torch import Tensor


def torch_module() -> Any:
    try:
        import torch
    except ImportError:
        raise OptionalDependencyError("torch", "torch", "the mpdp scheme") from None
    return torch


def layer_sizes(n_inputs: int, hidden: Sequence[int], n_outputs: int) -> tuple[int, ...]:
    """``(n_0, ..., n_L)``, checked: MP-DP needs ``L >= 2`` layers (one hidden layer at least)."""
    if len(hidden) < 1:
        raise InvalidArgumentError(
            "hidden",
            "MP-DP needs at least one hidden layer (L >= 2; Eq. 13 is undefined for L = 1)",
        )
    sizes = (int(n_inputs), *map(int, hidden), int(n_outputs))
    if min(sizes) < 1:
        raise InvalidArgumentError("hidden", f"expected positive layer sizes, got {sizes}")
    return sizes


def init_weights(sizes: Sequence[int], seed: int) -> list[Tensor]:
    """He-uniform float64 weights, deterministic in ``seed``.

    Parameters
    ----------
    sizes : sequence of int
        Layer sizes ``(n_0, ..., n_L)``.
    seed : int
        Seed of the draw.

    Returns
    -------
    list of Tensor
        ``weights[l]`` of shape ``(n_(l+1), n_l)``.

    Examples
    --------
    >>> [tuple(w.shape) for w in init_weights((64, 32, 10), seed=0)]
    [(32, 64), (10, 32)]
    """
    torch = torch_module()
    rng = np.random.default_rng([seed, 4])
    out = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = np.sqrt(6.0 / n_in)
        out.append(torch.as_tensor(rng.uniform(-bound, bound, size=(n_out, n_in))))
    return out


def weights_from_module(module: Any) -> list[Tensor]:
    """The weight matrices of a ``torch.nn.Sequential`` of ``Linear(bias=False)`` and ``ReLU``.

    Raises a clear error for biases, other layers or a missing ReLU between linear layers.
    """
    torch = torch_module()
    nn = torch.nn
    if not isinstance(module, nn.Sequential):
        raise InvalidArgumentError(
            "module",
            f"expected an nn.Sequential of Linear(bias=False) and ReLU layers, got "
            f"{type(module).__name__} (MP-DP's algebra, seed 004, covers only that MLP)",
        )
    weights, expect_relu = [], False
    for index, layer in enumerate(module):
        if isinstance(layer, nn.Flatten) and index == 0:
            continue
        if isinstance(layer, nn.Linear):
            if layer.bias is not None:
                raise InvalidArgumentError(
                    "module",
                    f"layer {index} has a bias; MP-DP (seed 004) is derived for "
                    "bias-free MLPs: use nn.Linear(..., bias=False)",
                )
            if expect_relu:
                raise InvalidArgumentError(
                    "module", f"layer {index}: two Linear layers without a ReLU between"
                )
            weights.append(layer.weight.detach().to(torch.float64).clone())
            expect_relu = True
        elif isinstance(layer, nn.ReLU) and expect_relu:
            expect_relu = False
        else:
            raise InvalidArgumentError(
                "module",
                f"layer {index} is {type(layer).__name__}; MP-DP covers only "
                "Linear(bias=False) layers with ReLU between them",
            )
    if len(weights) < 2 or not expect_relu:
        raise InvalidArgumentError(
            "module", "expected >= 2 Linear layers, the last one without a ReLU after it"
        )
    return weights


def forward(weights: Sequence[Tensor], x: Tensor) -> Tensor:
    """Outputs ``y`` (batch x n_L) of the plain MLP.

    Parameters
    ----------
    weights : sequence of Tensor
        The weight matrices, ``weights[l]`` of shape ``(n_(l+1), n_l)``.
    x : Tensor
        Inputs, ``(batch, n_0)``.

    Examples
    --------
    >>> import torch
    >>> forward(init_weights((4, 3, 2), seed=0), torch.zeros(5, 4, dtype=torch.float64)).shape
    torch.Size([5, 2])
    """
    h = x
    for w in weights[:-1]:
        h = (h @ w.T).clamp_min(0.0)
    return h @ weights[-1].T


def one_hot(labels: Tensor, n_classes: int) -> Tensor:
    """Float64 one-hot targets, the MSE loss's ``t_i``.

    Parameters
    ----------
    labels : Tensor
        Integer class labels, ``(batch,)``.
    n_classes : int
        Number of classes ``n_L``.

    Examples
    --------
    >>> import torch
    >>> one_hot(torch.tensor([2, 0]), 3).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    torch = torch_module()
    return torch.nn.functional.one_hot(labels, n_classes).to(torch.float64)


def mse_gradient(weights: Sequence[Tensor], x: Tensor, targets: Tensor) -> list[Tensor]:
    """Gradient of ``mean_i 1/2 ||y_i - t_i||^2`` with respect to every weight (plain FedSGD).

    Parameters
    ----------
    weights : sequence of Tensor
        The weight matrices.
    x : Tensor
        Inputs, ``(batch, n_0)``.
    targets : Tensor
        One-hot targets, ``(batch, n_L)``.

    Returns
    -------
    list of Tensor
        One gradient per weight matrix, of its shape.
    """
    torch = torch_module()
    params = [w.detach().requires_grad_(True) for w in weights]
    loss = 0.5 * ((forward(params, x) - targets) ** 2).sum(1).mean()
    return list(torch.autograd.grad(loss, params))


def per_sample_gradient_norms(weights: Sequence[Tensor], x: Tensor, targets: Tensor) -> Tensor:
    """L2 norm of each sample's gradient (over all layers): the record sensitivity of a batch mean
    is at most ``2 max_i norm_i / batch`` (replace-one neighbours)."""
    torch = torch_module()

    def loss_one(params: tuple[Tensor, ...], xi: Tensor, ti: Tensor) -> Tensor:
        return 0.5 * ((forward(params, xi[None]) - ti[None]) ** 2).sum()

    grads = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(
        tuple(weights), x, targets
    )
    return torch.sqrt(sum((g.reshape(len(x), -1) ** 2).sum(1) for g in grads))


def accuracy(weights: Sequence[Tensor], x: Tensor, labels: Tensor) -> float:
    with torch_module().no_grad():
        return float((forward(weights, x).argmax(1) == labels).double().mean())


def mse_loss(weights: Sequence[Tensor], x: Tensor, labels: Tensor, n_classes: int) -> float:
    with torch_module().no_grad():
        return float(0.5 * ((forward(weights, x) - one_hot(labels, n_classes)) ** 2).sum(1).mean())
