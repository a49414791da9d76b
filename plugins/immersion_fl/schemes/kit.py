"""What a SIFL client holds and does with it (seed 000 notes section 1): the client kit
(``Pi1``, ``Pi1_left``, M2's ``Pi2^R``), the client's own kernel noise, and the lift of a
locally trained model back into the immersed space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
from immersion.keys import DenseCode, code_arrays

from ..runtime.optimizers import ArrayT
from ..scheme import LocalTrainer

if TYPE_CHECKING:
    from types import ModuleType

    import torch
    from immersion.backends import ArrayBackend
    from immersion.keys import StructuredCode


#: A linear map on tensors: ``Pi1`` (encode) or ``Pi1_left`` (decode) of a client kit.
TensorMap = Callable[["torch.Tensor"], "torch.Tensor"]

#: Code arrays that describe the noise basis N1: the server keeps them, clients never get them.
NOISE_ARRAYS = frozenset({"noise_basis", "noise_pos", "flat_pos"})


@dataclass
class ClientKit:
    """What a client holds to run the target optimizer: ``Pi1`` (lift), ``Pi1_left`` (decode),
    and for M2 the aggregator's ``Pi2^R`` (seed 000 notes section 1: clients can decode).

    Parameters
    ----------
    encode:
        ``w -> Pi1 w`` (no noise).
    decode:
        ``w~ -> Pi1_left w~`` (seed 000 eq. 21).
    pi2_right:
        M2's ``Pi2^R`` as a vector of ``p`` entries (eq. 32), or None (M1, random-matrix SIFL).
    """

    encode: TensorMap
    decode: TensorMap
    pi2_right: "torch.Tensor | None" = None

    def open(self, received: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """``(w~, w)`` from a broadcast: M2's ``p`` columns give ``w~ = w' Pi2^R`` (eq. 32);
        ``w = Pi1_left w~`` is the one decode the target optimizer needs (seed 000 section 7).

        Parameters
        ----------
        received:
            The broadcast: one encoded vector, or M2's ``p`` encoded columns as rows.
        """
        encoded = (
            received
            if (self.pi2_right is None or received.dim() == 1)
            else self.pi2_right @ received
        )
        return encoded, self.decode(encoded)

    def lift(
        self, encoded: "torch.Tensor", w_start: "torch.Tensor", w_end: "torch.Tensor"
    ) -> "torch.Tensor":
        """The upload after local training from ``w_start`` to ``w_end``: :func:`lift_change`.

        Parameters
        ----------
        encoded:
            ``w~``, the encoded model the client received (:meth:`open`).
        w_start, w_end:
            The decoded model before and after local training.
        """
        return lift_change(encoded, w_start, w_end, self.encode)

    @staticmethod
    def arrays(
        code: "DenseCode | StructuredCode", pi2_right: np.ndarray | None
    ) -> dict[str, np.ndarray]:
        """The kit as plain arrays (sent once in the handshake); ``N1`` is not among them.

        Parameters
        ----------
        code:
            The server's code (:func:`immersion.keys.draw_code`).
        pi2_right:
            M2's ``Pi2^R`` (``p x 1``), or None.
        """
        out = {k: v for k, v in code_arrays(code).items() if k not in NOISE_ARRAYS}
        if pi2_right is not None:
            out["pi2_right"] = pi2_right
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], backend: "ArrayBackend") -> "ClientKit":
        """Rebuild a kit on the client side (Flower engine).

        Parameters
        ----------
        arrays:
            :meth:`arrays`' output.
        backend:
            The array backend the kit computes with (torch, float64).
        """
        from immersion.keys.codes import (
            DenseDecoder,
            DenseEncoder,
            StructuredDecoder,
            StructuredEncoder,
        )
        from immersion.keys.structured import MixParams, OrthogonalTransform

        enc: TensorMap
        dec: TensorMap
        if "pi" in arrays:
            enc, dec = DenseEncoder(arrays["pi"], backend), DenseDecoder(arrays["pi_left"], backend)
        else:
            mix = MixParams(
                arrays["blocks"],
                arrays["tail"],
                arrays["householder"],
                arrays["group_ids"],
                arrays["row_perm"],
            )
            transform, scale = OrthogonalTransform(mix, backend), float(arrays["signal_scale"][0])
            enc = StructuredEncoder(transform, arrays["signal_pos"], backend, scale)
            dec = StructuredDecoder(transform, arrays["signal_pos"], backend, scale)
        pi2_right = backend.asarray(arrays["pi2_right"][:, 0]) if "pi2_right" in arrays else None
        return cls(enc, dec, pi2_right)


def kernel_noise(kit: ClientKit, z: "torch.Tensor") -> "torch.Tensor":
    """``(I - Pi1 Pi1_left) z``: the part of ``z`` in ``ker(Pi1_left)``, from the client kit alone.

    Keys drawn here have ``Pi1 = a Q_S`` and ``N1 = Q_N`` with ``Q`` orthogonal, so this is the
    orthogonal projection onto ``range(N1)``; for any left inverse it lies in ``ker(Pi1_left)``,
    which is all exact decoding needs (seed 000 eq. 21: ``Pi1_left (Pi1 w + N1 r + e) = w`` for
    every such ``e``). With ``z ~ N(0, sigma^2 I)`` the result has the law of ``N1 s`` with
    ``s ~ N(0, sigma^2 I_m)``; with Laplace ``z`` each element is a mix of ``n~`` Laplace variables
    (same variance as ``(N1 s)_j``).

    Parameters
    ----------
    kit:
        The client's kit.
    z:
        A vector of the encoded size ``n~``.

    Examples
    --------
    >>> import torch
    >>> from immersion.backends import make_backend
    >>> from immersion.keys import draw_code
    >>> code = draw_code(4, 3, kind="dense", rng=0)
    >>> be = make_backend("torch", dtype="float64", device="cpu")
    >>> kit = ClientKit(code.encoder(be), code.decoder(be))
    >>> e = kernel_noise(kit, torch.ones(7, dtype=torch.float64))
    >>> bool(kit.decode(e).abs().max() < 1e-12)
    True
    """
    return z - kit.encode(kit.decode(z))


def lift_change(
    encoded: ArrayT, before: ArrayT, after: ArrayT, encoder: Callable[[ArrayT], ArrayT]
) -> ArrayT:
    """Target-optimizer lift (seed 000 eq. 20 summed over the local steps):
    ``w~ - Pi1 (w_before - w_after)``.

    Parameters
    ----------
    encoded:
        ``w~``, the encoded model the local training started from.
    before, after:
        The decoded model before and after local training.
    encoder:
        ``d -> Pi1 d``.

    Examples
    --------
    >>> import numpy as np
    >>> lift_change(np.array([5.0]), np.array([1.0]), np.array([0.5]), lambda d: 2 * d).tolist()
    [4.0]
    """
    return encoded - encoder(before - after)


def client_upload(
    kit: ClientKit | None, client: LocalTrainer, received: "torch.Tensor", round_t: int
) -> "torch.Tensor":
    """One client's round, identical on every engine.

    FedAvg (no kit): train from the broadcast model. SIFL: recover ``w~`` (M2: ``w' Pi2^R``,
    eq. 32), decode once, train with the ordinary optimizer, lift the change (seed 000 section 7).

    Parameters
    ----------
    kit:
        The client's kit, or None (FedAvg).
    client:
        Its local training.
    received:
        The server's broadcast.
    round_t:
        The round (seeds the client's batch order).
    """
    if kit is None:
        return client.train(received, round_t)
    encoded, w_start = kit.open(received)
    return kit.lift(encoded, w_start, client.train(w_start, round_t))


def _torch() -> ModuleType:
    import torch

    return torch
