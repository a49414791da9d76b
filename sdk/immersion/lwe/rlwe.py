"""Secret-key RLWE (BGV) encryption in NTT form: what the plant does each sample.

A ciphertext of a polynomial ``m`` (coefficients taken modulo the plaintext modulus ``t``) is
``(b, a)`` with ``b + a s = m + t e (mod Q)``: ``a`` uniform (expanded from a public 16-byte seed,
so only ``b`` and the seed travel), ``s`` the ternary secret, ``e`` an error polynomial with
coefficients from the discrete Gaussian of width 3.2 clipped at ``|e| <= 19`` (the HE standard's
law; the clipping makes every noise bound a certainty). Both ``b`` and ``a`` are kept in NTT form.

The product of two ciphertexts is the degree-2 ciphertext ``(c0, c1, c2)`` that decrypts with
``(1, s, s^2)`` to ``(m1 + t e1)(m2 + t e2)``; no relinearisation key exists. Decryption reads
only the coefficients it needs (:meth:`RnsRing.read`) and reduces them modulo ``t``.

Encryption splits into an offline part that does not depend on the message (``a``, ``t e`` and
``-a s``: :meth:`Encryptor.precompute`, where the NTT of the error is the cost) and an online part
(adding the message, a few sparse terms).
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..coding.keygen import resolve_rng
from ..errors import InvalidArgumentError
from . import kernels
from .keys import _ternary, public_vectors, resolve_prg
from .params import ERROR_BOUND, ERROR_SIGMA
from .rns import RnsRing

#: Words drawn per prime for the rejection sampling of ``a`` beyond ``1.0625 N``.
_EXTRA_WORDS = 128


def expand_uniform(ring: RnsRing, seed: bytes, prg: str) -> np.ndarray:
    """The uniform polynomial ``a`` of a ciphertext, ``(L, N)`` uint32 residues, from its seed.

    Residue row ``i`` takes the top 25 bits of the little-endian 32-bit words of stream vector
    ``i`` and keeps those below ``q_i``: exactly uniform (if a row ever ran short, below
    ``2^-100``, all rows are drawn again from the stream of ``SHA-256(seed, attempt)``). Uniform
    in the coefficient domain is uniform in the NTT domain, so ``a`` is drawn in NTT form.
    """
    n, L = ring.degree, ring.n_primes
    # 32-bit words: primes lie within 3 % of 2^25, so 6 % spare words (and 128 more) suffice
    width = (n + n // 16 + _EXTRA_WORDS + 1) // 2  # 64-bit stream words per row

    def draw(key: bytes) -> np.ndarray | None:
        words = np.ascontiguousarray(public_vectors(key, 0, L, width, prg), dtype="<u8")
        return kernels.reject_uniform(words.view("<u4"), ring.q[:, 0], n)

    out = draw(seed)
    attempt = 1
    while out is None:
        out = draw(hashlib.sha256(seed + attempt.to_bytes(4, "little")).digest()[:16])
        attempt += 1
    return out


def _cdt(sigma: float, bound: int) -> np.ndarray:
    """Thresholds ``floor(2^64 P(e <= k))``, ``-bound <= k < bound``, of the clipped Gaussian
    (weights from Python's ``math.exp``, the same on every machine)."""
    import math

    weights = [math.exp(-(k * k) / (2 * sigma * sigma)) for k in range(-bound, bound + 1)]
    total = math.fsum(weights)
    out, running = [], 0.0
    for w in weights[:-1]:
        running += w
        out.append(min(int(running / total * 2.0**64), 2**64 - 1))
    return np.array(out, dtype=np.uint64)


_CDT = _cdt(ERROR_SIGMA, ERROR_BOUND)
_CDT_TABLE = kernels.cdt_table(_CDT)


@dataclass(frozen=True)
class Ciphertext:
    """A fresh ciphertext as it travels: the seed of ``a`` and ``b`` in NTT form."""

    seed: bytes
    b: np.ndarray  # (L, N) uint32 residues


class RlweSecretKey:
    """User side, secret: the ternary ``s`` (and ``s^2``) in NTT form and the master secret the
    errors and seeds come from. Never printed (``repr``: sizes and a fingerprint), never pickled.

    Parameters
    ----------
    master:
        32 bytes: OS entropy (:meth:`generate`), or from a seeded generator in tests.
    ring:
        The ring.
    prg:
        Expander of the public ``a`` (``"aes128-ctr"`` or ``"shake128"``).
    """

    def __init__(self, master: bytes, ring: RnsRing, prg: str) -> None:
        if len(master) != 32:
            raise InvalidArgumentError("master", "expected 32 bytes")
        self._master, self.ring, self.prg = master, ring, prg
        s = _ternary(master, ring.degree).astype(np.int64)
        q = ring.q[:, 0]
        self.s = ring.ntt(s)
        self.s2 = ring.mul(self.s, self.s)
        # float64 copies and the quotient s / q for the kernels' exact float arithmetic
        self._s_f, self._s2_f = self.s.astype(np.float64), self.s2.astype(np.float64)
        self._s_q = kernels.quotients(self.s, q)
        self._error_key = hashlib.shake_256(b"immersion-rlwe-e-key" + master).digest(16)
        self.fingerprint = hashlib.sha256(b"immersion-rlwe-fp" + master).hexdigest()[:16]

    @classmethod
    def generate(
        cls, ring: RnsRing, *, rng: Any = None, secure: bool = False, prg: str = "auto"
    ) -> RlweSecretKey:
        """A fresh key from OS entropy (``rng=None``, the default, or ``secure=True``), or
        reproducible from ``rng`` (tests, benchmarks: the seed is then the key)."""
        prg = resolve_prg(prg)
        if rng is None:
            if not isinstance(secure, (bool, np.bool_)):
                raise InvalidArgumentError("secure", f"expected True or False, got {secure!r}")
            return cls(_secrets.token_bytes(32), ring, prg)
        return cls(resolve_rng(rng, secure).bytes(32), ring, prg)

    def _stream(self, label: bytes, index: int, n_bytes: int) -> bytes:
        return hashlib.shake_256(
            b"immersion-rlwe-" + label + self._master + index.to_bytes(8, "little")
        ).digest(n_bytes)

    def seed(self, index: int) -> bytes:
        """The public seed of ciphertext ``index`` (unique per key and index)."""
        return self._stream(b"a", index, 16)

    def error(self, index: int) -> np.ndarray:
        """The error polynomial of ciphertext ``index``: ``N`` int64, ``|e| <= 19``, from a keyed
        stream (AES-128-CTR under a key derived from the master secret, or SHAKE-256)."""
        n_bytes = 8 * self.ring.degree
        if self.prg == "aes128-ctr":
            from ..securesum.prg import aes_ctr

            stream = aes_ctr(
                self._error_key,
                n_bytes,
                first_block=index * (n_bytes // 16),
                extra="lwe",
                purpose="RLWE errors",
            )
        else:
            stream = self._stream(b"e", index, n_bytes)
        return (
            kernels.sample_cdt(np.frombuffer(stream, dtype="<u8"), _CDT, _CDT_TABLE) - ERROR_BOUND
        )

    def zero(self, index: int, t: int) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Ciphertext ``index`` of zero: seed, ``b = -a s + t e`` and ``a`` (NTT form)."""
        ring = self.ring
        q = ring.q[:, 0]
        seed = self.seed(index)
        a = expand_uniform(ring, seed, self.prg)
        te = ring.ntt(self.error(index), scale=t)  # NTT(t e): the offline part's cost
        return seed, kernels.zero(a, self._s_f, self._s_q, te, q), a

    def decrypt(
        self, c0_read: np.ndarray, c1: np.ndarray, c2: np.ndarray, readers: np.ndarray
    ) -> list[int] | None:
        """Centred coefficients (modulo ``Q``) of ``c0 + c1 s + c2 s^2`` where ``readers`` point,
        or None if a word of ``c1`` or ``c2`` is not a residue.

        ``c0_read`` is ``c0`` already read at those coefficients (``(len, L)`` residues, as the
        cloud sends it); ``c1``, ``c2`` are uint32 words in NTT form (``(L, N)``); ``readers``
        int32 (:meth:`RnsRing.readers`).
        """
        ring = self.ring
        q = ring.q[:, 0]
        read, valid = kernels.decrypt_read(c1, c2, self._s_f, self._s2_f, readers, q)
        if not valid:
            return None
        return ring.crt(((read + c0_read) % q).T)

    def __repr__(self) -> str:
        return (
            f"RlweSecretKey(N={self.ring.degree}, log2 Q={self.ring.modulus_bits:.1f}, "
            f"fingerprint={self.fingerprint})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("an RLWE secret key is not pickled; keep it on the user's side")


class Encryptor:
    """Encrypts sparse messages with precomputed encryptions of zero (the offline part).

    Parameters
    ----------
    key:
        The secret key.
    plaintext_modulus:
        ``t``.
    positions:
        The coefficients a message may occupy (their ``X^p`` in NTT form are tabulated).
    """

    def __init__(self, key: RlweSecretKey, plaintext_modulus: int, positions: Sequence[int]):
        self.key, self.t = key, int(plaintext_modulus)
        self.positions = tuple(int(p) for p in positions)
        self._monomials = kernels.centred(key.ring.monomials(self.positions), key.ring.q[:, 0])
        self._next = 0
        self._ready: deque[tuple[int, bytes, np.ndarray]] = deque()

    def precompute(self, count: int) -> None:
        """Compute ``count`` encryptions of zero ahead (offline: the seed, ``a s``, ``NTT(e)``)."""
        for _ in range(count):
            seed, b0, _ = self.key.zero(self._next, self.t)
            self._ready.append((self._next, seed, b0))
            self._next += 1

    @property
    def ready(self) -> int:
        """Encryptions of zero computed ahead and not used yet."""
        return len(self._ready)

    def encrypt(self, values: Sequence[int]) -> Ciphertext:
        """The ciphertext of ``sum_i values[i] X^positions[i]`` (online: a sparse sum).

        ``values`` are signed integers below ``t / 2`` in magnitude (centred representatives:
        the noise bounds count their size), one per position.
        """
        if not self._ready:
            self.precompute(1)
        _, seed, b0 = self._ready.popleft()
        ring = self.key.ring
        centred = [[_centre(int(v), q) for q in ring.primes] for v in values]
        residues = np.array(centred, dtype=np.float64).reshape(len(values), ring.n_primes)
        return Ciphertext(seed, kernels.add_sparse(b0, self._monomials, residues, ring.q[:, 0]))


def _centre(x: int, q: int) -> int:
    """``x mod q`` in ``(-q/2, q/2]``."""
    x %= q
    return x - q if x > q // 2 else x
