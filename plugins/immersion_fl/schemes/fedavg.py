"""Plain federated averaging (seed 000 eq. 2), the reference every scheme is compared with."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..config import NoOptions
from ..scheme import LocalTrainer, Scheme, SchemeContext

if TYPE_CHECKING:
    import torch


from .kit import ClientKit, _torch, client_upload


class FedAvg(Scheme["torch.Tensor", "torch.Tensor", "torch.Tensor"]):
    """Plain federated averaging (seed 000 eq. 2): the reference every scheme is compared with.

    Parameters
    ----------
    reverse_sum:
        Add the weighted uploads last to first (:meth:`weighted_sum`): the same average up to
        float64 rounding, the reference drift of a run (``run_federated(reference_drift=True)``).

    Examples
    --------
    >>> import torch
    >>> s = FedAvg()
    >>> s.setup(torch.zeros(2, dtype=torch.float64))
    >>> s.broadcast(0).tolist(), s.upload_shape
    ([0.0, 0.0], (2,))
    """

    name = "fedavg"
    #: The server's model (set by :meth:`setup`).
    w: "torch.Tensor"

    def __init__(self, *, reverse_sum: bool = False) -> None:
        self.kit: ClientKit | None = None
        self.reverse_sum = reverse_sum

    def weighted_sum(self, uploads: list["torch.Tensor"], weights: list[float]) -> "torch.Tensor":
        """``sum_i a_i w_i`` with ``sum_i a_i = 1`` (the aggregation of seed 000 eq. 2); with
        ``reverse_sum`` the terms are added last to first (the reference drift of a run).

        Parameters
        ----------
        uploads:
            The clients' uploads.
        weights:
            Their weights ``a_i = |D_i| / |D|`` (over the clients that answered).
        """
        terms = [w * u for w, u in zip(weights, uploads, strict=True)]
        if self.reverse_sum:
            terms.reverse()
        return sum(terms, _torch().zeros_like(terms[0]))  # 0 + t_0 + t_1 + ..., as sum() adds

    def aggregate(self, uploads: list["torch.Tensor"], counts: list[int]) -> "torch.Tensor":
        """:meth:`weighted_sum` with the weights ``n_i / sum n_i``, then :meth:`aggregator_code`.

        Parameters
        ----------
        uploads, counts:
            As in :meth:`Scheme.aggregate <immersion_fl.scheme.Scheme.aggregate>`.
        """
        total = sum(counts)
        return self.aggregator_code(self.weighted_sum(uploads, [n / total for n in counts]))

    def setup(self, w0: "torch.Tensor") -> None:
        """Keep a copy of the initial model.

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        self.w = w0.clone()
        self.n_encoded = int(w0.numel())

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """The global model, in the clear.

        Parameters
        ----------
        round_t:
            The round (unused).
        """
        return self.w

    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> "torch.Tensor":
        """The client's locally trained model (:func:`client_upload`).

        Parameters
        ----------
        client, received, round_t:
            As in :meth:`Scheme.client_upload <immersion_fl.scheme.Scheme.client_upload>`.
        """
        return client_upload(self.kit, client, received, round_t)

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """The weighted mean of the uploads is the new global model.

        Parameters
        ----------
        aggregated:
            The aggregator's output.
        """
        self.w = aggregated

    def global_model(self) -> "torch.Tensor":
        """The global model."""
        return self.w

    def state(self) -> dict[str, np.ndarray]:
        """``{"w": the global model}``."""
        return {"w": self.w.cpu().numpy()}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        self.w = _torch().as_tensor(state["w"])


def fedavg_scheme(options: NoOptions, context: SchemeContext) -> FedAvg:
    """Plain FedAvg (the reference).

    Parameters
    ----------
    options:
        None to set (:class:`~immersion_fl.config.NoOptions`).
    context:
        Unused (FedAvg draws no keys).
    """
    return FedAvg()
