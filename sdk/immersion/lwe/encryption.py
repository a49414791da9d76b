"""LWE encryption on the user's side: pads ``<a_i, s> + e_i`` computed ahead in batches.

Uplink ciphertext ``i`` of an episode (sample ``k``, slot ``j``: ``i = k p + j`` with ``p``
plaintexts per sample) is ``b_i = <a_i, s> + e_i + L m_i mod q`` with ``a_i`` expanded from the
episode's public seed. Neither ``a_i`` nor ``e_i`` depends on the data, so the user computes the
pads ``<a_i, s> + e_i`` for many samples at once (one AES call and one matrix product per batch);
a sample then costs a few additions.

The user also keeps, for every ciphertext the cloud holds, its pad: the cloud's operations are
integer linear maps, so the pad of a result is the same map of the pads, noise included (the
user drew every error from its master secret). Decrypting the output is then
``b - pad = L acc`` exactly: no noise is left to round away, so the noise takes no bits of the
modulus, and a remainder modulo ``L`` can only come from an altered reply.
"""

from __future__ import annotations

import numpy as np

from .keys import LweSecretKey, public_vectors
from .ring import Ring
from .target import HEADER, LweTarget

#: Bytes of public vectors expanded per batch: small enough to stay in the CPU cache (an AES
#: pass over 4 MB runs at 60 % of the speed of one over 1 MB here).
BATCH_BYTES = 1 << 20


class EncryptionStream:
    """Pads ``<a_i, s> + e_i mod q`` of the uplink ciphertexts of one run, in index order."""

    def __init__(
        self, key: LweSecretKey, ring: Ring, seed: bytes, prg: str, per_sample: int
    ) -> None:
        self._key, self._ring, self.seed, self._prg = key, ring, seed, prg
        self._secret = ring.prepare_secret(key.secret)
        self._words = key.params.dimension * ring.limbs
        per_batch = max(1, BATCH_BYTES // (8 * self._words * per_sample))
        self._batch = per_batch * per_sample
        self._start = 0  # index of the first ciphertext of the current batch
        self._offset = 0  # position of the next one in it
        self._pads: list[int] = []

    def take(self, count: int) -> list[int]:
        """Pads (in ``[0, q)``) of the next ``count`` ciphertexts."""
        if self._offset + count > len(self._pads):
            self._refill()
        i = self._offset
        self._offset += count
        return self._pads[i : i + count]

    def _refill(self) -> None:
        self._start += self._offset if self._pads else 0
        self._offset = 0
        raw = public_vectors(self.seed, self._start, self._batch, self._words, self._prg)
        masks = self._ring.ternary_inner(raw, self._secret)
        errors = self._key.errors(self.seed, self._start, self._batch).tolist()
        mask = self._ring.mask
        self._pads = [(a + e) & mask for a, e in zip(masks, errors, strict=True)]


def public_part(
    target: LweTarget, dimension: int, prg: str, header: np.ndarray
) -> list[np.ndarray]:
    """The public vectors ``a`` of the cloud's output ciphertexts at ``header`` (public data only).

    ``u~ = M [y~_k, u~_(k-1), window]`` holds ``b`` words; its ``a`` parts are ``M`` times the
    ``a`` vectors of those uplink ciphertexts (expanded from the seed in the header; zero for the
    empty history before sample 0). With them, ``(b, a)`` is an ordinary LWE ciphertext under the
    user's key: ``b - <a, s> = L acc + e``, ``|e| <= report().noise_bound``
    (``tests/test_lwe.py`` checks it). The handle does not decrypt this way: it subtracts ``e``
    too, so ``L`` need not exceed ``2 |e|`` (it does for the uplink words, ``|e| <= 19``, which
    the key alone decrypts). ``q <= 2^64`` only.

    Parameters
    ----------
    target:
        The cloud's target (its integer matrix and window layout).
    dimension, prg:
        LWE dimension and expander of the run.
    header:
        The output's header ``[seed_lo, seed_hi, step]``.

    Returns
    -------
    list of numpy.ndarray
        One uint64 vector of length ``dimension`` per output.
    """
    ring = target.ring
    if ring.limbs != 1:
        raise NotImplementedError("public_part expands one-word (q <= 2^64) ciphertexts only")
    seed = header[:2].astype("<u8").tobytes()
    step = int(header[2])
    p = target.n_input + target.n_feedback

    def vectors(sample: int, first: int, count: int) -> np.ndarray:
        if sample < 0:
            return np.zeros((count, dimension), dtype=np.uint64)
        return public_vectors(seed, sample * p + first, count, dimension, prg)

    rows = [vectors(step, 0, p)]  # y_k and u_(k-1)
    rows += [vectors(step - i, 0, target.n_input) for i in range(1, target.window + 1)]
    rows += [
        vectors(step - i + 1, target.n_input, target.n_feedback)
        for i in range(2, target.window + 1)
    ]
    stacked = np.concatenate(rows)
    coefficients = np.array(
        [[c & ring.mask for c in row] for row in target.matrix], dtype=np.uint64
    )
    return [a & np.uint64(ring.mask) for a in coefficients @ stacked]


__all__ = ["EncryptionStream", "public_part", "HEADER"]
