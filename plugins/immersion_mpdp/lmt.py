"""LMT: a client's one gradient on the perturbed model plus the corrections Psi and Phi
(seed 004 Theorems 4 and 13; shapes and the efficient form from the notes, section 4.4).

With ``e = y^hat - t`` and ``alpha = sum_i y^hat^(2L-2)_i``, per batch mean:

* ``grad_hat = d/dW^hat  1/2 ||e||^2`` (ordinary backprop on the perturbed model);
* ``Psi[c] = d/dW^hat  [sg(alpha) y^hat_c + sg(e_c) alpha]`` for every output ``c`` (``sg``: stop
  gradient), so ``Psi^(l)`` has shape ``(n_L, n_l, n_(l-1))``, not the paper's ``n_l x n_(l-1)``;
* ``Phi = d/dW^hat  1/2 alpha^2``.

All three are vector-Jacobian products of the same forward pass: one ``torch.func.vjp`` and a
``vmap`` over ``n_L + 2`` cotangents. Only the odd layers are differentiated (Remark 3); the last
layer's ``Psi`` collapses to the vector ``mean_i alpha_i y^hat^(2L-2)_i`` and its ``Phi`` is zero.
Theorem 4 holds only for a gradient taken at the received ``W^hat``: one gradient per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .mlp import torch_module
from .perturbation import PerturbedModel

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class LocalResult:
    """A client's LMT output for the odd layers (before any DDP noise).

    Parameters
    ----------
    grad_hat : tuple of Tensor
        The ``L`` gradient matrices on the perturbed model.
    psi : tuple of Tensor
        The ``L - 1`` tensors ``Psi^(l)``, of shape ``(n_L, n_l, n_(l-1))``.
    psi_last : Tensor
        The last layer's ``Psi``, shape ``(n_(L-1),)``.
    phi : tuple of Tensor
        The ``L - 1`` matrices ``Phi^(l)``.
    """

    grad_hat: tuple[Tensor, ...]
    psi: tuple[Tensor, ...]
    psi_last: Tensor
    phi: tuple[Tensor, ...]


def local_model_training(model: PerturbedModel, x: Tensor, targets: Tensor) -> LocalResult:
    """LMT on one batch: the gradient on ``W^hat`` and the corrections ``Psi``, ``Phi``.

    Parameters
    ----------
    model : PerturbedModel
        The perturbed model the client received this round.
    x : Tensor
        The batch's inputs, ``(batch, n_0)``, float64.
    targets : Tensor
        One-hot targets, ``(batch, n_L)``.

    Returns
    -------
    LocalResult
        Batch means of ``grad_hat``, ``Psi`` and ``Phi`` (Theorems 4 and 13).

    Examples
    --------
    >>> import numpy as np, torch
    >>> from immersion_mpdp.mlp import init_weights, mse_gradient
    >>> from immersion_mpdp.perturbation import perturb, recover
    >>> w = init_weights((6, 5, 4, 3), seed=0)
    >>> model, keys = perturb(w, np.random.default_rng(1))
    >>> x = torch.rand(8, 6, dtype=torch.float64)
    >>> t = torch.eye(3, dtype=torch.float64)[[0, 1, 2, 0, 1, 2, 0, 1]]
    >>> out = local_model_training(model, x, t)
    >>> true = recover(keys, out.grad_hat, out.psi, out.psi_last, out.phi)     # Theorem 4
    >>> max(float((a - b).abs().max()) for a, b in zip(true, mse_gradient(w, x, t))) < 1e-12
    True
    """
    torch = torch_module()
    func = torch.func
    batch, n_out = targets.shape

    def outputs(*odd: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
        y_hat, alpha, hidden = PerturbedModel(odd, model.transitional).forward_with_hidden(x)
        return (y_hat, alpha), hidden.detach()

    (y_hat, alpha), vjp, hidden_last = func.vjp(outputs, *model.odd, has_aux=True)
    y_hat, alpha = y_hat.detach(), alpha.detach()
    error = y_hat - targets
    eye = torch.eye(n_out, dtype=y_hat.dtype)
    # cotangents, stacked: [grad, Psi_0 .. Psi_(n_L - 1), Phi]
    cot_y = (
        torch.cat(
            [error[None], alpha[None, :, None] * eye[:, None, :], torch.zeros_like(error)[None]]
        )
        / batch
    )
    cot_alpha = torch.cat([torch.zeros_like(alpha)[None], error.T, alpha[None]]) / batch
    grads = func.vmap(vjp)((cot_y, cot_alpha))
    return LocalResult(
        grad_hat=tuple(g[0] for g in grads),
        psi=tuple(g[1:-1] for g in grads[:-1]),
        psi_last=(alpha[:, None] * hidden_last).mean(0),
        phi=tuple(g[-1] for g in grads[:-1]),
    )
