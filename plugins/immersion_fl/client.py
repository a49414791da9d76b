"""A federated client: ordinary local training on its own data, in original coordinates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .models import FlatModel


@dataclass
class Client:
    """Client ``index`` with its data (torch tensors) and a deterministic batch order per round."""

    index: int
    x: Any
    y: Any
    model: FlatModel
    optimizer: Any
    local_epochs: int
    batch_size: int
    seed: int
    clip: float | None = None

    @property
    def n_samples(self) -> int:
        return int(len(self.y))

    def batches(self, round_t: int) -> list[np.ndarray]:
        """The mini-batch indices of one round (same for every scheme: equality needs it)."""
        rng = np.random.default_rng([self.seed, round_t, self.index])
        out = []
        for _ in range(self.local_epochs):
            order = rng.permutation(self.n_samples)
            out += [
                order[i : i + self.batch_size] for i in range(0, self.n_samples, self.batch_size)
            ]
        return out

    def train(self, w0: Any, round_t: int) -> Any:
        """K local epochs of the optimizer from ``w0`` (its state starts fresh each round)."""
        w = w0.clone()
        state = self.optimizer.init(w)
        for idx in self.batches(round_t):
            _, grad = self.model.loss_and_grad(w, self.x[idx], self.y[idx])
            step, state = self.optimizer.update(grad, state, w)
            w = w + step
        if self.clip is not None:  # NbAFL-style norm bound behind Remark 3's sensitivity
            w = w / max(1.0, float(w.norm()) / self.clip)
        return w
