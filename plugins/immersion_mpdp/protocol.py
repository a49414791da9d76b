"""One MP-DP round between a server and its clients (seed 004 Algorithm 4), engine-independent.

Phases of round ``t`` (the in-process and the Flower engines run the same methods):

1. ``advertise``: every client sends its public key (one X25519 key pair per client and run;
   the pair seeds are fresh for every round and retry, :mod:`immersion_mpdp.agreement`);
2. the server draws fresh keys and the perturbed model (MP_Server) and the round's graph: the
   edges of the noise ``Delta`` and those of the masks (:func:`~.agreement.round_graph`);
3. ``upload``: each client runs LMT on one batch and DDP_Client with its neighbours' pair seeds;
4. ``reveal``: if clients dropped out after step 1, each surviving neighbour reveals its pair
   seeds of this round with them, so the server can remove their uncancelled noise and masks;
   if a survivor cannot answer, or the survivors' graph of either kind falls apart (the server
   would learn the sum of each part), the engine aborts the round and retries it with fresh
   seeds;
5. ``finish_round``: MU_Server aggregates (Eqs. 20-21), recovers (Eq. 22), updates every layer.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
from immersion import InvalidArgumentError

from .agreement import KeyAgreement, RoundGraph, round_graph
from .ddp import (
    PURPOSES,
    Layout,
    NoiseSettings,
    Upload,
    ddp_upload,
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
    _key: KeyAgreement | None = field(default=None, repr=False)
    _round: int | None = field(default=None, repr=False)
    _attempt: int = field(default=0, repr=False)
    _buffers: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

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
        """Phase 1 of round ``t`` (retry ``attempt``): the public key to send.

        The key pair is made on the first call and kept for the run; the pair seeds of each round
        and retry are fresh (:meth:`KeyAgreement.pair_seeds`). With ``deterministic_keys`` (the
        in-process simulation) the private key and the DP noise derive from the run seed, so a
        run is reproducible; whoever knows the seed (the server) could recompute them, so this
        protects nothing outside a simulation. Otherwise both come from OS entropy (the Flower
        engine's nodes).
        """
        self._round, self._attempt = round_t, attempt
        self.timings = {}
        if self._key is None:
            private = (
                np.random.default_rng([self.seed, self.index, 25519]).bytes(32)
                if self.deterministic_keys
                else None
            )
            self._key = KeyAgreement(self.index, round_t, private)
        return self._key.public_bytes

    def private_key(self, round_t: int | None = None) -> bytes:
        """The raw private key, for engines whose nodes keep state between messages."""
        if self._key is None:
            raise InvalidArgumentError("round_t", f"client {self.index} has no key pair yet")
        return self._key.private_key_bytes()

    def restore_key(self, round_t: int, attempt: int, private: bytes) -> bytes:
        """Reinstate a key pair saved with :meth:`private_key` for round ``round_t`` (retry
        ``attempt``); returns its public key. The pair secrets already derived are kept when the
        key is the one this client holds."""
        self._round, self._attempt = round_t, attempt
        if self._key is None or self._key.private_key_bytes() != private:
            self._key = KeyAgreement(self.index, round_t, private)
        return self._key.public_bytes

    def forget_key(self) -> None:
        """Drop the key pair (and the pair secrets derived from it): the next
        :meth:`advertise` makes a new one."""
        self._key = None

    def _seeds(
        self,
        round_t: int,
        peers: Sequence[int] | Mapping[int, Sequence[str]],
        publics: dict[int, bytes],
    ) -> dict[int, dict[str, bytes]]:
        if self._key is None or self._round != round_t:
            raise InvalidArgumentError(
                "round_t", f"client {self.index} has no key pair for round {round_t}"
            )
        purposes = peers if isinstance(peers, Mapping) else dict.fromkeys(peers, PURPOSES)
        out = {}
        for v, wanted in purposes.items():
            if v not in publics:
                raise InvalidArgumentError("publics", f"no public key for client {v}")
            out[v] = self._key.pair_seeds(
                v, publics[v], tuple(wanted), round_t=round_t, attempt=self._attempt
            )
        return out

    def upload(
        self,
        round_t: int,
        model: PerturbedModel,
        publics: dict[int, bytes],
        neighbours: Sequence[int] | Mapping[int, Sequence[str]],
        n_clients: int,
        noise: NoiseSettings,
    ) -> Upload:
        """Phase 3: LMT on this round's batch, then DDP_Client (Algorithm 2). ``neighbours``:
        ``{peer: purposes of the edge}`` (the round's graph), or peers sharing every purpose."""
        tick = time.perf_counter()
        x, targets = self.batch(round_t)
        flat = self._upload_buffers(Layout.of(model.odd))
        local_model_training(model, x, targets, out=flat)  # its result views ``flat``
        self.timings["client_lmt"] = time.perf_counter() - tick
        tick = time.perf_counter()
        rng = (
            np.random.default_rng([self.seed, round_t, self.index, 16, self._attempt])
            if self.deterministic_keys
            else np.random.default_rng()
        )
        upload = ddp_upload(
            *flat,
            me=self.index,
            seeds=self._seeds(round_t, neighbours, publics),
            n_clients=n_clients,
            noise=noise,
            rng=rng,
        )
        self.timings["client_ddp"] = time.perf_counter() - tick
        return upload

    def _upload_buffers(self, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
        """The flat buffers this client's upload is built in: last round's again when nothing
        else holds them any more (its upload was summed and dropped), else new ones. Fresh
        memory costs a page fault per 4 KiB, about as much as LMT's arithmetic here."""
        sizes = (layout.gradient_size, layout.correction_size)
        if self._buffers is not None and tuple(a.size for a in self._buffers) == sizes:
            # only this tuple and getrefcount's argument refer to each (views hold their base)
            if all(sys.getrefcount(self._buffers[i]) <= 2 for i in (0, 1)):
                return self._buffers
        self._buffers = (np.empty(sizes[0]), np.empty(sizes[1]))
        return self._buffers

    def reveal(
        self, round_t: int, dropped: Sequence[int], publics: dict[int, bytes]
    ) -> dict[int, dict[str, bytes]]:
        """Phase 4: this round's pair seeds with neighbours that dropped out (and only those);
        every purpose (the server uses those of the edge)."""
        return self._seeds(round_t, dropped, publics)

    def forget(self, round_t: int) -> None:
        """The round is over: no seed of it can be asked for any more (the key pair stays)."""
        if self._round == round_t:
            self._round = None


@dataclass
class MpdpServer:
    """MP_Server + MU_Server: holds the true model ``W_org``; keys live for one round only.

    ``graph`` and ``mask_graph`` are resolved specs (``"complete"`` or ``"nout:N"``) for the
    noise ``Delta`` and the masks of the corrections; edges of a kind the noise settings do not
    use (no ``Delta``, corrections in the clear) are not drawn.
    """

    weights: list[Tensor]
    lr: float
    noise: NoiseSettings
    graph: str = "complete"
    dn2_law: str = "pair"
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    mask_graph: str = "complete"
    _keys: ServerKeys | None = field(default=None, repr=False)
    _graph: RoundGraph | None = field(default=None, repr=False)
    _sums: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def layout(self) -> Layout:
        return Layout.of(self.weights)

    def begin_round(self, members: Sequence[int]) -> tuple[PerturbedModel, RoundGraph]:
        """Phase 2: fresh keys, the perturbed model (Algorithm 1) and the round's graph
        (``{client: {neighbour: purposes}}``)."""
        model, self._keys = perturb(self.weights, self.rng, dn2_law=self.dn2_law)
        self._graph = round_graph(
            list(members),
            self.graph if self.noise.sigma_delta > 0 else None,
            self.mask_graph if self.noise.mask_corrections else None,
            self.rng,
        )
        return model, self._graph

    def finish_round(
        self, uploads: dict[int, Upload], revealed: list[tuple[int, int, dict[str, bytes]]]
    ) -> list[Tensor]:
        """Phase 5 (Algorithm 3): aggregate, remove dropped pairs, recover (Eq. 22), update; returns
        the recovered aggregate gradient. The round's keys are discarded. Of a revealed pair's
        seeds only those of the purposes its edge carries are used."""
        if self._keys is None:
            raise InvalidArgumentError("uploads", "finish_round() before begin_round()")
        torch = torch_module()
        masked = self.noise.mask_corrections
        reuse = self._sums is not None and all(  # held by nobody else since the last round
            sys.getrefcount(self._sums[i]) <= 2 for i in (0, 1)
        )
        total = self._sums = sum_uploads(
            uploads.values(), masked=masked, out=self._sums if reuse else None
        )
        if revealed:
            graph = self._graph or {}
            used = [
                (v, d, {p: seeds[p] for p in graph.get(v, {}).get(d, PURPOSES) if p in seeds})
                for v, d, seeds in revealed
            ]
            total = subtract(
                total, dropout_correction(used, self.layout, self.noise), masked=masked
            )
        mean = mean_local_result(
            total, len(uploads), self.layout, masked=masked, words=self.noise.words
        )
        gradient = recover(self._keys, mean.grad_hat, mean.psi, mean.psi_last, mean.phi)
        self.weights = [
            w - self.lr * g.to(torch.float64) for w, g in zip(self.weights, gradient, strict=True)
        ]
        self._keys = self._graph = None
        return gradient
