"""AES in counter mode as the SDK's one cryptographic keystream.

Two users, two purposes: :func:`immersion.securesum.keystream` (pairwise masks of a secure sum,
AES-256 keyed by a pair seed) and :func:`immersion.lwe.keys.public_vectors` (the public LWE
vectors expanded from a seed, AES-128 as FrodoKEM does). Both need ``cryptography``.
"""

from __future__ import annotations

import functools

from .errors import OptionalDependencyError

__all__ = ["aes_ctr"]


def aes_ctr(key: bytes, n_bytes: int, *, first_block: int = 0, extra: str, purpose: str) -> bytes:
    """``n_bytes`` of the AES-CTR keystream under ``key``, from counter block ``first_block``.

    The 16-byte counter is big-endian and starts at ``first_block``, so block ``i`` of the
    stream does not depend on where a caller starts reading it.

    Parameters
    ----------
    key:
        16 (AES-128) or 32 (AES-256) bytes.
    n_bytes:
        Length of the stream.
    first_block:
        Counter value of the first 16-byte block.
    extra, purpose:
        The pip extra that brings ``cryptography`` and what needs it (for the error message).

    Examples
    --------
    >>> a = aes_ctr(bytes(16), 48, extra="lwe", purpose="a doctest")
    >>> a[16:] == aes_ctr(bytes(16), 32, first_block=1, extra="lwe", purpose="a doctest")
    True
    """
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise OptionalDependencyError("cryptography", extra, purpose) from None
    nonce = first_block.to_bytes(16, "big")
    return Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(_zeros(n_bytes))


@functools.lru_cache(maxsize=4)
def _zeros(size: int) -> bytes:
    """A reusable buffer of zero bytes (the plaintext of the keystream; callers often repeat
    a size)."""
    return bytes(size)
