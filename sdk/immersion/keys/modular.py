"""Integer keys invertible modulo 2^64: the codes ``q -> Pi q + N s (mod 2^64)`` of modular coding.

One code is an integer matrix ``K`` (``n~ x n~``, ``n~ = n + m``) invertible modulo ``2^64``;
``Pi = K[:, signal positions]``, ``N = K[:, noise positions]``, ``Pi_left`` and ``N_left`` are the
matching rows of ``K^-1``, so ``Pi_left Pi = I``, ``Pi_left N = 0``, ``N_left N = I`` and
``N_left Pi = 0`` exactly (modulo ``2^64``). ``K`` has the block layout of the float keys
(:mod:`.structured`) with integer factors, ``K = P^T G B``:

* ``B``: block diagonal, each block ``L U`` with random unit lower/upper triangular integer
  factors (determinant 1, so invertible modulo ``2^64``; the inverse blocks are kept too);
* ``G = I + sum_g d_g e_{c_g}^T``: per *group* (contiguous runs of blocks), row ``c_g`` of ``B v``
  is added, times ``d_g[r]``, to every other row ``r`` of the group (``d_g[c_g] = 0``, so
  ``G^-1 = I - sum_g d_g e_{c_g}^T``); ``c_g`` is a row of the group's *flat* block whose entry
  in the group's first noise column ``j_g`` is odd, and ``d_g`` is drawn so that every row of the
  group gets an odd entry in column ``j_g`` (odd ``d_g[r]`` outside the flat block; inside it the
  parity that makes ``B[r, j_g] + d_g[r] B[c_g, j_g]`` odd);
* ``P``: a random row permutation.

Dense keys are the same construction with a single block (``K = P^T G L U``), materialised.

**Why every element of** ``y~ = Pi q + N s`` **is uniform** (``s`` uniform modulo ``2^64``):
row ``i`` of ``N`` has an odd entry ``N[i, k]`` (by construction; :meth:`ModularCode.odd_noise_rows`
checks it from the factors). Multiplication by an odd number is a bijection of ``Z/2^64``, so for
any fixed values of ``q`` and of the other noise entries, ``y~_i = N[i, k] s_k + c`` takes each
value of ``Z/2^64`` exactly once as ``s_k`` runs over ``Z/2^64``. Hence ``y~_i`` is uniform and
independent of ``q``: its law is the same for every input, i.e. per-element epsilon 0. (The
vector ``y~`` is *not* uniform: it lies in ``Pi q + range(N)``; see THREAT_MODEL.md.)

Memory of a block code (:attr:`ModularCode.nbytes`): two ``uint64`` arrays of ``n~ x b`` (the
blocks and their inverses, ``16 n~ b`` bytes) and four 64-bit vectors of length ``n~`` (shear,
group ids, row permutation, signal positions: ``32 n~`` bytes): 0.35 GB for the 1,199,882-entry
CNN state at ``b = 16`` with 2 noise entries (0.31 GB of blocks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from ..errors import InvalidArgumentError
from ..integer import random_unimodular_stack, uniform_noise
from .structured import _group_layout, block_matvec
from .views import ExplicitShape, KeyViews, PositionedShape

#: Default block size of modular block keys (each block is stored with its inverse).
MODULAR_BLOCK_SIZE = 16
#: Above this many entries a dense view of a block key is refused.
MAX_DENSE_ENTRIES = 50_000_000
_ONE = np.ones(1, dtype=np.uint64)


# ---------------------------------------------------------------- the block factors
@dataclass(frozen=True, eq=False)
class ModularMix:
    """The factors of ``K = P^T G B`` and of ``K^-1 = B^-1 G^-1 P`` (all integers modulo 2^64)."""

    blocks: np.ndarray  # (k, b, b) uint64, each L U
    blocks_inv: np.ndarray  # (k, b, b) uint64
    tail: np.ndarray  # (t, t) uint64 (t may be 0)
    tail_inv: np.ndarray  # (t, t) uint64
    shear: np.ndarray  # (n~,) uint64: d_g[r] for the group of r, 0 at each pivot row
    group_ids: np.ndarray  # (n~,) int64, contiguous groups 0, 1, ...
    pivot_rows: np.ndarray  # (groups,) int64: internal row c_g spread over group g
    row_perm: np.ndarray  # (n~,) int64: output row i is internal row row_perm[i]

    @property
    def size(self) -> int:
        return int(self.shear.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (
                self.blocks,
                self.blocks_inv,
                self.tail,
                self.tail_inv,
                self.shear,
                self.group_ids,
                self.pivot_rows,
                self.row_perm,
            )
        )

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array, by a stable name (saving, fingerprints)."""
        return {
            "blocks": self.blocks,
            "blocks_inv": self.blocks_inv,
            "tail": self.tail,
            "tail_inv": self.tail_inv,
            "shear": self.shear,
            "group_ids": self.group_ids,
            "pivot_rows": self.pivot_rows,
            "row_perm": self.row_perm,
        }


def _block_product(blocks: np.ndarray, tail: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``B v`` modulo 2^64 for block-diagonal ``B`` (full blocks plus a tail), on the last axis.

    ``einsum`` over the stack of integer blocks (measured faster than ``matmul``'s integer loop).
    """
    return block_matvec(blocks, tail, v, np.zeros(v.shape, dtype=np.uint64), _einsum_blocks)


def _einsum_blocks(blocks: np.ndarray, vb: np.ndarray) -> np.ndarray:
    return np.einsum("kij,...kj->...ki", blocks, vb[..., 0])[..., None]


class _Shear:
    """``G`` (or ``G^-1``): ``w_r + sign * d[r] * w[c(r)]`` on the last axis."""

    def __init__(self, mix: ModularMix, inverse: bool) -> None:
        self._shear = -mix.shear if inverse else mix.shear
        self._source = mix.pivot_rows[mix.group_ids]

    def __call__(self, w: np.ndarray) -> np.ndarray:
        # d[c_g] = 0, so the pivot rows are unchanged and reading them after the update is the same
        return w + self._shear * np.take(w, self._source, axis=-1)


class ModularForward:
    """``v -> K v`` modulo 2^64 for a block code (holds ``B``, ``G``, ``P``; not their inverses)."""

    def __init__(self, mix: ModularMix) -> None:
        self.size = mix.size
        self._blocks, self._tail = mix.blocks, mix.tail
        self._shear = _Shear(mix, inverse=False)
        self._perm = mix.row_perm

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return np.take(
            self._shear(_block_product(self._blocks, self._tail, v)), self._perm, axis=-1
        )


class ModularInverse:
    """``x -> K^-1 x`` modulo 2^64 for a block code (holds ``B^-1``, ``G^-1``, ``P^T``)."""

    def __init__(self, mix: ModularMix) -> None:
        self.size = mix.size
        self._blocks, self._tail = mix.blocks_inv, mix.tail_inv
        self._shear = _Shear(mix, inverse=True)
        self._inv_perm = np.argsort(mix.row_perm)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        w = self._shear(np.take(x, self._inv_perm, axis=-1))
        return _block_product(self._blocks, self._tail, w)


# ---------------------------------------------------------------- runtime pieces
class MatrixProduct:
    """``v -> v @ M^T`` modulo 2^64 with an explicit ``uint64`` matrix ``M`` (dense codes)."""

    def __init__(self, matrix: np.ndarray) -> None:
        self._m_t = np.ascontiguousarray(matrix.T)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return np.matmul(v, self._m_t)


class ScatterForward:
    """``q -> K [q at positions, 0 elsewhere]`` (a block code's ``Pi q``)."""

    def __init__(self, forward: ModularForward, positions: np.ndarray) -> None:
        self._forward, self._pos = forward, positions

    def __call__(self, q: np.ndarray) -> np.ndarray:
        v = np.zeros(tuple(q.shape[:-1]) + (self._forward.size,), dtype=np.uint64)
        v[..., self._pos] = q
        return self._forward(v)


class NoisyScatterForward:
    """``(q, s) -> K [q at signal positions; s at noise positions]``: ``Pi q + N s`` in one pass."""

    def __init__(self, forward: ModularForward, signal: np.ndarray, noise: np.ndarray) -> None:
        self._forward, self._sig, self._noise = forward, signal, noise

    def __call__(self, q: np.ndarray, s: np.ndarray) -> np.ndarray:
        v = np.empty(tuple(q.shape[:-1]) + (self._forward.size,), dtype=np.uint64)
        v[..., self._sig] = q
        v[..., self._noise] = s
        return self._forward(v)


class DenseNoisyProduct:
    """``(q, s) -> Pi q + N s`` with explicit matrices."""

    def __init__(self, pi: np.ndarray, noise_basis: np.ndarray) -> None:
        self._pi, self._n = MatrixProduct(pi), MatrixProduct(noise_basis)

    def __call__(self, q: np.ndarray, s: np.ndarray) -> np.ndarray:
        return self._pi(q) + self._n(s)


class GatherInverse:
    """``x -> (K^-1 x)[positions]`` (a block code's ``Pi_left x`` or ``N_left x``)."""

    def __init__(self, inverse: ModularInverse, positions: np.ndarray) -> None:
        self._inverse, self._pos = inverse, positions

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.take(self._inverse(x), self._pos, axis=-1)


# ---------------------------------------------------------------- codes
@dataclass(frozen=True, eq=False)
class ModularDenseCode(ExplicitShape):
    """A code given by explicit ``uint64`` matrices ``Pi``, ``Pi_left``, ``N``, ``N_left``."""

    pi: np.ndarray  # (n~, n)
    pi_left: np.ndarray  # (n, n~)
    noise_basis: np.ndarray  # (n~, m)
    noise_left: np.ndarray  # (m, n~)

    kind = "dense"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.pi, self.pi_left, self.noise_basis, self.noise_left))

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "pi": self.pi,
            "pi_left": self.pi_left,
            "noise_basis": self.noise_basis,
            "noise_left": self.noise_left,
        }

    def dense_noise_left(self) -> np.ndarray:
        return self.noise_left

    def odd_noise_rows(self) -> np.ndarray:
        """True for each row of ``N`` with an odd entry (that element of ``y~`` is uniform)."""
        return np.asarray((self.noise_basis & _ONE).any(axis=1))

    def encoder(self) -> MatrixProduct:
        return MatrixProduct(self.pi)

    def noisy_encoder(self) -> DenseNoisyProduct:
        return DenseNoisyProduct(self.pi, self.noise_basis)

    def decoder(self) -> MatrixProduct:
        return MatrixProduct(self.pi_left)

    def noise_decoder(self) -> MatrixProduct:
        return MatrixProduct(self.noise_left)


@dataclass(frozen=True, eq=False)
class ModularBlockCode(PositionedShape):
    """A code ``Pi = K[:, signal_pos]``, ``N = K[:, noise_pos]`` with ``K`` in factored form."""

    mix: ModularMix
    signal_pos: np.ndarray
    noise_pos: np.ndarray

    kind = "block"

    @property
    def nbytes(self) -> int:
        return self.mix.nbytes + self.signal_pos.nbytes + self.noise_pos.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        return {**self.mix.arrays(), "signal_pos": self.signal_pos, "noise_pos": self.noise_pos}

    def _dense(self, positions: np.ndarray, name: str, inverse: bool) -> np.ndarray:
        entries = self.n_total * positions.shape[0]
        if entries > MAX_DENSE_ENTRIES:
            raise InvalidArgumentError(
                name,
                f"a dense view would have {entries:,} entries; block keys are meant to stay "
                "structured (use the encoders and decoders)",
            )
        eye = np.zeros((positions.shape[0], self.n_total), dtype=np.uint64)
        eye[np.arange(positions.shape[0]), positions] = 1
        if inverse:  # rows p of K^-1 are (K^-T e_p)^T
            return _inverse_transpose(self.mix, eye)
        return np.ascontiguousarray(ModularForward(self.mix)(eye).T)

    def dense_pi(self) -> np.ndarray:
        return self._dense(self.signal_pos, "Pi", inverse=False)

    def dense_pi_left(self) -> np.ndarray:
        return self._dense(self.signal_pos, "Pi_left", inverse=True)

    def dense_noise_basis(self) -> np.ndarray:
        return self._dense(self.noise_pos, "N", inverse=False)

    def dense_noise_left(self) -> np.ndarray:
        return self._dense(self.noise_pos, "N_left", inverse=True)

    def odd_noise_rows(self) -> np.ndarray:
        """True for each row of ``N`` with an odd entry, exactly from the factors in O(n~ b).

        Internal row ``r`` of ``G B`` is ``B[r, :] + d[r] B[c, :]`` (``c`` its group's pivot row);
        only the parities of the entries in noise columns matter.
        """
        m = self.mix
        size = m.size
        is_noise = np.zeros(size, dtype=bool)
        is_noise[self.noise_pos] = True
        own = _row_noise_parity(m, is_noise)  # parity vectors of B's rows on noise columns
        pivot = m.pivot_rows[m.group_ids]
        b = m.blocks.shape[-1] if m.blocks.shape[0] else max(m.tail.shape[0], 1)
        n_full = m.blocks.shape[0] * (m.blocks.shape[-1] if m.blocks.shape[0] else 0)

        def block_of(r: np.ndarray) -> np.ndarray:
            return np.where(r < n_full, r // b, m.blocks.shape[0])

        odd_d = (m.shear & _ONE).astype(bool)
        same = block_of(np.arange(size)) == block_of(pivot)
        # same block: parities add on the same columns; else the supports are disjoint
        combined = own ^ (own[pivot] & odd_d[:, None])
        odd = np.where(same, combined.any(axis=1), own.any(axis=1) | (odd_d & own[pivot].any(1)))
        return np.asarray(odd[m.row_perm])

    def forward(self) -> ModularForward:
        return ModularForward(self.mix)

    def encoder(self, forward: ModularForward | None = None) -> ScatterForward:
        return ScatterForward(forward or self.forward(), self.signal_pos)

    def noisy_encoder(self, forward: ModularForward | None = None) -> NoisyScatterForward:
        return NoisyScatterForward(forward or self.forward(), self.signal_pos, self.noise_pos)

    def decoder(self, inverse: ModularInverse | None = None) -> GatherInverse:
        return GatherInverse(inverse or ModularInverse(self.mix), self.signal_pos)

    def noise_decoder(self, inverse: ModularInverse | None = None) -> GatherInverse:
        return GatherInverse(inverse or ModularInverse(self.mix), self.noise_pos)


ModularCode = ModularDenseCode | ModularBlockCode


def _inverse_transpose(mix: ModularMix, e: np.ndarray) -> np.ndarray:
    """``K^-T`` applied to the rows of ``e``: ``K^-T = P^T G^-T B^-T`` with ``K^-1 = B^-1 G^-1 P``.

    ``G^-T = I - sum_g e_{c_g} d_g^T`` subtracts ``sum_{r in g} d[r] w_r`` from each pivot row.
    """
    w = _block_product(
        np.ascontiguousarray(mix.blocks_inv.transpose(0, 2, 1)),
        np.ascontiguousarray(mix.tail_inv.T),
        e,
    )
    starts = np.searchsorted(mix.group_ids, np.arange(mix.pivot_rows.shape[0]))
    w[..., mix.pivot_rows] -= np.add.reduceat(w * mix.shear, starts, axis=-1)
    return np.take(w, mix.row_perm, axis=-1)


def _row_noise_parity(mix: ModularMix, is_noise: np.ndarray) -> np.ndarray:
    """``(n~, b)`` booleans: the parity of row r of ``B`` on the noise columns of r's block.

    Column ``j`` of the result is local column ``j`` of r's block (padded with False for the tail).
    """
    b = mix.blocks.shape[-1] if mix.blocks.shape[0] else mix.tail.shape[0]
    out = np.zeros((mix.size, max(b, 1)), dtype=bool)
    k = mix.blocks.shape[0]
    if k:
        noise = is_noise[: k * b].reshape(k, 1, b)
        out[: k * b] = ((mix.blocks & _ONE).astype(bool) & noise).reshape(k * b, b)
    t = mix.tail.shape[0]
    if t:
        out[k * b :, :t] = (mix.tail & _ONE).astype(bool) & is_noise[k * b :][None, :]
    return out


# ---------------------------------------------------------------- drawing
def draw_modular_mix(
    rng: np.random.Generator, n_signal: int, n_noise: int, block_size: int
) -> tuple[ModularMix, np.ndarray, np.ndarray]:
    """Draw ``K = P^T G B`` and the signal and noise positions (see the module docstring)."""
    size = n_signal + n_noise
    b = min(block_size, size)
    n_full = size // b
    tail_size = size - n_full * b
    blocks, blocks_inv = random_unimodular_stack(rng, n_full, b)
    tails, tails_inv = random_unimodular_stack(rng, 1 if tail_size else 0, tail_size)
    tail = tails[0] if tail_size else np.zeros((0, 0), dtype=np.uint64)
    tail_inv = tails_inv[0] if tail_size else np.zeros((0, 0), dtype=np.uint64)
    block_starts, group_starts, group_ids, noise_per_group = _group_layout(size, b, n_noise)
    n_groups = group_starts.shape[0] - 1

    shear = uniform_noise(rng, size)
    pivot_rows = np.empty(n_groups, dtype=np.int64)
    noise_pos_list = []
    for g in range(n_groups):
        lo, hi = int(group_starts[g]), int(group_starts[g + 1])
        chosen = lo + rng.choice(hi - lo, size=noise_per_group[g], replace=False)
        noise_pos_list.append(chosen)
        j = int(chosen[0])  # the group's spread noise column
        k = j // b
        start, stop = int(block_starts[k]), int(block_starts[k + 1])
        block = blocks[k] if k < n_full else tail
        column_odd = (block[:, j - start] & _ONE).astype(bool)  # B invertible mod 2: some odd
        c = start + int(rng.choice(np.flatnonzero(column_odd)))
        pivot_rows[g] = c
        # rows outside the flat block: d odd; inside: parity making B[r, j] + d B[c, j] odd
        shear[lo:hi] |= _ONE
        inside = np.arange(start, stop)
        want_odd = ~column_odd
        shear[inside] = (shear[inside] & ~_ONE) | want_odd.astype(np.uint64)
        shear[c] = 0
    noise_pos = np.concatenate(noise_pos_list).astype(np.int64)
    is_noise = np.zeros(size, dtype=bool)
    is_noise[noise_pos] = True
    signal_pos = rng.permutation(np.flatnonzero(~is_noise)).astype(np.int64)
    mix = ModularMix(
        blocks=blocks,
        blocks_inv=blocks_inv,
        tail=tail,
        tail_inv=tail_inv,
        shear=shear,
        group_ids=group_ids,
        pivot_rows=pivot_rows,
        row_perm=rng.permutation(size).astype(np.int64),
    )
    return mix, signal_pos, noise_pos


def densified_modular(code: ModularCode) -> ModularDenseCode:
    """``code`` with its four matrices materialised."""
    if isinstance(code, ModularDenseCode):
        return code
    inverse = ModularInverse(code.mix)(np.eye(code.n_total, dtype=np.uint64)).T  # K^-1
    forward = ModularForward(code.mix)(np.eye(code.n_total, dtype=np.uint64)).T  # K
    return ModularDenseCode(
        np.ascontiguousarray(forward[:, code.signal_pos]),
        np.ascontiguousarray(inverse[code.signal_pos]),
        np.ascontiguousarray(forward[:, code.noise_pos]),
        np.ascontiguousarray(inverse[code.noise_pos]),
    )


def draw_modular_code(
    n: int,
    extra: int,
    *,
    kind: Literal["dense", "block"] = "block",
    block_size: int = MODULAR_BLOCK_SIZE,
    rng: Any = None,
) -> ModularCode:
    """One integer code ``q -> Pi q + N s (mod 2^64)``, e.g. for a flat model vector in FL.

    Every row of ``N`` has an odd entry, so with ``s`` uniform modulo ``2^64`` every element of
    the encoding is uniform whatever ``q`` is (module docstring). Memory: about
    ``16 (n + extra) (b + 2)`` bytes for block codes (blocks, their inverses and four vectors of
    length ``n + extra``), ``16 (n + extra)^2`` for dense ones.

    Examples
    --------
    >>> from immersion.integer import encode_fixed, uniform_noise, decode_fixed
    >>> code = draw_modular_code(1000, 2, rng=0)
    >>> rng = np.random.default_rng(1)
    >>> w = rng.standard_normal(1000)
    >>> q = encode_fixed(w, 32, name="w")
    >>> wt = code.noisy_encoder()(q, uniform_noise(rng, 2))           # Pi1 q + N1 s mod 2^64
    >>> bool((code.decoder()(wt) == q).all()), bool(code.odd_noise_rows().all())
    (True, True)
    """
    from ..validation import one_of, positive_int, vector_fits

    n, extra = positive_int("n", n), positive_int("extra", extra)
    block_size = positive_int("block_size", block_size)
    kind = one_of("kind", kind, ("dense", "block"))  # type: ignore[assignment]
    size = n + extra
    vector_fits(
        "extra" if extra >= n else "n",
        max(n, extra),
        2 * size * (size if kind == "dense" else min(block_size, size)),
        "the code's key matrices",
    )
    gen = np.random.default_rng(rng)
    mix, sig, noise = draw_modular_mix(gen, n, extra, size if kind == "dense" else block_size)
    code = ModularBlockCode(mix, sig, noise)
    return densified_modular(code) if kind == "dense" else code


# ---------------------------------------------------------------- mask and keys
@dataclass(frozen=True, eq=False)
class ModularMask:
    """``Pi4 = diag(weights) N1_left[source]``: ``(Pi4 y~)_j = weights_j s[source_j]`` (mod 2^64).

    ``Pi4 Pi1 = 0`` (the mask carries noise only) and with odd ``weights`` every element of the
    mask, hence of ``u~``, is uniform modulo ``2^64`` (seed 002 eq. 17's ``Pi4 y~`` term).
    """

    weights: np.ndarray  # (n~_out,) uint64, odd
    source: np.ndarray  # (n~_out,) int64, input noise coordinate of each output element

    def arrays(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights, "source": self.source}

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes + self.source.nbytes

    def odd_rows(self) -> np.ndarray:
        """True for each element of ``u~`` whose mask has an odd coefficient on the noise."""
        return (self.weights & _ONE).astype(bool)

    def dense(self, input_code: ModularCode) -> np.ndarray:
        return self.weights[:, None] * input_code.dense_noise_left()[self.source]

    def operator(self, input_code: ModularCode) -> "MaskOperator":
        return MaskOperator(self, input_code)


class MaskOperator:
    """``y~ -> Pi4 y~`` on the cloud: ``weights * (N1_left y~)[source]``."""

    def __init__(self, mask: ModularMask, input_code: ModularCode) -> None:
        self._pick = input_code.noise_decoder()
        self._weights, self._source = mask.weights, mask.source

    def __call__(self, y_enc: np.ndarray) -> np.ndarray:
        return self._weights * np.take(self._pick(y_enc), self._source, axis=-1)


_CODES = ("input", "state", "output")


@dataclass(frozen=True, eq=False)
class ModularKeys(KeyViews):
    """Secret integer keys of one modular immersion. Frozen; ``repr`` shows shapes and fingerprint.

    The dense views ``Pi1 .. Pi4``, ``N1``, ``Pi1_left .. Pi3_left`` are ``uint64`` matrices
    (materialised on demand for block keys, refused when too large).

    Examples
    --------
    >>> keys = ModularKeys.draw(n_state=3, n_input=1, n_output=1, rng=0)
    >>> keys.Pi1.shape, keys.N1.shape, keys.Pi1.dtype.name
    ((3, 1), (3, 2), 'uint64')
    >>> bool((keys.Pi1_left @ keys.N1 == 0).all()), bool((keys.Pi1_left @ keys.Pi1 == 1).all())
    (True, True)
    """

    input_code: ModularCode
    state_code: ModularCode
    output_code: ModularCode
    mask: ModularMask

    arithmetic = "modular"
    noise_kind = "uniform mod 2^64"
    #: For code written against float keys: no designed noise law and no scale (the law is
    #: fixed: uniform modulo 2^64).
    noise = None
    noise_scale = None

    @classmethod
    def draw(
        cls,
        *,
        n_state: int,
        n_input: int,
        n_output: int,
        extra_state: int = 1,
        extra_input: int = 2,
        extra_output: int = 2,
        kind: Literal["dense", "block"] = "dense",
        block_size: int = MODULAR_BLOCK_SIZE,
        rng: Any = None,
    ) -> "ModularKeys":
        """Draw keys (dimensions are not re-validated here: :func:`immersion.draw_keys` does it)."""
        gen = np.random.default_rng(rng)
        codes = {}
        for name, (n, m) in (
            ("input", (n_input, extra_input)),
            ("state", (n_state, extra_state)),
            ("output", (n_output, extra_output)),
        ):
            mix, sig, noise = draw_modular_mix(gen, n, m, n + m if kind == "dense" else block_size)
            code = ModularBlockCode(mix, sig, noise)
            codes[name] = densified_modular(code) if kind == "dense" else code
        n_out = codes["output"].n_total
        mask = ModularMask(
            weights=uniform_noise(gen, n_out) | _ONE,
            source=gen.integers(0, extra_input, size=n_out).astype(np.int64),
        )
        return cls(codes["input"], codes["state"], codes["output"], mask)

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check what exact decoding and uniform elements need; raise naming the key.

        Dense: ``[Pi N]`` and ``[Pi_left; N_left]`` are inverse modulo 2^64. Block: every block
        times its inverse block is ``I`` and each pivot row has a zero shear. Both: every row of
        ``N1`` and every output mask weight has an odd entry.
        """
        for name in _CODES:
            code = getattr(self, f"{name}_code")
            label = {"input": "Pi1", "state": "Pi2", "output": "Pi3"}[name]
            if isinstance(code, ModularDenseCode):
                k = np.concatenate([code.pi, code.noise_basis], axis=1)
                k_inv = np.concatenate([code.pi_left, code.noise_left], axis=0)
                if not np.array_equal(k_inv @ k, np.eye(code.n_total, dtype=np.uint64)):
                    raise InvalidArgumentError(
                        label,
                        f"[{label} N] is not inverted modulo 2^64 by the stored left inverses",
                    )
            else:
                m = code.mix
                eye = np.eye(m.blocks.shape[-1] if m.blocks.size else 0, dtype=np.uint64)
                if not (np.matmul(m.blocks_inv, m.blocks) == eye).all() or not np.array_equal(
                    m.tail_inv @ m.tail, np.eye(m.tail.shape[0], dtype=np.uint64)
                ):
                    raise InvalidArgumentError(
                        label, "a block is not inverted by its stored inverse"
                    )
                if (m.shear[m.pivot_rows] != 0).any():
                    raise InvalidArgumentError(label, "a group's pivot row has a non-zero shear")
        if not self.input_code.odd_noise_rows().all():
            raise InvalidArgumentError(
                "N1", "has a row without an odd entry: that element of y~ would not be uniform"
            )
        if not self.mask.odd_rows().all():
            raise InvalidArgumentError(
                "Pi4", "has an even weight: that element of u~ would not be uniform"
            )

    # ------------------------------------------------------------------ views
    @property
    def Pi4(self) -> np.ndarray:
        return self.mask.dense(self.input_code)

    @property
    def nbytes(self) -> int:
        """Memory held by the keys."""
        return sum(getattr(self, f"{n}_code").nbytes for n in _CODES) + self.mask.nbytes

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array that defines the keys, by a stable name (saving, fingerprint)."""
        out = {
            f"{name}.{k}": v
            for name in _CODES
            for k, v in getattr(self, f"{name}_code").arrays().items()
        }
        out.update({f"mask.{k}": v for k, v in self.mask.arrays().items()})
        return out

    @cached_property
    def fingerprint(self) -> str:
        """First 16 hex digits of a SHA-256 over every key array."""
        digest = hashlib.sha256(b"modular")
        for name, arr in sorted(self.arrays().items()):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(arr).tobytes())
        return digest.hexdigest()[:16]

    def __repr__(self) -> str:
        d = self.dims
        return (
            f"ModularKeys(kind={self.kind!r}, "
            f"y: {d['n_input']}->{d['n_input'] + d['extra_input']}, "
            f"x: {d['n_state']}->{d['n_state'] + d['extra_state']}, "
            f"u: {d['n_output']}->{d['n_output'] + d['extra_output']}, "
            f"noise=uniform mod 2^64, fingerprint={self.fingerprint})"
        )

    __str__ = __repr__
