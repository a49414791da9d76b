"""The user's LWE secret and the randomness of encryption: seeded public vectors, clipped errors.

* **Secret** ``s``: ``n`` entries uniform on ``{-1, 0, 1}`` (the HE standard's ternary secret),
  expanded with SHAKE-256 from a 32-byte master secret: OS entropy (``secrets.token_bytes``) by
  default, or drawn from a seeded ``rng`` for reproducible tests (the seed is then the key).
* **Public vectors** ``a_i``: expanded from a public 16-byte seed and the ciphertext's index, as
  FrodoKEM expands its public matrix (AES-128 with the seed as key over counter blocks,
  ``"aes128-ctr"``, or SHAKE-128, ``"shake128"``). Anyone holding the seed can recompute every
  ``a_i``, so a ciphertext on the wire is its ``b`` word only.
* **Errors** ``e_i``: discrete Gaussian of width 3.2 restricted to ``|e| <= 19``, drawn by a
  cumulative table from SHAKE-256 of the master secret (never published).
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, OptionalDependencyError
from ..keygen import resolve_rng
from .params import LweParameters

#: Expanders of the public vectors (``"auto"``: AES when ``cryptography`` is installed).
PRGS = ("aes128-ctr", "shake128")


def aes_available() -> bool:
    try:
        import cryptography.hazmat.primitives.ciphers  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_prg(prg: str) -> str:
    """``"auto"`` -> ``"aes128-ctr"`` if ``cryptography`` is installed, else ``"shake128"``."""
    if prg == "auto":
        return "aes128-ctr" if aes_available() else "shake128"
    if prg not in PRGS:
        raise InvalidArgumentError("prg", f"expected 'auto' or one of {PRGS}, got {prg!r}")
    if prg == "aes128-ctr" and not aes_available():
        raise OptionalDependencyError("cryptography", "lwe", "prg='aes128-ctr'")
    return prg


def public_vectors(
    seed: bytes, first: int, count: int, words_per_vector: int, prg: str
) -> np.ndarray:
    """The public vectors ``a_first .. a_{first+count-1}`` as ``(count, words_per_vector)`` uint64.

    ``aes128-ctr``: vector ``i`` is the AES-128 keystream (key = ``seed``, big-endian counter
    starting at ``i * ceil(words_per_vector / 2)``); ``shake128``: SHAKE-128 of the seed and ``i``.

    Examples
    --------
    >>> a = public_vectors(bytes(16), 3, 2, 8, "shake128")
    >>> b = public_vectors(bytes(16), 4, 1, 8, "shake128")
    >>> a.shape, bool((a[1] == b[0]).all())
    ((2, 8), True)
    """
    if prg == "shake128":
        out = np.empty((count, words_per_vector), dtype=np.uint64)
        for row, index in enumerate(range(first, first + count)):
            digest = hashlib.shake_128(b"immersion-lwe-a" + seed + index.to_bytes(8, "little"))
            out[row] = np.frombuffer(digest.digest(8 * words_per_vector), dtype="<u8")
        return out
    from ..prg import aes_ctr

    blocks = (words_per_vector + 1) // 2
    stream = aes_ctr(
        seed,
        16 * blocks * count,
        first_block=first * blocks,
        extra="lwe",
        purpose="prg='aes128-ctr'",
    )
    words = np.frombuffer(stream, dtype="<u8").reshape(count, 2 * blocks)
    return words[:, :words_per_vector] if 2 * blocks != words_per_vector else words


def error_probabilities(sigma: float, bound: int) -> np.ndarray:
    """``P(e = k)``, ``|k| <= bound``: discrete Gaussian of width ``sigma`` clipped at ``bound``."""
    k = np.arange(-bound, bound + 1, dtype=np.float64)
    weights = np.exp(-(k**2) / (2 * sigma**2))
    return weights / weights.sum()


def _cdt(sigma: float, bound: int) -> np.ndarray:
    """Thresholds ``floor(2^64 P(e <= k))``, ``-bound <= k < bound``, of the clipped Gaussian."""
    cumulative = np.cumsum(error_probabilities(sigma, bound))[:-1]
    return np.array([min(int(c * 2.0**64), 2**64 - 1) for c in cumulative], dtype=np.uint64)


class LweSecretKey:
    """User side, secret: the ternary key ``s`` and the master secret the errors come from.

    Never printed: ``repr`` shows the dimension and a fingerprint.
    """

    def __init__(self, master: bytes, params: LweParameters) -> None:
        if len(master) != 32:
            raise InvalidArgumentError("master", "expected 32 bytes")
        self._master = master
        self.params = params
        self.secret = _ternary(master, params.dimension)
        self.fingerprint = hashlib.sha256(b"immersion-lwe-fp" + master).hexdigest()[:16]
        self._cdt = _cdt(params.sigma, params.error_bound)

    @classmethod
    def generate(
        cls, params: LweParameters, *, rng: Any = None, secure: bool = False
    ) -> LweSecretKey:
        """A fresh key: 32 master bytes of OS entropy, or from ``rng`` (seed or Generator).

        With ``rng=None`` (the default) or ``secure=True`` the master secret is
        ``secrets.token_bytes(32)``: 256 bits straight from the OS, never through a numpy
        generator (whose seed holds at most 128 bits). A given ``rng`` makes the key
        reproducible, which is what tests want and what a deployment must not have: the seed is
        the key.

        Parameters
        ----------
        params:
            The LWE parameters (dimension, error law).
        rng:
            None (OS entropy), or an int seed / numpy Generator (reproducible, tests).
        secure:
            True: OS entropy (the same as ``rng=None``; refused together with an ``rng``).

        Returns
        -------
        LweSecretKey
        """
        if rng is None:
            if not isinstance(secure, (bool, np.bool_)):
                raise InvalidArgumentError("secure", f"expected True or False, got {secure!r}")
            return cls(_secrets.token_bytes(32), params)
        generator = resolve_rng(rng, secure)  # validates rng; refuses rng with secure=True
        return cls(generator.bytes(32), params)

    def episode_seed(self, episode: int) -> bytes:
        """The public seed of the ``episode``-th encrypted run (unique per key and episode)."""
        return hashlib.shake_256(
            b"immersion-lwe-seed" + self._master + episode.to_bytes(8, "little")
        ).digest(16)

    def errors(self, seed: bytes, batch: int, count: int) -> np.ndarray:
        """``count`` errors (int64, ``|e| <= error_bound``) from ``batch`` of the run ``seed``."""
        digest = hashlib.shake_256(
            b"immersion-lwe-e" + self._master + seed + batch.to_bytes(8, "little")
        ).digest(8 * count)
        uniform = np.frombuffer(digest, dtype="<u8")
        return np.searchsorted(self._cdt, uniform, side="right").astype(np.int64) - (
            self.params.error_bound
        )

    def __repr__(self) -> str:
        return f"LweSecretKey(n={self.params.dimension}, fingerprint={self.fingerprint})"

    def __reduce__(self) -> Any:
        raise TypeError("an LWE secret key is not pickled; keep it on the user's side")


def _ternary(master: bytes, n: int) -> np.ndarray:
    """``n`` entries uniform on ``{-1, 0, 1}`` by rejection on SHAKE-256 bytes (255 rejected)."""
    length = 2 * n + 64
    while True:
        raw = np.frombuffer(
            hashlib.shake_256(b"immersion-lwe-s" + master).digest(length), dtype=np.uint8
        )
        kept = raw[raw < 255]
        if kept.size >= n:
            return (kept[:n] % 3).astype(np.int8) - 1
        length *= 2
