"""One MP-DP round between a server and its clients (seed 004 Algorithm 4), engine-independent.

Phases of round ``t`` (the in-process and the Flower engines run the same methods):

1. ``advertise``: every client makes a fresh X25519 key pair and sends its public key;
2. the server draws fresh keys and the perturbed model (MP_Server) and a neighbour graph;
3. ``upload``: each client runs LMT on one batch and DDP_Client with its neighbours' pair seeds;
4. ``reveal``: if clients dropped out after step 1, each surviving neighbour reveals its pair
   seeds with them, so the server can remove their uncancelled noise and masks; if a survivor
   cannot answer, the engine aborts the round and retries it with fresh keys;
5. ``finish_round``: MU_Server aggregates (Eqs. 20-21), recovers (Eq. 22), updates every layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
from immersion import InvalidArgumentError

from .agreement import KeyAgreement, build_graph
from .ddp import (
    PURPOSES,
    Layout,
    NoiseSettings,
    Upload,
    ddp_client,
    dropout_correction,
    mean_local_result,
    subtract,
    sum_uploads,
)
from .lmt import local_model_training
from .mlp import torch_module
from .perturbation import PerturbedModel, ServerKeys, perturb, recover

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class MpdpClient:
    """A client: its data, one batch per round, its key agreement and its DDP noise stream."""

    index: int
    x: Tensor
    labels: Tensor
    n_classes: int
    batch_size: int
    seed: int
    deterministic_keys: bool = True
    shuffle: bool = True
    timings: dict[str, float] = field(default_factory=dict)
    _agreement: dict[int, KeyAgreement] = field(default_factory=dict, repr=False)
    _attempt: int = field(default=0, repr=False)

    @property
    def n_samples(self) -> int:
        return int(len(self.labels))

    def batch(self, round_t: int) -> tuple[Tensor, Tensor]:
        """This round's batch and its one-hot targets (the same for MP-DP and plain FedSGD)."""
        from .mlp import one_hot

        if self.shuffle:
            rng = np.random.default_rng([self.seed, round_t, self.index])
            idx = rng.choice(
                self.n_samples, size=min(self.batch_size, self.n_samples), replace=False
            )
        else:  # in order: round t takes batch t of the data (cycling; the last one may be short)
            start = (round_t % -(-self.n_samples // self.batch_size)) * self.batch_size
            idx = np.arange(start, min(start + self.batch_size, self.n_samples))
        return self.x[idx], one_hot(self.labels[idx], self.n_classes)

    def advertise(self, round_t: int, attempt: int = 0) -> bytes:
        """Phase 1: a fresh key pair for this round (and retry ``attempt``); returns the public key.

        With ``deterministic_keys`` (the in-process simulation) the private key and the DP noise
        derive from the run seed, so a run is reproducible; whoever knows the seed (the server)
        could recompute them, so this protects nothing outside a simulation. Otherwise both come
        from OS entropy (the Flower engine's nodes).
        """
        self._attempt = attempt
        self.timings = {}
        private = (
            np.random.default_rng([self.seed, round_t, self.index, 25519, attempt]).bytes(32)
            if self.deterministic_keys
            else None
        )
        self._agreement = {round_t: KeyAgreement(self.index, round_t, private)}
        return self._agreement[round_t].public_bytes

    def private_key(self, round_t: int) -> bytes:
        """This round's raw private key, for engines whose nodes keep state between messages."""
        return self._agreement[round_t].private_key_bytes()

    def restore_key(self, round_t: int, attempt: int, private: bytes) -> bytes:
        """Reinstate a key pair saved with :meth:`private_key`; returns its public key."""
        self._attempt = attempt
        self._agreement = {round_t: KeyAgreement(self.index, round_t, private)}
        return self._agreement[round_t].public_bytes

    def _seeds(
        self, round_t: int, peers: Sequence[int], publics: dict[int, bytes]
    ) -> dict[int, dict[str, bytes]]:
        if round_t not in self._agreement:
            raise InvalidArgumentError(
                "round_t", f"client {self.index} has no key pair for round {round_t}"
            )
        mine = self._agreement[round_t]
        return {v: mine.pair_seeds(v, publics[v], PURPOSES) for v in peers}

    def upload(
        self,
        round_t: int,
        model: PerturbedModel,
        publics: dict[int, bytes],
        neighbours: Sequence[int],
        n_clients: int,
        noise: NoiseSettings,
    ) -> Upload:
        """Phase 3: LMT on this round's batch, then DDP_Client (Algorithm 2)."""
        tick = time.perf_counter()
        x, targets = self.batch(round_t)
        local = local_model_training(model, x, targets)
        self.timings["client_lmt"] = time.perf_counter() - tick
        tick = time.perf_counter()
        layout = Layout.of(model.odd)
        rng = (
            np.random.default_rng([self.seed, round_t, self.index, 16, self._attempt])
            if self.deterministic_keys
            else np.random.default_rng()
        )
        upload = ddp_client(
            local,
            layout,
            me=self.index,
            seeds=self._seeds(round_t, neighbours, publics),
            n_clients=n_clients,
            noise=noise,
            rng=rng,
        )
        self.timings["client_ddp"] = time.perf_counter() - tick
        return upload

    def reveal(
        self, round_t: int, dropped: Sequence[int], publics: dict[int, bytes]
    ) -> dict[int, dict[str, bytes]]:
        """Phase 4: the pair seeds with neighbours that dropped out (and only those)."""
        return self._seeds(round_t, dropped, publics)

    def forget(self, round_t: int) -> None:
        self._agreement.pop(round_t, None)


@dataclass
class MpdpServer:
    """MP_Server + MU_Server: holds the true model ``W_org``; keys live for one round only."""

    weights: list[Tensor]
    lr: float
    noise: NoiseSettings
    graph: str = "complete"
    dn2_law: str = "pair"
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    _keys: ServerKeys | None = field(default=None, repr=False)

    @property
    def layout(self) -> Layout:
        return Layout.of(self.weights)

    def begin_round(self, members: Sequence[int]) -> tuple[PerturbedModel, dict[int, list[int]]]:
        """Phase 2: fresh keys, the perturbed model (Algorithm 1) and the neighbour graph."""
        model, self._keys = perturb(self.weights, self.rng, dn2_law=self.dn2_law)
        return model, build_graph(list(members), self.graph, self.rng)

    def finish_round(
        self, uploads: dict[int, Upload], revealed: list[tuple[int, int, dict[str, bytes]]]
    ) -> list[Tensor]:
        """Phase 5 (Algorithm 3): aggregate, remove dropped pairs, recover (Eq. 22), update; returns
        the recovered aggregate gradient. The round's keys are discarded."""
        if self._keys is None:
            raise InvalidArgumentError("uploads", "finish_round() before begin_round()")
        torch = torch_module()
        masked = self.noise.mask_corrections
        total = sum_uploads(uploads.values(), masked=masked)
        if revealed:
            total = subtract(
                total, dropout_correction(revealed, self.layout, self.noise), masked=masked
            )
        mean = mean_local_result(
            total, len(uploads), self.layout, masked=masked, words=self.noise.words
        )
        gradient = recover(self._keys, mean.grad_hat, mean.psi, mean.psi_last, mean.phi)
        self.weights = [
            w - self.lr * g.to(torch.float64) for w, g in zip(self.weights, gradient, strict=True)
        ]
        self._keys = None
        return gradient
