"""SIFL M2 (seed 000 Algorithm 2, eqs. 22-33): the aggregator adds a right-side code ``Pi2``
(1 x p) and noise ``R2 N2``; the server decodes ``Pi1`` only and re-encodes the p columns;
clients recover ``w~ = w' Pi2^R``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from immersion import InvalidArgumentError
from immersion.keys import DenseCode
from scipy.linalg import null_space

from ..scheme import SchemeContext

if TYPE_CHECKING:
    import torch

    from .modular import ModularSiflM2


from .kit import ClientKit, _torch
from .options import SiflOptions
from .sifl_m1 import SiflM1


class SiflM2(SiflM1):
    """SIFL M2: aggregator coding ``w' = w~ Pi2 + R2 N2`` with ``p >= 2`` columns (seed 000
    eqs. 22-33). Parameters as :class:`SiflM1`'s (``options.p`` sets the columns)."""

    name = "sifl-m2"
    #: The server's n x p matrix, as p rows (None before the first aggregation).
    w_bar: "torch.Tensor | None"

    def setup(self, w0: "torch.Tensor") -> None:
        """Draw the keys of :class:`SiflM1`, then the aggregator's ``Pi2`` (1 x p),
        ``Pi2^R`` and ``N2`` (``N2 Pi2^R = 0``).

        Parameters
        ----------
        w0:
            As in :meth:`Scheme.setup <immersion_fl.scheme.Scheme.setup>`.
        """
        self.p = self.options.p
        super().setup(w0)
        pi2 = self.rng.uniform(0.5, 1.5, size=(1, self.p)) * self.rng.choice(
            [-1.0, 1.0], size=(1, self.p)
        )
        pi2_right = pi2.T / float((pi2 @ pi2.T)[0, 0])  # Pi2 Pi2^R = 1
        n2 = null_space(pi2_right.T).T  # (p-1) x p with N2 Pi2^R = 0
        self._use_aggregator_keys(pi2, pi2_right, n2)
        self.w_bar = None

    def _use_aggregator_keys(self, pi2: np.ndarray, pi2_right: np.ndarray, n2: np.ndarray) -> None:
        """Hold ``Pi2`` (1 x p), ``Pi2^R`` (p x 1) and ``N2`` ((p-1) x p) as tensors."""
        torch = _torch()
        as_t = {"dtype": torch.float64, "device": self.w.device}
        self.pi2, self.pi2_right, self.n2 = (
            torch.as_tensor(a, **as_t) for a in (pi2, pi2_right, n2)
        )
        self._pi2_right_array = pi2_right
        self.kit = ClientKit(self._encode, self._decode, self.pi2_right[:, 0])
        self.key_bytes = self.code.nbytes + pi2.nbytes + pi2_right.nbytes + n2.nbytes

    def key_arrays(self) -> dict[str, np.ndarray]:
        """M1's code plus the aggregator's ``Pi2``, ``Pi2^R`` and ``N2``."""
        aggregator = {"pi2": self.pi2, "pi2_right": self.pi2_right, "n2": self.n2}
        return {
            **super().key_arrays(),
            **{f"aggregator.{k}": v.cpu().numpy() for k, v in aggregator.items()},
        }

    def restore_keys(self, arrays: dict[str, np.ndarray]) -> None:
        """M1's :meth:`~SiflM1.restore_keys`, and the aggregator's keys where they were saved.

        Checkpoints written before the aggregator's keys were saved hold the code only: their
        ``Pi2`` is the one
        :meth:`setup` re-drew from the seed, bit for bit on every machine (uniform draws and
        signs only), and ``Pi2^R``, ``N2`` follow from it (on another CPU to rounding; any
        ``N2`` with ``N2 Pi2^R = 0`` cancels the aggregator's noise).

        Parameters
        ----------
        arrays:
            As in :meth:`Scheme.restore_keys <immersion_fl.scheme.Scheme.restore_keys>`.
        """
        super().restore_keys({k: v for k, v in arrays.items() if not k.startswith("aggregator.")})
        names = ("pi2", "pi2_right", "n2")
        if all(f"aggregator.{k}" in arrays for k in names):
            pi2, pi2_right, n2 = (
                np.asarray(arrays[f"aggregator.{k}"], dtype=np.float64) for k in names
            )
            if (
                pi2.shape != (1, self.p)
                or pi2_right.shape != (self.p, 1)
                or n2.shape != (self.p - 1, self.p)
            ):
                raise InvalidArgumentError(
                    "keys", f"the saved Pi2, Pi2^R, N2 do not have p = {self.p} columns"
                )
        else:
            pi2, pi2_right, n2 = (getattr(self, k).cpu().numpy() for k in names)
        self._use_aggregator_keys(pi2, pi2_right, n2)

    def broadcast(self, round_t: int) -> "torch.Tensor":
        """Round 0: M1's ``Pi1 w + N1 r``; then the ``p`` encoded columns of ``w_bar`` (eq. 26).

        Parameters
        ----------
        round_t:
            The round.
        """
        if self.w_bar is None:  # round 0: a plain M1 vector
            return super().broadcast(round_t)
        return self._encode_noisy(
            self.w_bar, self._fresh_noise((self.p,))
        )  # eq. 26: p encoded columns

    def kit_arrays(self) -> dict[str, np.ndarray]:
        """M1's kit plus ``Pi2^R``."""
        self._refuse_client_noise_remotely()
        return ClientKit.arrays(self.code, self._pi2_right_array)

    def state(self) -> dict[str, np.ndarray]:
        """M1's state plus ``w_bar`` (after round 0)."""
        out = super().state()
        if self.w_bar is not None:
            out["w_bar"] = self.w_bar.cpu().numpy()
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state`'s output.

        Parameters
        ----------
        state:
            As in :meth:`Scheme.restore <immersion_fl.scheme.Scheme.restore>`.
        """
        super().restore(state)
        self.w_bar = _torch().as_tensor(state["w_bar"]) if "w_bar" in state else None

    def aggregator_code(self, w_sum: "torch.Tensor") -> "torch.Tensor":
        """``w' = w~ Pi2 + R2 N2`` with fresh ``R2`` (eq. 31), as ``p`` rows.

        Parameters
        ----------
        w_sum:
            The weighted sum of the encoded uploads.
        """
        r2 = self._draw((self.p - 1, self.code.n_total))
        return self.pi2[0][:, None] * w_sum[None, :] + self.n2.T @ r2

    def server_update(self, aggregated: "torch.Tensor") -> None:
        """``w_bar = Pi1_left w'`` column by column (eq. 25: the server decodes ``Pi1`` only).

        Parameters
        ----------
        aggregated:
            The aggregator's ``p`` coded rows.
        """
        self.w_bar = self._decode(aggregated)  # eq. 25: decode Pi1 only, p rows

    def _pi2_right_norm(self) -> float:
        return float(self.pi2_right.norm())

    def _noise_rows(self) -> np.ndarray:
        return super()._noise_rows() * self._pi2_right_norm()  # b = N1 R1 Pi2^R (eq. 37)

    def privacy(self, sizes: list[int]) -> dict[str, Any]:
        """Eq. 41/44 (local) and eq. 42/53 (global, the paper's summed form, which seed000 notes
        section 12 show to be optimistic: the true element std is the root of the sum of squares).

        Parameters
        ----------
        sizes:
            The clients' dataset sizes |D_i|.
        """
        out = super().privacy(sizes)
        stats = self.code.row_stats()
        pi1_left_norm = (
            float(np.linalg.norm(self.code.pi_left, 2))
            if isinstance(self.code, DenseCode)
            else 1.0 / self.code.signal_scale
        )  # block: Pi1_left = Q_S^T / a
        n2_norm = float(np.linalg.norm(self.n2.cpu().numpy(), 2))
        denom = (stats.l2_noise + stats.l2_signal * pi1_left_norm * n2_norm) * self.noise_scale
        sens = (
            self._sensitivity_rows(2 * self.clip / sum(sizes))[:, None]
            * np.abs(self.pi2.cpu().numpy())[0][None, :]
        )
        out["epsilon_global"] = float(self._epsilons(sens, denom[:, None]).max())
        return out

    def global_model(self) -> "torch.Tensor":
        """``w = w_bar Pi2^R``: what a holder of Pi2^R (clients, aggregator) decodes."""
        return self.pi2_right[:, 0] @ self.w_bar if self.w_bar is not None else self.w


def sifl_m2_scheme(options: SiflOptions, context: SchemeContext) -> SiflM2 | ModularSiflM2:
    """SIFL M2 with ``options.p`` aggregator columns (float or modular arithmetic).

    Parameters
    ----------
    options, context:
        As in :class:`SiflM1`.
    """
    if options.arithmetic == "modular":
        from .modular import ModularSiflM2

        return ModularSiflM2(options, context, name="sifl-m2")
    return SiflM2(options, context, name="sifl-m2")
