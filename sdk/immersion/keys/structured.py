"""Block-structured orthogonal keys: O(n*b) memory and time (the paper's dense keys are O(n^2)).

One code is an orthogonal matrix ``Q = P^T H B`` of size ``n~ x n~`` (``n~ = n + m``):

* ``B``: block diagonal with Haar-random orthogonal blocks of size ``b`` (the last may be smaller);
* ``H``: block diagonal over *groups* (contiguous runs of blocks) of Householder reflections
  ``I - 2 h h^T``; each group's ``h`` maps one chosen noise column to a flat vector
  ``±1/sqrt(group size)``, so every row of ``N`` is non-zero by construction;
* ``P``: a random row permutation.

``Pi = Q[:, signal positions]`` and ``N = Q[:, noise positions]``; because ``Q`` is orthogonal,
``Pi^L = Pi^T`` and ``Pi^L N = 0`` exactly in exact arithmetic (seed 002, Proposition 1 needs
full column rank, a left inverse and a kernel basis). Applying ``Q`` or ``Q^T`` costs
``O(n~ b)``; the row norms the DP theorems need are computed exactly from the factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import RowStats


@dataclass(frozen=True, eq=False)
class MixParams:
    """The factors of ``Q = P^T H B`` (internal coordinates are B's columns)."""

    blocks: np.ndarray  # (n_full_blocks, b, b)
    tail: np.ndarray  # (t, t), t = n~ - n_full_blocks * b (may be 0)
    householder: np.ndarray  # (n~,), unit norm within each group
    group_ids: np.ndarray  # (n~,), sorted: groups are contiguous in internal rows
    row_perm: np.ndarray  # (n~,), output row i is internal row row_perm[i]

    @property
    def size(self) -> int:
        return int(self.householder.shape[0])

    @property
    def n_groups(self) -> int:
        return int(self.group_ids[-1]) + 1

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (self.blocks, self.tail, self.householder, self.group_ids, self.row_perm)
        )


#: Entries per chunk when drawing blocks or computing row statistics (bounds temporary memory).
_CHUNK_ENTRIES = 1 << 21


def _haar_orthogonal(rng: np.random.Generator, count: int, size: int) -> np.ndarray:
    """``count`` Haar-random orthogonal ``size x size`` matrices (QR with sign fix)."""
    out = np.empty((count, size, size))
    if count == 0 or size == 0:
        return out
    chunk = max(1, _CHUNK_ENTRIES // (size * size))  # bounded temporaries: peak memory ~ the keys
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        q, r = np.linalg.qr(rng.standard_normal((hi - lo, size, size)))
        signs = np.sign(np.diagonal(r, axis1=1, axis2=2))
        signs[signs == 0] = 1.0
        np.multiply(q, signs[:, None, :], out=out[lo:hi])
    return out


def _split_sizes(total: int, parts: int) -> np.ndarray:
    """Sizes of ``parts`` near-equal contiguous pieces of ``total``."""
    base, extra = divmod(total, parts)
    return np.array([base + 1] * extra + [base] * (parts - extra), dtype=np.int64)


def _noise_counts(group_sizes: np.ndarray, n_noise: int) -> np.ndarray:
    """Noise coordinates per group: at least one each, the rest in proportion to free room.

    What proportional shares leave over goes to the groups with the most room left, in turn.
    """
    counts = np.ones_like(group_sizes)
    room = group_sizes - 1
    left = n_noise - counts.sum()
    if left > 0:
        share = np.minimum(room, (left * room) // max(room.sum(), 1))
        counts += share
        left -= int(share.sum())
        order = np.argsort(-(room - share), kind="stable")
        free = (room - share)[order]
        before = np.cumsum(free) - free  # taken by the groups ahead in turn
        counts[order] += np.clip(left - before, 0, free)
    return counts


def block_matvec(blocks: np.ndarray, tail: np.ndarray, v: Any, out: Any, matmul: Any = None) -> Any:
    """``out = B v`` for block-diagonal ``B`` given as full blocks plus a tail (numpy or torch)."""
    n_full, b = blocks.shape[0], blocks.shape[-1]
    full = n_full * b
    if n_full:
        lead = tuple(v.shape[:-1])
        vb = v[..., :full].reshape(lead + (n_full, b, 1))
        out[..., :full] = (blocks @ vb if matmul is None else matmul(blocks, vb)).reshape(
            lead + (full,)
        )
    if tail.shape[0]:
        out[..., full:] = v[..., full:] @ tail.T
    return out


class OrthogonalTransform:
    """Runtime form of ``Q`` on one backend: ``forward(v) = Q v``, ``adjoint(x) = Q^T x``."""

    def __init__(self, params: MixParams, backend: Any) -> None:
        self._backend = backend
        self.size = params.size
        self._blocks = backend.asarray(params.blocks)
        self._blocks_t = self._blocks.swapaxes(-1, -2)  # a view: no second copy of the blocks
        self._tail = backend.asarray(params.tail)
        self._tail_t = self._tail.swapaxes(-1, -2)
        self._h = backend.asarray(params.householder)
        self._gid = backend.asarray(params.group_ids)
        self._n_groups = params.n_groups
        self._perm = backend.asarray(params.row_perm)
        self._inv_perm = backend.asarray(np.argsort(params.row_perm))
        #: Bytes of key arrays one application reads (blocks, tail, reflections, one permutation).
        self.key_nbytes = params.nbytes

    def _reflect(self, w: Any) -> Any:
        be = self._backend
        sums = be.segment_sum(self._h * w, self._gid, self._n_groups)
        return w - 2.0 * self._h * be.take(sums, self._gid)

    def forward(self, v: Any) -> Any:
        be = self._backend
        w = block_matvec(self._blocks, self._tail, v, be.zeros(tuple(v.shape)), be.block_matmul)
        return be.take(self._reflect(w), self._perm)

    def adjoint(self, x: Any) -> Any:
        be = self._backend
        w = self._reflect(be.take(x, self._inv_perm))
        return block_matvec(
            self._blocks_t, self._tail_t, w, be.zeros(tuple(w.shape)), be.block_matmul
        )


def _group_layout(
    size: int, block_size: int, n_noise: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(block_starts, group_starts, group_ids, noise_per_group)`` of one code's layout.

    Blocks of ``block_size`` rows (the last may be smaller); ``min(n_noise, blocks)`` groups of
    contiguous blocks; the group of every row; noise entries per group (:func:`_noise_counts`).
    """
    n_blocks = -(-size // block_size)
    block_starts = np.minimum(np.arange(n_blocks + 1, dtype=np.int64) * block_size, size)
    n_groups = min(n_noise, n_blocks)
    group_block_starts = np.concatenate([[0], np.cumsum(_split_sizes(n_blocks, n_groups))])
    group_starts = block_starts[group_block_starts]
    group_ids = np.repeat(np.arange(n_groups, dtype=np.int64), np.diff(group_starts))
    return block_starts, group_starts, group_ids, _noise_counts(np.diff(group_starts), n_noise)


#: The two signs of a flat vector (an array, so drawing from it skips a list conversion).
_SIGNS = np.array([-1.0, 1.0])


def _per_group(rng: np.random.Generator, group_starts: np.ndarray, counts: np.ndarray) -> tuple:
    """``(noise_pos, flat_pos)``: ``counts[g]`` distinct rows drawn in random order inside every
    group ``g`` (concatenated), and the first of each group.

    One ``rng.choice`` per group, in the order earlier versions drew them, so that keys drawn from
    a seed stay byte-identical (federated checkpoints re-draw their keys from the seed and compare
    bytes on resume); each call is O(counts[g]) and allocates nothing of the code's size.
    """
    sizes = np.diff(group_starts)
    chosen = [
        lo + rng.choice(size, size=k, replace=False)
        for lo, size, k in zip(group_starts[:-1], sizes, counts, strict=True)
    ]
    return np.concatenate(chosen).astype(np.int64), np.array([c[0] for c in chosen], np.int64)


def _flat_householder(
    rng: np.random.Generator,
    blocks: np.ndarray,
    tail: np.ndarray,
    group_starts: np.ndarray,
    group_ids: np.ndarray,
    flat_pos: np.ndarray,
) -> np.ndarray:
    """Unit vectors ``h`` (one per group) with ``(I - 2 h h^T) B e_flat`` flat ``±1/sqrt(size)``.

    ``h = (x - flat) / ||x - flat||`` with ``x = B e_flat`` (dense inside one block); a group whose
    ``x`` is already that flat vector gets ``h = 0`` (``H = I``). The signs are drawn group by
    group and each norm is taken over its group's slice with a BLAS dot, as earlier versions did
    (a plain sequential sum over a 100,000-row group lost 1e-12 of orthogonality).
    """
    size = group_ids.shape[0]
    sizes = np.diff(group_starts)
    signs = np.concatenate([rng.choice(_SIGNS, size=n) for n in sizes])
    diff = -(signs / np.sqrt(sizes)[group_ids])  # -flat
    n_full, b = blocks.shape[0], blocks.shape[-1]
    in_full = flat_pos < n_full * b
    k, col = np.divmod(flat_pos[in_full], b)
    diff[(k * b)[:, None] + np.arange(b)] += blocks[k, :, col]  # x: column ``col`` of block ``k``
    if not in_full.all():  # the tail block holds one group's flat column
        full = n_full * b
        diff[full:] += tail[:, int(flat_pos[~in_full][0]) - full]
    norm = np.array(
        [
            np.linalg.norm(diff[a:b])
            for a, b in zip(group_starts[:-1], group_starts[1:], strict=True)
        ]
    )
    norm = norm[group_ids]
    return np.divide(diff, norm, out=np.zeros(size), where=norm > 1e-12)


def draw_structured_layout(
    rng: np.random.Generator, n_signal: int, n_noise: int, block_size: int
) -> tuple[MixParams, np.ndarray, np.ndarray, np.ndarray]:
    """Draw one block-structured code.

    Returns ``(params, signal_pos, noise_pos, flat_pos)``: internal positions of the signal
    coordinates, of the noise coordinates, and of each group's flat noise column. The blocks are
    drawn as stacked QRs and the reflections computed for all groups at once; only the random
    draws of each group stay one call per group (same values as earlier versions).
    """
    size = n_signal + n_noise
    b = min(block_size, size)
    n_full = size // b
    blocks = _haar_orthogonal(rng, n_full, b)
    tail_size = int(size - n_full * b)
    tail = _haar_orthogonal(rng, 1, tail_size)[0] if tail_size else np.zeros((0, 0))

    _, group_starts, group_ids, noise_per_group = _group_layout(size, b, n_noise)
    noise_pos, flat_pos = _per_group(rng, group_starts, noise_per_group)
    is_noise = np.zeros(size, dtype=bool)
    is_noise[noise_pos] = True
    signal_pos = rng.permutation(np.flatnonzero(~is_noise)).astype(np.int64)
    params = MixParams(
        blocks=blocks,
        tail=tail,
        householder=_flat_householder(rng, blocks, tail, group_starts, group_ids, flat_pos),
        group_ids=group_ids,
        row_perm=rng.permutation(size).astype(np.int64),
    )
    return params, signal_pos, noise_pos, flat_pos


def _within_block_stats(
    blocks: np.ndarray, h: np.ndarray, z: np.ndarray, is_noise: np.ndarray, is_flat: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Per-row in-block sums for a stack of equal blocks (shapes ``(k, b, b)`` and ``(k, b)``)."""
    entries = blocks - 2.0 * h[:, :, None] * z[:, None, :]  # Q restricted to the block
    sig = (~is_noise)[:, None, :]
    noi = is_noise[:, None, :]
    abs_e, sq_e = np.abs(entries), entries**2

    def per_block(
        values: np.ndarray, mask: np.ndarray
    ) -> np.ndarray:  # same for every row of a block
        return np.broadcast_to((values * mask).sum(-1, keepdims=True), h.shape)

    return (
        (abs_e * sig).sum(-1),
        per_block(np.abs(z), ~is_noise),
        (sq_e * sig).sum(-1),
        per_block(z**2, ~is_noise),
        (sq_e * noi).sum(-1),
        per_block(z**2, is_noise),
        (abs_e * noi).max(-1, initial=0.0),
        (abs_e * is_flat[:, None, :]).sum(-1),
    )


def structured_row_stats(
    params: MixParams, noise_pos: np.ndarray, flat_pos: np.ndarray
) -> tuple[RowStats, np.ndarray]:
    """Exact row norms of ``Pi`` and ``N`` from the factors, plus ``|Q[i, flat column of i's
    group]|``.

    Entry ``(r, c)`` of ``H B`` (internal rows) is ``B[r, c] - 2 h_r z_c`` inside r's block and
    ``-2 h_r z_c`` elsewhere in r's group, with ``z = B^T h``; so each row costs O(b).
    """
    size, b = params.size, params.blocks.shape[-1] if params.blocks.size else params.tail.shape[0]
    h = params.householder
    z = np.empty(size)
    n_full, bb = params.blocks.shape[0], params.blocks.shape[-1]
    step = max(1, _CHUNK_ENTRIES // max(bb * bb, 1))  # contiguous transposes, chunk by chunk
    for lo in range(0, n_full, step):
        hi = min(n_full, lo + step)
        blocks_t = np.ascontiguousarray(params.blocks[lo:hi].transpose(0, 2, 1))
        z[lo * bb : hi * bb] = (blocks_t @ h[lo * bb : hi * bb].reshape(-1, bb, 1)).ravel()
    if params.tail.shape[0]:
        z[n_full * bb :] = h[n_full * bb :] @ params.tail
    is_noise = np.zeros(size, dtype=bool)
    is_noise[noise_pos] = True
    is_flat = np.zeros(size, dtype=bool)
    is_flat[flat_pos] = True
    gid, n_groups = params.group_ids, params.n_groups

    n_full = params.blocks.shape[0]
    full = n_full * (params.blocks.shape[-1] if n_full else 0)
    parts = []
    if n_full:
        bb = params.blocks.shape[-1]
        shaped = [a[:full].reshape(n_full, bb) for a in (h, z, is_noise, is_flat)]
        chunk = max(1, _CHUNK_ENTRIES // (bb * bb))
        for lo in range(0, n_full, chunk):
            hi = min(n_full, lo + chunk)
            parts.append(_within_block_stats(params.blocks[lo:hi], *(a[lo:hi] for a in shaped)))
    if params.tail.shape[0]:
        parts.append(
            _within_block_stats(
                params.tail[None],
                h[None, full:],
                z[None, full:],
                is_noise[None, full:],
                is_flat[None, full:],
            )
        )
    a1, a1z, s2, s2z, n2, n2z, nmax, flat_in = (
        np.concatenate([p[i].ravel() for p in parts]) for i in range(8)
    )

    def group_total(values: np.ndarray) -> np.ndarray:
        return np.bincount(gid, weights=values, minlength=n_groups)[gid]

    zabs_sig = group_total(np.abs(z) * ~is_noise)
    z2_sig = group_total(z**2 * ~is_noise)
    z2_noise = group_total(z**2 * is_noise)
    flat_of_group = np.empty(n_groups, dtype=np.int64)
    flat_of_group[gid[flat_pos]] = flat_pos
    flat_col = flat_of_group[gid]
    flat_outside = np.abs(2.0 * h * z[flat_col])
    same_block = (flat_col // b) == (np.arange(size) // b) if b else np.ones(size, dtype=bool)
    flat_entry = np.where(same_block & (flat_in > 0), flat_in, flat_outside)

    two_h = 2.0 * np.abs(h)
    l1_signal = a1 + two_h * np.maximum(zabs_sig - a1z, 0.0)
    l2_signal = np.sqrt(s2 + 4.0 * h**2 * np.maximum(z2_sig - s2z, 0.0))
    l2_noise = np.sqrt(n2 + 4.0 * h**2 * np.maximum(z2_noise - n2z, 0.0))
    linf = np.maximum(nmax, flat_entry)
    perm = params.row_perm
    stats = RowStats(
        l1_signal=l1_signal[perm],
        l2_signal=l2_signal[perm],
        l2_noise=l2_noise[perm],
        linf_noise=linf[perm],
    )
    return stats, flat_entry[perm]
