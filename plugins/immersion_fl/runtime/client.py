"""A federated client: ordinary local training on its own data, in original coordinates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .models import FlatModel
from .optimizers import GradientTransformation, clip_to_norm

if TYPE_CHECKING:
    import torch


@dataclass
class Client:
    """Client ``index`` with its data (torch tensors) and a deterministic batch order per round.

    Parameters
    ----------
    index:
        The client's position in the federation (seeds its batch order).
    x, y:
        Its training inputs and targets (class indices, or one-hot/probability rows).
    model:
        The model as a function of a flat parameter vector.
    optimizer:
        The local optimizer (its state starts fresh every round).
    local_epochs, batch_size:
        Epochs per round and mini-batch size (the last batch of an epoch may be shorter).
    seed:
        Seeds the batch order (with the round and the index).
    clip:
        Norm bound the trained model is projected onto (seed 000 Remark 3), or None.
    shuffle:
        A fresh permutation every epoch (True) or the data in its order (False).
    """

    index: int
    x: "torch.Tensor"
    y: "torch.Tensor"
    model: FlatModel
    optimizer: GradientTransformation
    local_epochs: int
    batch_size: int
    seed: int
    clip: float | None = None
    shuffle: bool = True

    @property
    def n_samples(self) -> int:
        """|D_i|."""
        return int(len(self.y))

    def batches(self, round_t: int) -> list[np.ndarray]:
        """The mini-batch indices of one round (same for every scheme: equality needs it).

        Parameters
        ----------
        round_t:
            The round (seeds the order with ``seed`` and ``index``).
        """
        rng = np.random.default_rng([self.seed, round_t, self.index])
        out = []
        for _ in range(self.local_epochs):
            order = rng.permutation(self.n_samples) if self.shuffle else np.arange(self.n_samples)
            out += [
                order[i : i + self.batch_size] for i in range(0, self.n_samples, self.batch_size)
            ]
        return out

    def train(self, w0: "torch.Tensor", round_t: int) -> "torch.Tensor":
        """K local epochs of the optimizer from ``w0`` (its state starts fresh each round).

        Parameters
        ----------
        w0:
            The model to start from (original coordinates).
        round_t:
            The round (sets the batch order, :meth:`batches`).
        """
        w = w0.clone()
        state = self.optimizer.init(w)
        for idx in self.batches(round_t):
            _, grad = self.model.loss_and_grad(w, self.x[idx], self.y[idx])
            step, state = self.optimizer.update(grad, state, w)
            w = w + step
        if self.clip is not None:  # NbAFL-style norm bound behind Remark 3's sensitivity
            w = clip_to_norm(w, self.clip)
        return w
