"""The contract of a weight-averaging federated scheme, and what the engine hands it.

A round of any such scheme (seed 000 eq. 2 generalised): the server :meth:`~Scheme.broadcast`\\ s,
every client computes its :meth:`~Scheme.client_upload` from what it received, the aggregator
:meth:`~Scheme.aggregate`\\ s the uploads (their weighted sum, then
:meth:`~Scheme.aggregator_code`), and the server folds the result into its state
(:meth:`~Scheme.server_update`). :meth:`~Scheme.global_model` is
the decoded model a key holder would see. The optional capabilities have defaults here (no noise
to design, no privacy figures, no key material, no secure sum), so an engine calls them
unconditionally instead of probing.

:class:`Scheme` is generic over what travels: ``Scheme[BroadcastT, UploadT, AggregateT]``. The
float schemes are ``Scheme[Tensor, Tensor, Tensor]``
(:class:`~immersion_fl.schemes.FedAvg` and its subclasses); the modular ones broadcast an
:class:`~immersion_fl.schemes.modular.IntegerBroadcast`, upload ``uint64`` arrays and aggregate
to the integer sum with its total weight (:mod:`immersion_fl.schemes.modular`).

Schemes whose rounds do not fit (MP-DP, seed 001's schemes) register a ``runner`` instead
(:class:`immersion_fl.hookspecs.SchemeSpec`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np
from immersion import InvalidArgumentError

if TYPE_CHECKING:
    import torch
    from immersion.backends import ArrayBackend

    from .schemes import ClientKit
    from .schemes.modular import ModularClientKit

#: What the server broadcasts (:meth:`Scheme.broadcast`).
BroadcastT = TypeVar("BroadcastT")
#: One client's upload (:meth:`Scheme.client_upload`).
UploadT = TypeVar("UploadT")
#: What the aggregator hands the server (:meth:`Scheme.aggregate`).
AggregateT = TypeVar("AggregateT")


class LocalTrainer(Protocol):
    """A client as a scheme sees it: an index, a dataset size and local training."""

    @property
    def index(self) -> int:
        """The client's position in the federation."""

    @property
    def n_samples(self) -> int:
        """|D_i|, the size of its training set."""

    def train(self, w_start: "torch.Tensor", round_t: int) -> "torch.Tensor":
        """The model after this round's local training from ``w_start`` (original coordinates).

        Parameters
        ----------
        w_start:
            The model local training starts from (decoded, in original coordinates).
        round_t:
            The round (seeds the batch order).
        """


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


class Scheme(ABC, Generic[BroadcastT, UploadT, AggregateT]):
    """A weight-averaging federated scheme. Subclasses: :class:`~immersion_fl.schemes.FedAvg`,
    :class:`~immersion_fl.schemes.SiflM1`, :class:`~immersion_fl.schemes.SiflM2` (float,
    ``Scheme[Tensor, Tensor, Tensor]``), and the modular ones of
    :mod:`immersion_fl.schemes.modular`.

    Examples
    --------
    >>> import torch
    >>> from immersion_fl.schemes import FedAvg
    >>> s = FedAvg()
    >>> s.setup(torch.zeros(3, dtype=torch.float64))
    >>> s.server_update(s.aggregate([torch.ones(3), 3 * torch.ones(3)], [10, 10]))
    >>> s.global_model().tolist(), s.privacy([10, 10])
    ([2.0, 2.0, 2.0], {'epsilon_local': None, 'epsilon_global': None})
    """

    #: The registered name.
    name: str = ""

    #: The size of an encoded model (the upload length).
    n_encoded: int = 0
    #: Bytes of key material the server holds.
    key_bytes: int = 0
    #: What a client holds to run :meth:`client_upload` (SIFL's ``ClientKit`` or
    #: ``ModularClientKit``), or None.
    kit: "ClientKit | ModularClientKit | None" = None
    #: Whether the engines run the aggregation as a secure sum (:mod:`immersion_fl.runtime.secure`):
    #: the weighted sum of :meth:`aggregate` is then computed from masked uploads,
    #: :meth:`aggregator_code` and :meth:`server_update` run unchanged on the result (float
    #: schemes, whose aggregate is the coded weighted sum).
    secure_aggregation: bool = False

    @abstractmethod
    def setup(self, w0: "torch.Tensor") -> None:
        """Draw keys for the initial model ``w0`` and set the server state.

        Parameters
        ----------
        w0:
            The initial flat parameter vector.
        """

    @abstractmethod
    def broadcast(self, round_t: int) -> BroadcastT:
        """What the server sends every client in round ``round_t``.

        Parameters
        ----------
        round_t:
            The round, from 0.
        """

    @abstractmethod
    def client_upload(self, client: LocalTrainer, received: BroadcastT, round_t: int) -> UploadT:
        """One client's upload from the broadcast ``received`` (identical on every engine).

        Parameters
        ----------
        client:
            The client's local training.
        received:
            What :meth:`broadcast` returned.
        round_t:
            The round.
        """

    @abstractmethod
    def server_update(self, aggregated: AggregateT) -> None:
        """Fold the aggregator's output into the server state (e.g. decode, seed 000 eq. 21).

        Parameters
        ----------
        aggregated:
            What :meth:`aggregate` returned.
        """

    @abstractmethod
    def global_model(self) -> "torch.Tensor":
        """The decoded global model (what a key holder sees)."""

    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """The mutable server state, for a checkpoint."""

    @abstractmethod
    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            A saved server state.
        """

    @property
    def upload_shape(self) -> tuple[int, ...]:
        """The shape every client upload must have."""
        return (self.n_encoded,)

    @property
    def upload_dtype(self) -> type[np.generic] | None:
        """The numpy dtype of integer uploads, or None for float tensors (the float schemes)."""
        return None

    @abstractmethod
    def aggregate(self, uploads: list[UploadT], counts: list[int]) -> AggregateT:
        """What the aggregator hands the server: the weighted sum of the uploads (seed 000 eq. 2),
        coded by :meth:`aggregator_code` (float schemes: the weights ``n_i / sum n_i``; integer
        schemes: the integers ``n_i`` and their total).

        Parameters
        ----------
        uploads:
            The surviving clients' uploads.
        counts:
            Their dataset sizes ``n_i = |D_i|``.
        """

    def aggregator_code(self, w_sum: UploadT) -> UploadT:
        """What the aggregator forwards after summing (identity; SIFL M2 codes it, eq. 31).

        Parameters
        ----------
        w_sum:
            The weighted sum of the uploads.
        """
        return w_sum

    def plain_twin(self) -> "AnyScheme | None":
        """The plain reference this scheme must reproduce: None for plain FedAvg (the server
        builds it); integer schemes return FedAvg on the same fixed-point values."""
        return None

    def design_noise(self, sizes: list[int]) -> None:  # noqa: B027 - an optional capability
        """Calibrate the round noise from the clients' dataset sizes (nothing to design here).

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Per-element privacy figures given the clients' dataset sizes (none here).

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        return {"epsilon_local": None, "epsilon_global": None}

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """What a remote client needs to run :meth:`client_upload` (sent once; nothing here)."""
        return {}

    def key_arrays(self) -> dict[str, np.ndarray]:
        """All the server's key material, by a stable name: what a checkpoint saves (none here)."""
        return {}

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """Replace the keys :meth:`setup` drew by saved ones (:meth:`key_arrays`' output).

        A checkpoint resumes from the keys it carries, never from keys re-drawn from the seed:
        float keys re-drawn on another CPU or BLAS kernel differ in their last bits.

        Parameters
        ----------
        arrays:
            The saved key material (here: none is expected).
        """
        if arrays:
            raise InvalidArgumentError(
                "keys", f"scheme {self.name!r} holds no keys, got {sorted(arrays)[:4]}"
            )

    @property
    def model_norm_bound(self) -> float | None:
        """The norm bound clients project their local model onto (seed 000 Remark 3), or None."""
        return None


#: A scheme whatever travels on its wire (what the engines hold: they pass each value from one
#: method of the scheme to the next without looking inside).
AnyScheme = Scheme[Any, Any, Any]
