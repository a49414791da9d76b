"""MP_Server and the recovery of MU_Server (seed 004 Algorithm 1, Eqs. 12-15 and 22).

The L-layer model is expanded to 2L - 1 layers: odd layer ``2l - 1`` holds ``W^(l)`` and even
layer ``2l`` a transitional identity (Eq. 12). Keys (Eq. 13): ``r^(1), s^(L-1) ~ |DN*(1)|``,
the other ``r^(l), s^(l) ~ |DN*(2)|``, all strictly positive; ``r = gamma o r^(a)`` is the
additive key of the last layer. Masks (Eq. 14) and the perturbed model (Eq. 15):

* odd layer ``2l - 1``: ``W^(l)_ij * r^(l)_i * s^(l-1)_j`` (no ``r`` factor for ``l = L``, no
  ``s`` factor for ``l = 1``), plus ``R^(a)_ij = r_i`` on the last layer;
* even layer ``2l``: ``diag(1 / (r^(l) o s^(l)))``, sent as its diagonal (a vector).

The paper gives no law for ``gamma`` and ``r^(a)``; only their product ``r`` enters anything.
Here ``gamma ~ Uniform(0.5, 1.5)`` and ``r^(a) ~ N(0, 1)``. Keys are one-time: call
:func:`perturb` every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
from immersion import InvalidArgumentError

from .laws import abs_dn_star_1, abs_dn_star_2
from .mlp import torch_module

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class PerturbedModel:
    """What the server sends each client: the odd layers ``W^hat`` and the transitional diagonals.

    Parameters
    ----------
    odd : tuple of Tensor
        The ``L`` perturbed weight matrices of the odd layers (Eq. 15).
    transitional : tuple of Tensor
        The ``L - 1`` diagonals of the even layers, ``W^hat^(2l) = diag(1 / (r^(l) s^(l)))``.
    """

    odd: tuple[Tensor, ...]
    transitional: tuple[Tensor, ...]

    @property
    def n_layers(self) -> int:
        return len(self.odd)

    def arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays for a wire format (``odd0..``, ``trans0..``)."""
        out = {f"odd{i}": w.numpy() for i, w in enumerate(self.odd)}
        out.update({f"trans{i}": d.numpy() for i, d in enumerate(self.transitional)})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> PerturbedModel:
        """The model back from :meth:`arrays` (float64 tensors).

        Parameters
        ----------
        arrays : dict of str to np.ndarray
            ``odd0..odd{L-1}`` and ``trans0..trans{L-2}``.
        """
        torch = torch_module()
        n = sum(1 for k in arrays if k.startswith("odd"))
        return cls(
            tuple(torch.as_tensor(arrays[f"odd{i}"]) for i in range(n)),
            tuple(torch.as_tensor(arrays[f"trans{i}"]) for i in range(n - 1)),
        )

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(y^hat^(2L-1), alpha)`` with ``alpha = sum_i y^hat^(2L-2)_i`` (Theorem 12).

        Parameters
        ----------
        x : Tensor
            Inputs, ``(batch, n_0)``.
        """
        y_hat, alpha, _ = self.forward_with_hidden(x)
        return y_hat, alpha

    def forward_with_hidden(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`forward` and ``y^hat^(2L-2)``, the input of the last layer.

        Parameters
        ----------
        x : Tensor
            Inputs, ``(batch, n_0)``.
        """
        h = x
        for w, d in zip(self.odd[:-1], self.transitional, strict=True):
            h = (h @ w.T).clamp_min(0.0)  # layer 2l - 1: y^hat = r^(l) o y
            h = (h * d).clamp_min(0.0)  # layer 2l: y^hat = (1 / s^(l)) o y
        return h @ self.odd[-1].T, h.sum(1), h


@dataclass(frozen=True)
class ServerKeys:
    """One round's secret keys (server only): ``r^(l)``, ``s^(l)`` for l = 1..L-1, and ``r``.

    Parameters
    ----------
    r, s : tuple of Tensor
        The positive multiplicative keys ``r^(l)``, ``s^(l)`` of the hidden layers (Eq. 13).
    r_out : Tensor
        The additive key of the last layer, ``r = gamma o r^(a)``.
    """

    r: tuple[Tensor, ...]
    s: tuple[Tensor, ...]
    r_out: Tensor

    def mask(self, layer: int) -> Tensor:
        """``R^(2l-1)`` for ``layer = l - 1`` in 0..L-1 (Eq. 14), as a dense matrix.

        Parameters
        ----------
        layer : int
            The odd layer's index ``l - 1``, from 0 to ``L - 1``.
        """
        n_layers = len(self.r) + 1
        left = self.r[layer] if layer < n_layers - 1 else None
        right = self.s[layer - 1] if layer > 0 else None
        if left is None:
            assert right is not None
            return right[None, :].expand(len(self.r_out), -1)
        if right is None:
            return left[:, None]
        return left[:, None] * right[None, :]

    def masks(self, shapes: Sequence[tuple[int, ...]]) -> list[Tensor]:
        """Every odd layer's mask, expanded to the weight shapes.

        Parameters
        ----------
        shapes : sequence of tuple of int
            The ``L`` weight matrices' shapes.
        """
        return [self.mask(i).expand(*shape) for i, shape in enumerate(shapes)]


def draw_keys(
    sizes: Sequence[int], rng: np.random.Generator, *, dn2_law: str = "pair"
) -> ServerKeys:
    """Eq. 13 keys for an MLP with layer sizes ``(n_0, ..., n_L)``, ``L >= 2``.

    Parameters
    ----------
    sizes : sequence of int
        Layer sizes ``(n_0, ..., n_L)``.
    rng : np.random.Generator
        Source of the keys.
    dn2_law : {"pair", "series"}
        How the ``|DN*(2)|`` keys are drawn (:mod:`immersion_mpdp.laws`): exact pair laws or the
        paper's i.i.d. law from Theorem 3's truncated series.

    Returns
    -------
    ServerKeys
        Fresh one-round keys.
    """
    torch = torch_module()
    n_layers = len(sizes) - 1
    if n_layers < 2:
        raise InvalidArgumentError("weights", f"MP-DP needs L >= 2 layers, got {n_layers}")
    hidden = sizes[1:-1]
    r, s = [], []
    for l_index, width in enumerate(hidden):  # l = l_index + 1 in 1..L-1
        first, last = l_index == 0, l_index == n_layers - 2
        r.append(
            abs_dn_star_1((width,), rng)
            if first
            else abs_dn_star_2((width,), rng, law=dn2_law, factor="left")
        )
        s.append(
            abs_dn_star_1((width,), rng)
            if last
            else abs_dn_star_2((width,), rng, law=dn2_law, factor="right")
        )
    r_out = rng.uniform(0.5, 1.5, size=sizes[-1]) * rng.standard_normal(sizes[-1])
    as_t = torch.as_tensor
    return ServerKeys(tuple(map(as_t, r)), tuple(map(as_t, s)), as_t(r_out))


def perturb(
    weights: Sequence[Tensor], rng: np.random.Generator, *, dn2_law: str = "pair"
) -> tuple[PerturbedModel, ServerKeys]:
    """MP_Server (Algorithm 1): fresh keys and the perturbed expanded model (Eqs. 12-15).

    Parameters
    ----------
    weights : sequence of Tensor
        The true model's ``L >= 2`` weight matrices, 2-D float64, ``W^(l)`` of shape
        ``(n_l, n_(l-1))`` (bias-free ReLU MLP).
    rng : np.random.Generator
        Source of the keys.
    dn2_law : {"pair", "series"}
        How the ``|DN*(2)|`` keys are drawn (see :func:`draw_keys`).

    Returns
    -------
    model : PerturbedModel
        What the server sends the clients.
    keys : ServerKeys
        The round's secret keys, for :func:`recover`.

    Examples
    --------
    >>> from immersion_mpdp.mlp import init_weights, forward
    >>> import torch
    >>> w = init_weights((6, 5, 4, 3), seed=0)
    >>> model, keys = perturb(w, np.random.default_rng(1))
    >>> x = torch.rand(2, 6, dtype=torch.float64)
    >>> y_hat, alpha = model.forward(x)
    >>> bool(torch.allclose(y_hat, forward(w, x) + alpha[:, None] * keys.r_out))   # Theorem 12
    True
    """
    sizes = _check_weights(weights)
    keys = draw_keys(sizes, rng, dn2_law=dn2_law)
    odd = [
        w * m for w, m in zip(weights, keys.masks([tuple(w.shape) for w in weights]), strict=True)
    ]
    odd[-1] = odd[-1] + keys.r_out[:, None]  # R^(a)_ij = gamma_i r^(a)_i
    transitional = tuple(1.0 / (r * s) for r, s in zip(keys.r, keys.s, strict=True))
    return PerturbedModel(tuple(odd), transitional), keys


def recover(
    keys: ServerKeys,
    grad_hat: Sequence[Tensor],
    psi: Sequence[Tensor],
    psi_last: Tensor,
    phi: Sequence[Tensor],
) -> list[Tensor]:
    """Eq. 22 (Theorem 4): ``R o (grad^hat - r^T Psi + v Phi)`` for every odd layer.

    Parameters
    ----------
    keys : ServerKeys
        The keys :func:`perturb` drew for the model the gradient was taken at.
    grad_hat : sequence of Tensor
        The gradient on the perturbed model, one matrix per odd layer.
    psi : sequence of Tensor
        ``Psi`` of the layers before the last, ``psi[l]`` of shape ``(n_L, n_l+1, n_l)``.
    psi_last : Tensor
        The last layer's ``Psi``, a vector: its ``r^T Psi`` is ``r (x) psi_last``.
    phi : sequence of Tensor
        ``Phi`` of the layers before the last (the last layer's is zero; seed 004 notes
        section 4.4).

    Returns
    -------
    list of Tensor
        The true gradient of every layer.
    """
    torch = torch_module()
    r = keys.r_out
    v = float(r @ r)
    out = []
    for index, g in enumerate(grad_hat):
        if index < len(grad_hat) - 1:
            corrected = g - torch.tensordot(r, psi[index], dims=1) + v * phi[index]
        else:
            corrected = g - r[:, None] * psi_last[None, :]
        out.append(keys.mask(index) * corrected)
    return out


def _check_weights(weights: Sequence[Tensor]) -> tuple[int, ...]:
    torch = torch_module()
    if len(weights) < 2:
        raise InvalidArgumentError(
            "weights", f"MP-DP needs L >= 2 weight matrices, got {len(weights)}"
        )
    sizes = [int(weights[0].shape[1])]
    for index, w in enumerate(weights):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.float64:
            raise InvalidArgumentError("weights", f"layer {index}: expected a 2-D float64 tensor")
        if int(w.shape[1]) != sizes[-1]:
            raise InvalidArgumentError(
                "weights", f"layer {index} has {w.shape[1]} inputs, expected {sizes[-1]}"
            )
        if not bool(torch.isfinite(w).all()):
            raise InvalidArgumentError("weights", f"layer {index} contains NaN or inf")
        sizes.append(int(w.shape[0]))
    return tuple(sizes)
