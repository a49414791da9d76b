"""Arithmetic in ``Z_q``, ``q = 2^bits`` (up to 128 bits): uint64 words outside, exact ints inside.

* **Bulk work** (the user's masks ``<a_i, s>`` over ``n``-dimensional public vectors) runs in
  numpy as wrapping uint64 sums (:meth:`Ring.ternary_inner`).
* **Per-sample work** (a few dozen products of integer coefficients by ciphertext words) runs on
  Python integers, exact for any ``q`` and faster than numpy on vectors this short.
* **Words** on the wire and in the cloud's state: uint64 arrays, one word per element for
  ``q <= 2^64``, two little-endian limbs (low first) otherwise.

The shared integer module of the modular immersion (fixed-point values, uint64 products modulo
``2^64``, wrap-around checks) covers ``q = 2^64``; the limbs and ternary products are LWE's own.
"""

from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

from ..errors import InvalidArgumentError

_M64 = (1 << 64) - 1


class Ring:
    """``Z_q`` with ``q = 2^bits``, ``16 <= bits <= 128``.

    Examples
    --------
    >>> r = Ring(64)
    >>> r.centered(r.q - 3), r.unpack(r.pack([5, r.q - 1]))
    (-3, [5, 18446744073709551615])
    >>> r2 = Ring(128)
    >>> [hex(int(w)) for w in r2.pack([r2.q - 1])]       # two limbs of 2^128 - 1
    ['0xffffffffffffffff', '0xffffffffffffffff']
    >>> r2.combine([[3, -1]], [r2.q - 1, 2])             # 3 (q - 1) - 2 = -5 mod q
    [340282366920938463463374607431768211451]
    """

    def __init__(self, bits: int) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 16 <= bits <= 128:
            raise InvalidArgumentError(
                "modulus_bits", f"expected an integer in [16, 128], got {bits!r}"
            )
        self.bits = bits
        self.limbs = 1 if bits <= 64 else 2
        self.q = 1 << bits
        self.mask = self.q - 1
        self._half = 1 << (bits - 1)

    def centered(self, value: int) -> int:
        """The representative of ``value mod q`` in ``[-q/2, q/2)``."""
        value &= self.mask
        return value - self.q if value >= self._half else value

    def combine(self, rows: Sequence[Sequence[int]], vector: Sequence[int]) -> list[int]:
        """``rows @ vector mod q`` on Python ints (signed coefficients welcome)."""
        mask = self.mask
        return [sum(map(operator.mul, row, vector)) & mask for row in rows]

    # ------------------------------------------------------------ words
    def limb_list(self, values: Sequence[int]) -> list[int]:
        """Elements in ``[0, q)`` as the list of their uint64 words (low limb first)."""
        if self.limbs == 1:
            return list(values)
        return [w for v in values for w in (v & _M64, v >> 64)]

    def pack(self, values: Sequence[int]) -> np.ndarray:
        """Elements in ``[0, q)`` as uint64 words (``limbs`` per element, low limb first)."""
        return np.array(self.limb_list(values), dtype=np.uint64)

    def unpack(self, words: np.ndarray | list[int]) -> list[int]:
        """Inverse of :meth:`pack` (words of a trusted source: reduced modulo ``q``)."""
        values = words.tolist() if isinstance(words, np.ndarray) else words
        if self.limbs == 1:
            return [v & self.mask for v in values] if self.bits < 64 else values
        return [
            (lo | (hi << 64)) & self.mask for lo, hi in zip(values[0::2], values[1::2], strict=True)
        ]

    # ------------------------------------------------------------ bulk: masks
    def prepare_secret(self, secret: np.ndarray) -> np.ndarray:
        """A ternary secret (int8 in ``{-1, 0, 1}``) as uint64 two's complement words."""
        return secret.astype(np.int64).view(np.uint64)

    def ternary_inner(self, vectors: np.ndarray, secret: np.ndarray) -> list[int]:
        """``<a_i, s> mod q`` for rows of words ``a_i`` (``limbs`` per element; taken modulo ``q``).

        Wrapping uint64 sums (einsum: the fastest here, 1 us per 4096 products) are exact modulo
        ``2^64``, which is all ``q <= 2^64`` needs. Wider: ``a = lo + 2^64 hi``; the high limb is
        needed modulo ``q / 2^64`` only (a wrapping sum again), and ``sum s lo`` exactly, from its
        two 32-bit halves (each sum below ``n 2^32``, exact after the wrap).
        """
        if self.limbs == 1:
            return [v & self.mask for v in np.einsum("cn,n->c", vectors, secret).tolist()]
        lo, hi = vectors[:, 0::2], vectors[:, 1::2]
        low = np.einsum("cn,n->c", lo & np.uint64(0xFFFFFFFF), secret).view(np.int64)
        mid = np.einsum("cn,n->c", lo >> np.uint64(32), secret).view(np.int64)
        top = np.einsum("cn,n->c", hi, secret)
        return [
            (a + (b << 32) + (c << 64)) & self.mask
            for a, b, c in zip(low.tolist(), mid.tolist(), top.tolist(), strict=True)
        ]


def round_shift(value: int, bits: int) -> int:
    """``round(value / 2^bits)``, ties up, exactly: the one rescale of twin and decryption.

    Examples
    --------
    >>> [round_shift(v, 2) for v in (5, 6, -5, -6, 7)]
    [1, 2, -1, -1, 2]
    """
    return (value + (1 << (bits - 1))) >> bits if bits else value
