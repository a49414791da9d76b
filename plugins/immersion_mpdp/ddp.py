"""DDP_Client and the server's sum (seed 004 Algorithm 2, Eqs. 16-21), with dropout recovery.

A client's upload has two parts:

* ``gradient``: its odd-layer ``grad_hat`` plus ``eta_k ~ DN(sigma_eta, 1)`` (Eq. 16) plus, for
  every neighbour ``v`` of the noise graph, ``+Delta_{k,v}`` if ``k < v`` else
  ``-Delta_{k,v}``, with ``Delta ~ DN(sigma_Delta, 1)`` drawn from the pair's PRG (Eqs. 17 and
  19). The ``Delta`` cancel in the sum (Eq. 20) up to float64 rounding (about ``1e-16
  sigma_Delta`` per element).
* ``corrections``: ``Psi``, the last layer's ``Psi`` vector and ``Phi``. The paper sends them in
  the clear, yet they are noise-free, data-dependent gradients of the perturbed model, which the
  server knows: ``fl_demos/mpdp_attacks.py`` recovers a client's images exactly from its ``Phi``.
  With ``mask_corrections`` (the default) they are fixed-point numbers masked with pairwise
  uniform 64-bit masks over the mask graph (connected; sparser than the noise graph from 8
  clients), so the server learns only their sum over the round's clients, as in
  secure aggregation. The sum is still noise-free: when the round's clients hold few samples in
  all (10 in the demo), the same attack recovers every one of them from the sum. The engines use
  one 64-bit word per number (``MpdpOptions.correction_words = 1``: 2^-38 resolution, range
  ``2^24 / K``, the sum within ``K 2^-39`` of the float sum) and fall back to two (2^-60
  resolution, range ``2^42 / K``, within about 1e-15) for a round whose corrections do not fit
  one word. Seeds, keystream, fixed point and masks are the core's secure-sum primitive
  (:mod:`immersion.securesum.protocol`).

A client that drops out after the key agreement leaves its neighbours' ``Delta`` and masks
uncancelled. :func:`dropout_correction` removes them from the seeds its surviving neighbours
reveal (Bonawitz et al.'s recovery, without the double masking that protects late arrivals).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
from immersion import InvalidArgumentError
from immersion.securesum import protocol as securesum
from immersion.securesum.protocol import (
    SEED_BYTES,
    from_fixed,
    keystream,
    keystream_chunks,
    mask,
    mask_fixed,
)

from .laws import uniform_dn
from .lmt import LocalResult

if TYPE_CHECKING:
    from torch import Tensor

PURPOSES = ("delta", "mask")


@dataclass(frozen=True)
class Layout:
    """Flat layout of an upload for an MLP with layer sizes ``(n_0, ..., n_L)``.

    The gradient is the ``L`` matrices in order; the corrections are, for every layer but the
    last, its ``Psi`` (``n_L`` matrices) followed by its ``Phi`` (the rows ``1..n_L + 1`` of the
    layer's batched outer products, :mod:`immersion_mpdp.lmt`), then the last layer's ``Psi``
    vector.
    """

    sizes: tuple[int, ...]

    @classmethod
    def of(cls, weights: Sequence[Tensor]) -> Layout:
        """The layout for weight matrices ``(n_(l+1), n_l)`` (true or perturbed odd layers)."""
        return _layout((int(weights[0].shape[1]), *(int(w.shape[0]) for w in weights)))

    @functools.cached_property
    def gradient_shapes(self) -> list[tuple[int, ...]]:
        return [(b, a) for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=True)]

    @functools.cached_property
    def correction_shapes(self) -> list[tuple[int, ...]]:
        n_out = self.sizes[-1]
        out: list[tuple[int, ...]] = []
        for shape in self.gradient_shapes[:-1]:
            out += [(n_out, *shape), shape]  # Psi^(l), Phi^(l)
        return out + [(self.sizes[-2],)]

    @functools.cached_property
    def gradient_size(self) -> int:
        return sum(math.prod(s) for s in self.gradient_shapes)

    @functools.cached_property
    def correction_size(self) -> int:
        return sum(math.prod(s) for s in self.correction_shapes)

    def flatten(self, local: LocalResult, *, copy: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The flat gradient and corrections of ``local``.

        Parameters
        ----------
        local : LocalResult
            LMT's output for this layout.
        copy : bool
            False: when ``local`` was computed into flat buffers of this layout
            (:func:`immersion_mpdp.lmt.local_model_training` does), return those buffers
            themselves; changing them then changes ``local``.
        """
        if self._views_flat(local):
            assert local.flat is not None
            grad, corrections = local.flat
            return (grad.copy(), corrections.copy()) if copy else (grad, corrections)
        grad = np.concatenate([g.numpy().ravel() for g in local.grad_hat])
        parts = []
        for psi, phi in zip(local.psi, local.phi, strict=True):
            parts += [psi.numpy().ravel(), phi.numpy().ravel()]
        return grad, np.concatenate([*parts, local.psi_last.numpy().ravel()])

    def _views_flat(self, local: LocalResult) -> bool:
        """Whether every tensor of ``local`` is, in this layout, a view of ``local.flat`` (not so
        after ``dataclasses.replace`` of a tensor, say)."""
        if local.flat is None:
            return False
        grad, corrections = local.flat
        if (grad.size, corrections.size) != (self.gradient_size, self.correction_size):
            return False
        parts = []
        for psi, phi in zip(local.psi, local.phi, strict=True):
            parts += [psi, phi]
        for tensors, flat, shapes in (
            (local.grad_hat, grad, self.gradient_shapes),
            ([*parts, local.psi_last], corrections, self.correction_shapes),
        ):
            if len(tensors) != len(shapes):
                return False
            address = flat.ctypes.data
            for tensor, shape in zip(tensors, shapes, strict=True):
                if tensor.data_ptr() != address or tuple(tensor.shape) != shape:
                    return False
                if not tensor.is_contiguous():
                    return False
                address += 8 * math.prod(shape)
        return True

    def split(self, flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        out, at = [], 0
        for shape in shapes:
            size = math.prod(shape)
            out.append(flat[at : at + size].reshape(shape))
            at += size
        return out

    def unflatten(self, gradient: np.ndarray, corrections: np.ndarray) -> LocalResult:
        import torch

        grads = [torch.as_tensor(a) for a in self.split(gradient, self.gradient_shapes)]
        parts = [torch.as_tensor(a) for a in self.split(corrections, self.correction_shapes)]
        return LocalResult(tuple(grads), tuple(parts[0:-1:2]), parts[-1], tuple(parts[1:-1:2]))


@functools.lru_cache(maxsize=16)
def _layout(sizes: tuple[int, ...]) -> Layout:
    """One Layout per shape (its sizes are computed once)."""
    return Layout(sizes)


@dataclass(frozen=True)
class NoiseSettings:
    """``sigma_eta`` and ``sigma_Delta`` (0 for no noise), whether the corrections are masked, and
    the 64-bit words per masked number (:func:`immersion.securesum.protocol.to_fixed`)."""

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

    ``DN(sigma_Delta, 1) = Uniform(-sqrt(2) sigma_Delta, sqrt(2) sigma_Delta)``: with ``b =
    sqrt(2) sigma_Delta`` and ``w`` the top 53 bits of each keystream word, ``b (w 2^-52 - 1)``,
    a grid of ``2^53`` points spread evenly over ``[-b, b)``.
    """
    bound = np.sqrt(2.0) * sigma_delta
    words = (keystream(seed, size) >> np.uint64(11)).astype(np.float64)
    return bound * (words * 2.0**-52 - 1.0)


def add_pair_deltas(
    grad: np.ndarray, me: int, seeds: Mapping[int, bytes], sigma_delta: float
) -> np.ndarray:
    """``grad`` plus ``sum_v +-Delta_{me,v}`` over the peers in ``seeds`` (in place, Eq. 17).

    The sum of the signed 53-bit words is taken exactly in integers, chunk by chunk of each
    pair's keystream, and turned into ``b (2^-52 sum_v +-w_v - sum_v +-1)`` once: the same
    numbers as adding every :func:`pair_delta` with its sign, up to one rounding instead of one
    per peer.

    Parameters
    ----------
    grad : np.ndarray
        float64, changed in place.
    me : int
        This client.
    seeds : mapping of int to bytes
        ``{peer: Delta seed}``.
    sigma_delta : float
        ``sigma_Delta``.

    Returns
    -------
    np.ndarray
        ``grad``.
    """
    if not seeds:
        return grad
    for peer, seed in seeds.items():
        if peer == me or not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            raise InvalidArgumentError("seeds", f"bad Delta seed for peer {peer}")
    total = np.zeros(grad.size, dtype=np.int64)
    signs = 0
    for peer in sorted(seeds):
        op = np.add if me < peer else np.subtract
        signs += _sign(me, peer)
        for start, stream in keystream_chunks(seeds[peer], grad.size):
            np.right_shift(stream, np.uint64(11), out=stream)
            part = total[start : start + stream.size]
            op(part, stream.view(np.int64), out=part)
    bound = np.sqrt(2.0) * sigma_delta
    noise = total.astype(np.float64)
    noise *= 2.0**-52
    noise -= signs
    noise *= bound
    grad += noise
    return grad


def _purpose_seeds(seeds: Mapping[int, Mapping[str, bytes]], purpose: str) -> dict[int, bytes]:
    return {peer: s[purpose] for peer, s in seeds.items() if purpose in s}


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
    2^64); each only if ``seeds`` has its purpose (the edge carries it)."""
    add_all_pair_terms(grad, corrections, me, {peer: seeds}, layout, noise)


def add_all_pair_terms(
    grad: np.ndarray,
    corrections: np.ndarray,
    me: int,
    seeds: Mapping[int, Mapping[str, bytes]],
    layout: Layout,
    noise: NoiseSettings,
) -> None:
    """:func:`add_pair_terms` for every peer in ``seeds``: the ``Delta`` of the peers with a
    ``"delta"`` seed summed in integers (:func:`add_pair_deltas`), the masks of those with a
    ``"mask"`` seed in one pass of the core's chunked keystream."""
    if noise.sigma_delta > 0:
        add_pair_deltas(grad, me, _purpose_seeds(seeds, "delta"), noise.sigma_delta)
    if noise.mask_corrections:
        mask(corrections, me, _purpose_seeds(seeds, "mask"))


def ddp_client(
    local: LocalResult,
    layout: Layout,
    *,
    me: int,
    seeds: Mapping[int, Mapping[str, bytes]],
    n_clients: int,
    noise: NoiseSettings,
    rng: np.random.Generator,
    consume: bool = False,
) -> Upload:
    """Algorithm 2 for client ``me``; ``seeds[v][purpose]`` are its pair seeds with neighbour v.

    A neighbour whose seeds lack a purpose shares no term of that kind with ``me`` (the round's
    graph of the noise ``Delta`` and that of the masks may differ,
    :func:`immersion_mpdp.agreement.round_graph`).

    Parameters
    ----------
    local : LocalResult
        LMT's output.
    layout : Layout
        The upload's layout.
    me : int
        This client.
    seeds : mapping
        ``{neighbour: {purpose: seed}}``.
    n_clients : int
        Clients in the round (the fixed-point range).
    noise : NoiseSettings
        Noise scales, masking, words per masked number.
    rng : np.random.Generator
        Source of ``eta``.
    consume : bool
        Build the upload in ``local``'s own flat buffers (no copy; ``local`` is spent).

    Returns
    -------
    Upload
        What the server receives.
    """
    grad, corrections = layout.flatten(local, copy=not consume)
    return ddp_upload(
        grad, corrections, me=me, seeds=seeds, n_clients=n_clients, noise=noise, rng=rng
    )


def ddp_upload(
    grad: np.ndarray,
    corrections: np.ndarray,
    *,
    me: int,
    seeds: Mapping[int, Mapping[str, bytes]],
    n_clients: int,
    noise: NoiseSettings,
    rng: np.random.Generator,
) -> Upload:
    """:func:`ddp_client` on LMT's flat gradient and corrections, which it overwrites.

    Parameters
    ----------
    grad, corrections : np.ndarray
        Contiguous float64, of the layout's sizes; spent (the upload is built in them).
    me, seeds, n_clients, noise, rng
        As in :func:`ddp_client`.

    Returns
    -------
    Upload
        What the server receives.
    """
    if noise.sigma_eta > 0:
        grad += uniform_dn(noise.sigma_eta, grad.shape, rng)  # Eq. 16
    if noise.sigma_delta > 0:
        add_pair_deltas(grad, me, _purpose_seeds(seeds, "delta"), noise.sigma_delta)
    if noise.mask_corrections:
        corrections = mask_fixed(
            corrections,
            n_clients,
            me,
            _purpose_seeds(seeds, "mask"),
            words=noise.words,
            argument="corrections",
            overwrite=True,
        )
    return Upload(grad, corrections)


def sum_uploads(
    uploads: Iterable[Upload],
    *,
    masked: bool,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of the gradients (Eq. 20) and of the corrections (still masked if ``masked``), in
    upload order, into one buffer each (``out``'s, when their shapes and types fit)."""
    items = list(uploads)
    if not items:
        raise InvalidArgumentError("uploads", "nothing to aggregate")
    first = items[0]
    fits = out is not None and all(
        (o.shape, o.dtype) == (a.shape, a.dtype)
        for o, a in zip(out, (first.gradient, first.corrections), strict=True)
    )
    if fits:
        assert out is not None
        grad, corrections = out
        np.copyto(grad, first.gradient)
        np.copyto(corrections, first.corrections)
    else:
        grad, corrections = first.gradient.copy(), first.corrections.copy()
    for u in items[1:]:
        grad += u.gradient
        corrections += u.corrections
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
    """Eqs. 20-21: the averages ``grad_hat``, ``Psi``, ``Phi`` over the ``n_uploads`` clients.

    With one word per masked correction, the sum's words are read back as floats in place
    (``total`` is spent), otherwise into new arrays; the same numbers either way."""
    grad, corrections = total
    if masked and words == 1 and corrections.flags.c_contiguous and corrections.flags.writeable:
        corrections_float = corrections.view(np.float64)
        scale = 2.0**-securesum.ONE_LIMB_BITS  # as from_fixed
        np.multiply(corrections.view(np.int64), scale, out=corrections_float)
    else:
        corrections_float = from_fixed(corrections, words=words) if masked else corrections.copy()
    corrections_float /= n_uploads
    return layout.unflatten(grad / n_uploads, corrections_float)
