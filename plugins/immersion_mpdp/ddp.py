"""DDP_Client and the server's sum (seed 004 Algorithm 2, Eqs. 16-21), with dropout recovery.

A client's upload has two parts:

* ``gradient``: its odd-layer ``grad_hat`` plus ``eta_k ~ DN(sigma_eta, 1)`` (Eq. 16) plus, for
  every neighbour ``v``, ``+Delta_{k,v}`` if ``k < v`` else ``-Delta_{k,v}``, with
  ``Delta ~ DN(sigma_Delta, 1)`` drawn from the pair's PRG (Eqs. 17 and 19). The ``Delta`` cancel
  in the sum (Eq. 20) up to float64 rounding (about ``1e-16 sigma_Delta`` per element).
* ``corrections``: ``Psi``, the last layer's ``Psi`` vector and ``Phi``. The paper sends them in
  the clear, yet they are noise-free, data-dependent gradients of the perturbed model, which the
  server knows: ``fl_demos/mpdp_attacks.py`` recovers a client's images exactly from its ``Phi``.
  With ``mask_corrections`` (the default) they are fixed-point numbers masked with pairwise
  uniform 64-bit masks, so the server learns only their sum over the round's clients, as in
  secure aggregation. The sum is still noise-free: when the round's clients hold few samples in
  all (10 in the demo), the same attack recovers every one of them from the sum. The engines use
  one 64-bit word per number (``MpdpOptions.correction_words = 1``: 2^-38 resolution, range
  ``2^24 / K``, the sum within ``K 2^-39`` of the float sum) and fall back to two (2^-60
  resolution, range ``2^42 / K``, within about 1e-15) for a round whose corrections do not fit
  one word. Seeds, keystream, fixed point and masks are the core's secure-sum primitive
  (:mod:`immersion.securesum`).

A client that drops out after the key agreement leaves its neighbours' ``Delta`` and masks
uncancelled. :func:`dropout_correction` removes them from the seeds its surviving neighbours
reveal (Bonawitz et al.'s recovery, without the double masking that protects late arrivals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
from immersion import InvalidArgumentError
from immersion.securesum import from_fixed, keystream_uniform, mask, to_fixed

from .laws import uniform_dn
from .lmt import LocalResult

if TYPE_CHECKING:
    from torch import Tensor

PURPOSES = ("delta", "mask")


@dataclass(frozen=True)
class Layout:
    """Flat layout of an upload for an MLP with layer sizes ``(n_0, ..., n_L)``."""

    sizes: tuple[int, ...]

    @classmethod
    def of(cls, weights: Sequence[Tensor]) -> Layout:
        """The layout for weight matrices ``(n_(l+1), n_l)`` (true or perturbed odd layers)."""
        return cls((int(weights[0].shape[1]), *(int(w.shape[0]) for w in weights)))

    @property
    def gradient_shapes(self) -> list[tuple[int, ...]]:
        return [(b, a) for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True)]

    @property
    def correction_shapes(self) -> list[tuple[int, ...]]:
        n_out = self.sizes[-1]
        psi = [(n_out, *s) for s in self.gradient_shapes[:-1]]
        return psi + [(self.sizes[-2],)] + self.gradient_shapes[:-1]

    @property
    def gradient_size(self) -> int:
        return sum(int(np.prod(s)) for s in self.gradient_shapes)

    @property
    def correction_size(self) -> int:
        return sum(int(np.prod(s)) for s in self.correction_shapes)

    def flatten(self, local: LocalResult) -> tuple[np.ndarray, np.ndarray]:
        grad = np.concatenate([g.numpy().ravel() for g in local.grad_hat])
        parts = [p.numpy().ravel() for p in (*local.psi, local.psi_last, *local.phi)]
        return grad, np.concatenate(parts)

    def split(self, flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        out, at = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            out.append(flat[at : at + size].reshape(shape))
            at += size
        return out

    def unflatten(self, gradient: np.ndarray, corrections: np.ndarray) -> LocalResult:
        import torch

        grads = [torch.as_tensor(a) for a in self.split(gradient, self.gradient_shapes)]
        parts = [torch.as_tensor(a) for a in self.split(corrections, self.correction_shapes)]
        n = len(self.sizes) - 2
        return LocalResult(tuple(grads), tuple(parts[:n]), parts[n], tuple(parts[n + 1 :]))


@dataclass(frozen=True)
class NoiseSettings:
    """``sigma_eta`` and ``sigma_Delta`` (0 for no noise), whether the corrections are masked, and
    the 64-bit words per masked number (:func:`immersion.securesum.to_fixed`)."""

    sigma_eta: float = 0.0
    sigma_delta: float = 0.0
    mask_corrections: bool = True
    words: int = 2

    @property
    def masked_words(self) -> int:
        """Words per correction in an upload: 0 in the clear (float64), else ``words``."""
        return self.words if self.mask_corrections else 0


@dataclass(frozen=True)
class Upload:
    """What the server receives from one client."""

    gradient: np.ndarray  # float64, noisy
    corrections: np.ndarray  # float64 in the clear, or uint64 (1 or 2 words per number) masked

    @property
    def nbytes(self) -> int:
        return int(self.gradient.nbytes + self.corrections.nbytes)


def _sign(me: int, peer: int) -> int:
    return 1 if me < peer else -1


def pair_delta(seed: bytes, sigma_delta: float, size: int) -> np.ndarray:
    """``Delta_{k,v} ~ DN(sigma_Delta, 1)`` from the pair's seed (Eq. 19).

    ``DN(sigma_Delta, 1) = Uniform(-sqrt(2) sigma_Delta, sqrt(2) sigma_Delta)``.
    """
    bound = np.sqrt(2.0) * sigma_delta
    return keystream_uniform(seed, size, -bound, bound)


def add_pair_terms(
    grad: np.ndarray,
    corrections: np.ndarray,
    me: int,
    peer: int,
    seeds: dict[str, bytes],
    layout: Layout,
    noise: NoiseSettings,
) -> None:
    """Add, in place, what ``me`` puts into its upload for its pair with ``peer``: ``+Delta`` if
    ``me < peer`` else ``-Delta`` (Eq. 17), and the pair's 64-bit mask with the same sign (mod
    2^64)."""
    add_all_pair_terms(grad, corrections, me, {peer: seeds}, layout, noise)


def add_all_pair_terms(
    grad: np.ndarray,
    corrections: np.ndarray,
    me: int,
    seeds: dict[int, dict[str, bytes]],
    layout: Layout,
    noise: NoiseSettings,
) -> None:
    """:func:`add_pair_terms` for every peer in ``seeds``; the masks in one pass of the core's
    chunked keystream (:func:`immersion.securesum.mask`)."""
    for peer in sorted(seeds):
        if noise.sigma_delta > 0:
            grad += _sign(me, peer) * pair_delta(
                seeds[peer]["delta"], noise.sigma_delta, layout.gradient_size
            )
    if noise.mask_corrections:
        mask(corrections, me, {peer: seeds[peer]["mask"] for peer in seeds})


def ddp_client(
    local: LocalResult,
    layout: Layout,
    *,
    me: int,
    seeds: dict[int, dict[str, bytes]],
    n_clients: int,
    noise: NoiseSettings,
    rng: np.random.Generator,
) -> Upload:
    """Algorithm 2 for client ``me``; ``seeds[v][purpose]`` are its pair seeds with neighbour v."""
    grad, corrections = layout.flatten(local)
    if noise.sigma_eta > 0:
        grad += uniform_dn(noise.sigma_eta, grad.shape, rng)  # Eq. 16
    if noise.mask_corrections:
        corrections = to_fixed(corrections, n_clients, argument="corrections", words=noise.words)
    add_all_pair_terms(grad, corrections, me, seeds, layout, noise)
    return Upload(grad, corrections)


def sum_uploads(uploads: Iterable[Upload], *, masked: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sum of the gradients (Eq. 20) and of the corrections (still masked if ``masked``)."""
    items = list(uploads)
    if not items:
        raise InvalidArgumentError("uploads", "nothing to aggregate")
    grad = np.sum([u.gradient for u in items], axis=0)
    if masked:
        corrections = items[0].corrections.copy()
        for u in items[1:]:
            corrections += u.corrections
    else:
        corrections = np.sum([u.corrections for u in items], axis=0)
    return grad, corrections


def dropout_correction(
    revealed: list[tuple[int, int, dict[str, bytes]]], layout: Layout, noise: NoiseSettings
) -> tuple[np.ndarray, np.ndarray]:
    """What the survivors' uploads hold of their pairs with dropped clients, to subtract.

    ``revealed``: ``(survivor, dropped, seeds)`` for every edge between a survivor and a client
    that dropped out after the key agreement.
    """
    grad = np.zeros(layout.gradient_size)
    corrections = np.zeros(noise.words * layout.correction_size, dtype=np.uint64)
    for survivor, dropped, seeds in revealed:
        add_pair_terms(grad, corrections, survivor, dropped, seeds, layout, noise)
    return grad, corrections


def subtract(
    total: tuple[np.ndarray, np.ndarray], correction: tuple[np.ndarray, np.ndarray], *, masked: bool
) -> tuple[np.ndarray, np.ndarray]:
    grad = total[0] - correction[0]
    corrections = total[1] - correction[1] if masked else total[1]
    return grad, corrections


def mean_local_result(
    total: tuple[np.ndarray, np.ndarray],
    n_uploads: int,
    layout: Layout,
    *,
    masked: bool,
    words: int = 2,
) -> LocalResult:
    """Eqs. 20-21: the averages ``grad_hat``, ``Psi``, ``Phi`` over the ``n_uploads`` clients."""
    grad, corrections = total
    corrections_float = from_fixed(corrections, words=words) if masked else corrections
    return layout.unflatten(grad / n_uploads, corrections_float / n_uploads)
