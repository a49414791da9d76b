"""The contract of a weight-averaging federated scheme, and what the engine hands it.

A round of any such scheme (seed 000 eq. 2 generalised): the server :meth:`~Scheme.broadcast`\\ s,
every client computes its :meth:`~Scheme.client_upload` from what it received, the aggregator
forms the weighted sum of the uploads and :meth:`~Scheme.aggregator_code`\\ s it, and the server
folds the result into its state (:meth:`~Scheme.server_update`). :meth:`~Scheme.global_model` is
the decoded model a key holder would see. The optional capabilities have defaults here (no noise
to design, no privacy figures, no key material, no client noise), so an engine calls them
unconditionally instead of probing.

Schemes whose rounds do not fit (MP-DP, seed 001's schemes) register a ``runner`` instead
(:class:`immersion.hookspecs.SchemeSpec`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch
    from immersion.backends import ArrayBackend


class LocalTrainer(Protocol):
    """A client as a scheme sees it: an index, a dataset size and local training."""

    @property
    def index(self) -> int:
        """The client's position in the federation."""

    @property
    def n_samples(self) -> int:
        """|D_i|, the size of its training set."""

    def train(self, w_start: "torch.Tensor", round_t: int) -> "torch.Tensor":
        """The model after this round's local training from ``w_start`` (original coordinates)."""


@dataclass(frozen=True)
class SchemeContext:
    """What the engine provides to a scheme factory: the array backend and the key generator.

    Parameters
    ----------
    backend:
        The torch backend the run uses (float64, CPU or CUDA).
    rng:
        The generator keys and round noise are drawn from.
    """

    backend: "ArrayBackend"
    rng: np.random.Generator


class Scheme(ABC):
    """A weight-averaging federated scheme. Subclasses: :class:`~immersion_fl.schemes.FedAvg`,
    :class:`~immersion_fl.schemes.SiflM1`, :class:`~immersion_fl.schemes.SiflM2`.

    Examples
    --------
    >>> import torch
    >>> from immersion_fl.schemes import FedAvg
    >>> s = FedAvg()
    >>> s.setup(torch.zeros(3, dtype=torch.float64))
    >>> s.server_update(s.aggregate([torch.ones(3), 3 * torch.ones(3)], [0.5, 0.5]))
    >>> s.global_model().tolist(), s.privacy([10, 10])
    ([2.0, 2.0, 2.0], {'epsilon_local': None, 'epsilon_global': None})
    """

    #: The registered name.
    name: str = ""
    #: Whether each client may add noise of its own that decoding removes (``client_noise``).
    supports_client_noise: ClassVar[bool] = False

    n_encoded: int = 0
    key_bytes: int = 0
    #: What a client holds to run :meth:`client_upload` (SIFL's ``ClientKit``), or None.
    kit: Any = None

    @abstractmethod
    def setup(self, w0: "torch.Tensor") -> None:
        """Draw keys for the initial model ``w0`` and set the server state."""

    @abstractmethod
    def broadcast(self, round_t: int) -> "torch.Tensor":
        """What the server sends every client in round ``round_t``."""

    @abstractmethod
    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> "torch.Tensor":
        """One client's upload from the broadcast ``received`` (identical on every engine)."""

    @abstractmethod
    def server_update(self, aggregated: "torch.Tensor") -> None:
        """Fold the aggregator's output into the server state (e.g. decode, seed 000 eq. 21)."""

    @abstractmethod
    def global_model(self) -> "torch.Tensor":
        """The decoded global model (what a key holder sees)."""

    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """The mutable server state, for a checkpoint."""

    @abstractmethod
    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output."""

    @property
    def upload_shape(self) -> tuple[int, ...]:
        """The shape every client upload must have."""
        return (self.n_encoded,)

    def weighted_sum(self, uploads: list["torch.Tensor"], weights: list[float]) -> "torch.Tensor":
        """``sum_i a_i w_i`` with ``sum_i a_i = 1`` (the aggregation of seed 000 eq. 2)."""
        return sum(w * u for w, u in zip(weights, uploads, strict=True))  # type: ignore[return-value]

    def aggregator_code(self, w_sum: "torch.Tensor") -> "torch.Tensor":
        """What the aggregator forwards after summing (identity; SIFL M2 codes it, eq. 31)."""
        return w_sum

    def aggregate(self, uploads: list["torch.Tensor"], weights: list[float]) -> "torch.Tensor":
        """:meth:`weighted_sum` then :meth:`aggregator_code`."""
        return self.aggregator_code(self.weighted_sum(uploads, weights))

    def design_noise(self, sizes: list[int]) -> None:
        """Calibrate the round noise from the clients' dataset sizes (nothing to design here)."""

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Per-element privacy figures given the clients' dataset sizes (none here)."""
        return {"epsilon_local": None, "epsilon_global": None}

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """What a remote client needs to run :meth:`client_upload` (sent once; nothing here)."""
        return {}

    def key_arrays(self) -> dict[str, np.ndarray]:
        """The server's key material, for a checkpoint's integrity check (none here)."""
        return {}

    @property
    def model_norm_bound(self) -> float | None:
        """The norm bound clients project their local model onto (seed 000 Remark 3), or None."""
        return None
