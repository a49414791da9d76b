"""AES in counter mode as the SDK's one cryptographic keystream.

Two users, two purposes: :func:`immersion.securesum.protocol.keystream` (pairwise masks of a
secure sum, AES-128 keyed by a pair seed) and :func:`immersion.lwe.keys.public_vectors` (the
public LWE vectors expanded from a seed, AES-128 as FrodoKEM does). Both need ``cryptography``.
"""

from __future__ import annotations

import functools
from typing import Iterator

import numpy as np

from ..errors import InvalidArgumentError, OptionalDependencyError

__all__ = ["aes_ctr", "aes_ctr_chunks", "chunk_buffer"]


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


def aes_ctr_chunks(
    key: bytes,
    n_words: int,
    *,
    chunk_words: int,
    extra: str,
    purpose: str,
    buffer: bytearray | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """The first ``n_words`` 64-bit words of :func:`aes_ctr`'s stream, chunk by chunk, each
    written into one reused buffer: use a chunk before asking for the next.

    Parameters
    ----------
    key:
        16 or 32 bytes.
    n_words:
        Length of the stream in words.
    chunk_words:
        Words per chunk.
    extra, purpose:
        As in :func:`aes_ctr`.
    buffer:
        Where to write the chunks (at least ``8 * chunk_words + 15`` bytes), e.g. one buffer
        shared by the streams of several keys read in turn, chunk by chunk: no allocation per
        stream. A fresh one by default.

    Yields
    ------
    tuple of (int, np.ndarray)
        The index of the chunk's first word and the chunk (``uint64``, a view of the buffer).

    Examples
    --------
    >>> chunks = aes_ctr_chunks(bytes(16), 5, chunk_words=2, extra="lwe", purpose="a doctest")
    >>> words = np.concatenate([c.copy() for _, c in chunks])
    >>> words.tobytes() == aes_ctr(bytes(16), 40, extra="lwe", purpose="a doctest")
    True
    """
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise OptionalDependencyError("cryptography", extra, purpose) from None
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    chunk = max(1, min(int(chunk_words), int(n_words)))
    out = chunk_buffer(chunk) if buffer is None else buffer
    if len(out) < _chunk_bytes(chunk):
        raise InvalidArgumentError("buffer", f"expected at least {_chunk_bytes(chunk)} bytes")
    view = np.frombuffer(out, dtype=np.uint64, count=chunk)
    for start in range(0, n_words, chunk):
        size = min(chunk, n_words - start)
        encryptor.update_into(_zeros(8 * size), out)
        yield start, view[:size]


def chunk_buffer(chunk_words: int) -> bytearray:
    """A buffer for :func:`aes_ctr_chunks` of ``chunk_words`` words, which the streams of several
    keys can share when they are read chunk by chunk in turn (one allocation, not one per key:
    the allocations, not AES, dominated the masks of small vectors).

    Parameters
    ----------
    chunk_words:
        Words per chunk.

    Examples
    --------
    >>> len(chunk_buffer(4))  # 8 bytes a word, and AES-CTR may write a block less one beyond
    47
    """
    return bytearray(_chunk_bytes(max(1, int(chunk_words))))


def _chunk_bytes(chunk_words: int) -> int:
    """Bytes a chunk needs: ``update_into`` may write up to ``block_size - 1`` beyond the data."""
    return 8 * chunk_words + 15
