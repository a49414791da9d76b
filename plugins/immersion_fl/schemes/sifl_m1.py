"""SIFL M1 (seed 000 Algorithm 1): ``w~ = Pi1 w + N1 r`` with fresh ``r`` each round; clients
run the target optimizer (decode once, train, lift the change); the server decodes the aggregate.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import numpy as np
from immersion import InvalidArgumentError
from immersion.keys import DenseCode, code_arrays, code_from_arrays, draw_code
from immersion.privacy import (
    gaussian_epsilon,
    gaussian_min_sigma_bar,
    laplace_epsilon,
    laplace_scale_for,
)

from ..scheme import LocalTrainer, SchemeContext

if TYPE_CHECKING:
    import torch
    from immersion.keys import StructuredCode

    from .modular import ModularSiflM1


from .fedavg import FedAvg
from .kit import (
    ClientKit,
    _torch,
    client_upload,
    kernel_noise,
)
from .options import DENSE_KEY_BYTES, SiflOptions


class SiflM1(FedAvg):
    """SIFL M1 (seed 000 Algorithm 1) and, with one noise column and no DP figures, the
    random-matrix SIFL of seed 003.

    Parameters
    ----------
    options:
        The :class:`SiflOptions`.
    context:
        Backend and key generator from the engine.
    name:
        The registered name (``sifl-m1`` or ``sifl-rm``).
    default_extra:
        ``n~ - n`` when ``options.extra`` is None.
    report_dp:
        Whether the scheme designs noise for ``epsilon_local`` and reports epsilons (seed 003
        gives neither a scale nor a DP analysis: ``sifl-rm`` keeps unit scale and reports none).
    """

    name = "sifl-m1"
    #: What every client holds (set by :meth:`setup`).
    kit: ClientKit

    def __init__(
        self,
        options: SiflOptions,
        context: SchemeContext,
        *,
        name: str = "sifl-m1",
        default_extra: int = 201,
        report_dp: bool = True,
    ) -> None:
        super().__init__()
        self.options, self.name, self.report_dp = options, name, report_dp
        self.extra = options.extra or default_extra
        self.noise, self.delta, self.clip = options.noise, options.delta, options.clip
        self.epsilon_local, self.client_noise = options.epsilon_local, options.client_noise
        self.secure_aggregation = bool(options.secure_aggregation)
        self.rng, self.backend = context.rng, context.backend
        self.noise_scale = 1.0
        #: Simulation only: seeds the clients' noise (None: OS entropy).
        self.client_entropy: int | None = None

    @property
    def model_norm_bound(self) -> float | None:
        """The clients' model norm bound ``C`` (``clip``; seed 000 Remark 3)."""
        return self.clip

    def setup(self, w0: "torch.Tensor") -> None:
        """Draw the keys (dense or block-structured) for ``w0``'s size and keep ``w0``.

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        n = int(w0.numel())
        kind = self.options.key_kind(n + self.extra)
        dense_bytes = 3 * 8 * (n + self.extra) ** 2  # Pi1, Pi1_left and N1 as dense matrices
        if kind == "dense" and dense_bytes > DENSE_KEY_BYTES:
            raise InvalidArgumentError(
                "keys",
                f"dense keys for a model of {n:,} parameters (+{self.extra}) need about "
                f"{dense_bytes / 2**30:.1f} GiB; use keys='block' (O(n * block_size) memory) "
                "or 'auto'",
            )
        self._use_code(
            draw_code(n, self.extra, kind=kind, block_size=self.options.block_size, rng=self.rng)
        )
        self._noise = self.backend.noise_stream(self.rng)
        self.w = w0.clone()
        self._os_entropy = secrets.randbits(64)

    def _use_code(self, code: "DenseCode | StructuredCode") -> None:
        """Hold ``code`` (``Pi1``, ``Pi1_left``, ``N1``) and its runtime encoders."""
        be = self.backend
        self.code = code
        self._encode = code.encoder(be)
        self._decode = code.decoder(be)
        self._encode_noisy = code.noisy_encoder(be)
        self.kit = ClientKit(self._encode, self._decode)
        self.key_bytes = code.nbytes
        self.n_encoded = code.n_total

    def key_arrays(self) -> dict[str, np.ndarray]:
        """The code's arrays (``N1`` included): what a checkpoint saves."""
        return code_arrays(self.code)

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """Use the saved code (:meth:`key_arrays`) instead of the one :meth:`setup` drew.

        Parameters
        ----------
        arrays:
            As in :meth:`Scheme.restore_keys <immersion_fl.scheme.Scheme.restore_keys>`.
        """
        code = code_from_arrays(arrays, name="Pi1")
        if code.n_total != self.code.n_total or code.n_signal != self.code.n_signal:
            raise InvalidArgumentError(
                "keys",
                f"the saved code is {code.n_total} x {code.n_signal}, this run's "
                f"{self.code.n_total} x {self.code.n_signal}",
            )
        self._use_code(code)

    def client_upload(
        self, client: LocalTrainer, received: "torch.Tensor", round_t: int
    ) -> "torch.Tensor":
        """:func:`client_upload`, plus with ``client_noise`` the client's own noise in
        ``ker(Pi1_left)``.

        ``z`` has the round noise's law and scale per entry (``noise``, ``noise_scale``), so each
        element has the variance of the broadcast's round noise (M1, RM: that of the upload's too;
        M2's upload noise is scaled by ``||Pi2^R||``). ``epsilon_local`` is unchanged (independent
        noise added to a DP release is post-processing); ``privacy()`` adds ``epsilon_difference``.
        In this in-process simulation client ``i`` seeds its generator with
        ``(client_entropy, round, i)``; a deployment draws it on the client, from its own entropy.

        Parameters
        ----------
        client, received, round_t:
            As in :meth:`Scheme.client_upload <immersion_fl.scheme.Scheme.client_upload>`.
        """
        upload = client_upload(self.kit, client, received, round_t)
        if not self.client_noise:
            return upload
        entropy = self.client_entropy if self.client_entropy is not None else self._os_entropy
        rng = np.random.default_rng([entropy, round_t, client.index])
        draw = rng.laplace if self.noise == "laplace" else rng.normal
        z = _torch().as_tensor(
            draw(0.0, self.noise_scale, tuple(upload.shape)),
            dtype=upload.dtype,
            device=upload.device,
        )
        return upload + kernel_noise(self.kit, z)

    def _fresh_noise(self, rows: tuple[int, ...] = ()) -> "torch.Tensor":
        return self._draw(rows + (self.code.n_noise,))

    def _draw(self, shape: tuple[int, ...]) -> "torch.Tensor":
        draw = self._noise.laplace if self.noise == "laplace" else self._noise.normal
        return draw(shape, 0.0, self.noise_scale)

    def _sensitivity_rows(self, delta_w: float) -> np.ndarray:
        """Per-element data sensitivity: ``||Pi1^j||_1 Delta_1`` (Laplace) or
        ``||Pi1^j||_2 Delta_2`` (Gaussian)."""
        stats = self.code.row_stats()
        return (stats.l1_signal if self.noise == "laplace" else stats.l2_signal) * delta_w

    def _epsilons(self, sensitivity: np.ndarray, sigma_bar: np.ndarray) -> np.ndarray:
        if self.noise == "laplace":
            return laplace_epsilon(sensitivity, sigma_bar, 1.0)  # eq. 41
        return gaussian_epsilon(sensitivity, sigma_bar, self.delta)  # eq. 44

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """``Pi1 w + N1 r_t`` with a fresh offset every round (seed 000 eq. 19).

        Parameters
        ----------
        round_t:
            The round (the noise stream advances on every call).
        """
        return self._encode_noisy(self.w, self._fresh_noise())  # eq. 19, fresh offset every round

    def encode_for_clients(self, w: "torch.Tensor") -> "torch.Tensor":
        """``Pi1 w + N1 r`` with fresh round noise (eq. 19's code for any model ``w``; a kit
        decodes it).

        Parameters
        ----------
        w:
            A flat model vector (original coordinates).
        """
        return self._encode_noisy(w, self._fresh_noise())

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """``Pi1`` and ``Pi1_left`` as arrays (never ``N1``); refused with ``client_noise``."""
        self._refuse_client_noise_remotely()
        return ClientKit.arrays(self.code, None)

    def _refuse_client_noise_remotely(self) -> None:
        if self.client_noise:
            raise InvalidArgumentError(
                "client_noise",
                "only the local engine supports it (the Flower handshake "
                "sends the kit before the noise scale is calibrated)",
            )

    def state(self) -> dict[str, np.ndarray]:
        """The global model, the noise generator's state and the noise scale."""
        return {
            "w": self.w.cpu().numpy(),
            "noise": np.frombuffer(self._noise.get_state(), dtype=np.uint8),
            "noise_scale": np.array([self.noise_scale]),
        }

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        self.w = _torch().as_tensor(state["w"])
        self._noise.set_state(state["noise"].tobytes())
        self.noise_scale = float(state["noise_scale"][0])

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """Decode the aggregate: ``w = Pi1_left w~`` (seed 000 eq. 21).

        Parameters
        ----------
        aggregated:
            The weighted sum of the encoded uploads.
        """
        self.w = self._decode(aggregated)  # eq. 21

    def _noise_rows(self) -> np.ndarray:
        """Element noise scale per unit sigma: ``||N1^j||_2`` (times ``||Pi2^R||`` in M2)."""
        return self.code.row_stats().l2_noise

    def design_noise(self, sizes: list[int]) -> None:
        """Noise scale meeting ``epsilon_local`` at the worst element (seed 000 eq. 41 or eq. 44;
        Remark 3: Delta = 2C/|D_i|). Without a DP claim (sifl-rm) the offset keeps unit scale.

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        if not self.report_dp:
            return
        sens = self._sensitivity_rows(2 * self.clip / min(sizes))
        if self.noise == "laplace":
            needed = laplace_scale_for(sens, self._noise_rows(), self.epsilon_local)
        else:
            needed = float(
                np.max(
                    gaussian_min_sigma_bar(sens, self.epsilon_local, self.delta)
                    / self._noise_rows()
                )
            )
        self.noise_scale = needed

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Per-element epsilon of uploads (Delta = 2C/|D_i|) and of the broadcast (Delta = 2C/|D|).

        M1 re-encodes the decoded global model with the same law, so eq. 41/44 applies to both.

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        if not self.report_dp:
            return {"epsilon_local": None, "epsilon_global": None}
        sigma_bar = self._noise_rows() * self.noise_scale
        local = self._epsilons(self._sensitivity_rows(2 * self.clip / min(sizes)), sigma_bar)
        glob = self._epsilons(self._sensitivity_rows(2 * self.clip / sum(sizes)), sigma_bar)
        out = {
            "epsilon_local": float(local.max()),
            "epsilon_global": float(glob.max()),
            "noise": self.noise,
            "delta": None if self.noise == "laplace" else self.delta,
        }
        if self.client_noise:
            out["epsilon_difference"] = self._epsilon_difference(sizes)
        return out

    def _epsilon_difference(self, sizes: list[int]) -> float | None:
        """Per-element epsilon of the difference of two uploads with ``client_noise`` (Gaussian
        only).

        The shared round noise cancels; what is left is ``N1 (s_i - s_k)`` with independent
        ``s ~ N(0, sigma^2 I_m)`` (see :func:`kernel_noise`), so eq. 44 applies with
        ``sigma_bar_j = sqrt(2) sigma ||N1^j||_2`` and the sensitivity of one upload. For Laplace
        the client noise is not the law of seed 000 Theorem 1: no epsilon is claimed (None).
        Without ``client_noise`` the difference is noise-free (no finite epsilon).
        """
        if self.noise != "gaussian":
            return None
        sigma_bar = np.sqrt(2.0) * self.code.row_stats().l2_noise * self.noise_scale
        sens = self._sensitivity_rows(2 * self.clip / min(sizes))
        return float(gaussian_epsilon(sens, sigma_bar, self.delta).max())


def sifl_m1_scheme(options: SiflOptions, context: SchemeContext) -> SiflM1 | ModularSiflM1:
    """SIFL M1 with the paper's ``n~ - n = 201`` by default (float or modular arithmetic).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM1

        return ModularSiflM1(options, context)
    return SiflM1(options, context)
