"""LMT: a client's one gradient on the perturbed model plus the corrections Psi and Phi
(seed 004 Theorems 4 and 13; shapes and the efficient form from the notes, section 4.4).

With ``e = y^hat - t`` and ``alpha = sum_i y^hat^(2L-2)_i``, per batch mean:

* ``grad_hat = d/dW^hat  1/2 ||e||^2`` (ordinary backprop on the perturbed model);
* ``Psi[c] = d/dW^hat  [sg(alpha) y^hat_c + sg(e_c) alpha]`` for every output ``c`` (``sg``: stop
  gradient), so ``Psi^(l)`` has shape ``(n_L, n_l, n_(l-1))``, not the paper's ``n_l x n_(l-1)``;
* ``Phi = d/dW^hat  1/2 alpha^2``.

All three are vector-Jacobian products of the same forward pass with ``n_L + 2`` stacked
cotangents. Every layer is dense, so the backward pass is written out: each layer's gradients
are one batched outer product of its output sensitivities (``n_L + 2`` of them per sample) and
its inputs, about 6 times faster than ``torch.func.vmap`` over ``torch.func.vjp``
(:func:`autograd_lmt`, kept as the reference: both give the same bits). Only the odd layers
are differentiated (Remark 3); the last layer's ``Psi`` collapses to the vector ``mean_i alpha_i
y^hat^(2L-2)_i`` and its ``Phi`` is zero.
Theorem 4 holds only for a gradient taken at the received ``W^hat``: one gradient per round.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .mlp import torch_module
from .perturbation import PerturbedModel

if TYPE_CHECKING:
    import numpy as np
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
    flat : tuple of np.ndarray, optional
        The flat gradient and corrections (:class:`immersion_mpdp.ddp.Layout`) when the tensors
        above are views of them, as :func:`local_model_training` computes them.
    """

    grad_hat: tuple[Tensor, ...]
    psi: tuple[Tensor, ...]
    psi_last: Tensor
    phi: tuple[Tensor, ...]
    flat: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)


def local_model_training(
    model: PerturbedModel,
    x: Tensor,
    targets: Tensor,
    *,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> LocalResult:
    """LMT on one batch: the gradient on ``W^hat`` and the corrections ``Psi``, ``Phi``.

    Parameters
    ----------
    model : PerturbedModel
        The perturbed model the client received this round.
    x : Tensor
        The batch's inputs, ``(batch, n_0)``, float64.
    targets : Tensor
        One-hot targets, ``(batch, n_L)``.
    out : tuple of np.ndarray, optional
        Contiguous float64 buffers of the flat gradient and corrections
        (:class:`immersion_mpdp.ddp.Layout`) to write the result into (a client reusing its
        buffers from round to round: fresh memory costs a page fault per 4 KiB); new ones
        otherwise.

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
    return _outer_product_lmt(model, x, targets, out)


#: Per thread: the batched products of the last LMT, reused while the shapes stay the same.
_WORKSPACE = threading.local()


def _buffer(name: object, shape: tuple[int, ...], dtype: Any) -> Tensor:
    """A whole tensor of ``shape`` kept in this thread under ``name`` for an intermediate of an
    LMT pass (never returned to a caller: the results are copied out)."""
    torch = torch_module()
    buffers = _WORKSPACE.__dict__.setdefault("buffers", {})
    buf = buffers.get(name)
    if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype:
        buf = buffers[name] = torch.empty(shape, dtype=dtype)
    return buf


def _outer_product_lmt(
    model: PerturbedModel,
    x: Tensor,
    targets: Tensor,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> LocalResult:
    """Backpropagation by hand with the ``n_L + 2`` cotangents stacked: every layer's gradients
    are one batched product ``G^T h`` of its output sensitivities ``G`` (``(n_L + 2, batch, n_l)``)
    and its inputs ``h``; the cotangents and the order of every operation are those of
    :func:`autograd_lmt`, so both give the same bits (tests/test_mpdp.py).

    Each product goes to a whole tensor of its own, as autograd's does (the BLAS may round
    differently when an output starts at another alignment), kept per thread for the next call
    (:data:`_WORKSPACE`; refilling memory costs no page faults), and is then copied once into
    the upload's flat buffers (the layout of :class:`immersion_mpdp.ddp.Layout`), which the
    tensors returned view."""
    torch = torch_module()
    odd, transitional = model.odd, model.transitional
    inputs, active = [x], []
    h = x
    for w, d in zip(odd[:-1], transitional, strict=True):  # PerturbedModel.forward_with_hidden
        z = h @ w.T
        active.append(z >= 0.0)  # where clamp_min passes the gradient
        h = (z.clamp_min(0.0) * d).clamp_min(0.0)  # the second clamp passes everything (d > 0)
        inputs.append(h)
    w_last = odd[-1]
    y_hat, alpha = h @ w_last.T, h.sum(1)
    error = y_hat - targets
    cot_y, cot_alpha = _cotangents(error, alpha)
    # output sensitivities of the last hidden layer (h and alpha = sum h), one per cotangent:
    # (n_L + 2, batch, n_(L-1))
    # (each intermediate in a kept buffer, in place where the arithmetic allows: the same
    # operations on the same values as ``torch.where(active, sens * d, 0)`` and ``sens @ w``)
    dtype = w_last.dtype
    sens = _buffer(("sens", len(odd) - 2), (cot_y.shape[0], *h.shape), dtype)
    torch.matmul(cot_y, w_last, out=sens)
    sens.add_(cot_alpha[:, :, None])
    products: list[Tensor] = [cot_y[:1].transpose(1, 2) @ h]  # the last layer: grad_hat only
    for layer in range(len(odd) - 2, -1, -1):
        sens.mul_(transitional[layer]).masked_fill_(~active[layer], 0.0)
        shape = (sens.shape[0], sens.shape[2], inputs[layer].shape[1])
        product = _buffer(("product", layer), shape, dtype)
        torch.matmul(sens.transpose(1, 2), inputs[layer], out=product)  # batched outer products
        products.insert(0, product)
        if layer:
            before = _buffer(("sens", layer - 1), (*sens.shape[:2], odd[layer].shape[1]), dtype)
            torch.matmul(sens, odd[layer], out=before)
            sens = before
    psi_last = (alpha[:, None] * h).mean(0)
    grad_parts = [p[0].reshape(-1) for p in products]
    corr_parts = [*(p[1:].reshape(-1) for p in products[:-1]), psi_last]
    if out is None:
        grad_flat, corr_flat = torch.cat(grad_parts), torch.cat(corr_parts)
    else:
        grad_flat, corr_flat = (torch.from_numpy(a) for a in out)
        torch.cat(grad_parts, out=grad_flat)
        torch.cat(corr_parts, out=corr_flat)
    grads, psi, phi, at = [], [], [], [0, 0]
    for p in products:
        rows, cols = p.shape[1:]
        grads.append(grad_flat[at[0] : at[0] + rows * cols].view(rows, cols))
        at[0] += rows * cols
        if p.shape[0] > 1:
            block = corr_flat[at[1] : at[1] + (p.shape[0] - 1) * rows * cols]
            block = block.view(p.shape[0] - 1, rows, cols)
            psi.append(block[:-1])
            phi.append(block[-1])
            at[1] += block.numel()
    return LocalResult(
        grad_hat=tuple(grads),
        psi=tuple(psi),
        psi_last=corr_flat[at[1] :],
        phi=tuple(phi),
        flat=(grad_flat.numpy(), corr_flat.numpy()),
    )


def autograd_lmt(model: PerturbedModel, x: Tensor, targets: Tensor) -> LocalResult:
    """:func:`local_model_training` by automatic differentiation: one ``torch.func.vjp`` and a
    ``vmap`` over the ``n_L + 2`` stacked cotangents. The reference the hand-written backward
    pass is tested against (and the form for layers that are not dense).

    Parameters
    ----------
    model : PerturbedModel
        The perturbed model.
    x : Tensor
        Inputs, ``(batch, n_0)``.
    targets : Tensor
        One-hot targets, ``(batch, n_L)``.

    Returns
    -------
    LocalResult
        As :func:`local_model_training`.
    """
    torch = torch_module()
    func = torch.func

    def outputs(*odd: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
        y_hat, alpha, hidden = PerturbedModel(odd, model.transitional).forward_with_hidden(x)
        return (y_hat, alpha), hidden.detach()

    (y_hat, alpha), vjp, hidden_last = func.vjp(outputs, *model.odd, has_aux=True)
    y_hat, alpha = y_hat.detach(), alpha.detach()
    error = y_hat - targets
    cot_y, cot_alpha = _cotangents(error, alpha)
    grads = func.vmap(vjp)((cot_y, cot_alpha))
    return LocalResult(
        grad_hat=tuple(g[0] for g in grads),
        psi=tuple(g[1:-1] for g in grads[:-1]),
        psi_last=(alpha[:, None] * hidden_last).mean(0),
        phi=tuple(g[-1] for g in grads[:-1]),
    )


def _cotangents(error: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor]:
    """The cotangents of ``(y^hat, alpha)`` whose vector-Jacobian products are the batch means
    of ``grad_hat``, ``Psi[c]`` for every output ``c``, and ``Phi``, stacked in that order:
    ``(n_L + 2, batch, n_L)`` and ``(n_L + 2, batch)``."""
    torch = torch_module()
    batch, n_out = error.shape
    cot_y = torch.zeros((n_out + 2, batch, n_out), dtype=error.dtype)
    cot_y[0] = error
    outputs = torch.arange(n_out)
    cot_y[1 + outputs, :, outputs] = alpha  # alpha_i e_c for Psi[c] (alpha >= 0: no -0.0)
    cot_y /= batch
    cot_alpha = torch.empty((n_out + 2, batch), dtype=error.dtype)
    cot_alpha[0] = 0.0
    cot_alpha[1:-1] = error.T
    cot_alpha[-1] = alpha
    cot_alpha /= batch
    return cot_y, cot_alpha
