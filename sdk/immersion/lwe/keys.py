"""Randomness shared by the plant and the cloud: the expander of public polynomials, the ternary
secret.

* **Secret** ``s``: ``n`` entries uniform on ``{-1, 0, 1}`` (the HE standard's ternary secret),
  expanded with SHAKE-256 from a 32-byte master secret.
* **Public words**: expanded from a public 16-byte seed and an index, as FrodoKEM expands its
  public matrix (AES-128 with the seed as key over counter blocks, ``"aes128-ctr"``, or SHAKE-128,
  ``"shake128"``): anyone holding the seed recomputes them, so a ciphertext travels as its seed
  and ``b``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..errors import InvalidArgumentError, OptionalDependencyError

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
    from ..securesum.prg import aes_ctr

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
