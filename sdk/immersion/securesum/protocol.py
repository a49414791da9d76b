"""One secure-sum primitive: pairwise masks that cancel in a sum, with dropout recovery.

A round among clients ``0..K-1`` (Bonawitz et al., CCS 2017, section 4, without the double
masking):

1. every client makes a fresh X25519 key pair (:class:`KeyAgreement`) and publishes its public key
   (the aggregator relays public keys only);
2. two clients derive the same 32-byte secret by Diffie-Hellman and expand it with HKDF-SHA256
   into one seed per purpose (:meth:`KeyAgreement.pair_seeds`; the HKDF info carries a ``label``,
   the purpose, the round and the pair); the seed's first 16 bytes key AES-128 in counter mode,
   a cryptographic PRG (:func:`keystream`);
3. a client turns its vector into two-limb fixed point (:func:`to_fixed`: 2^-60 resolution) and
   adds, modulo 2^64, one uniform mask per peer (:func:`pair_mask`): ``+`` when its index is the
   smaller of the pair, ``-`` otherwise (:func:`mask`). Nobody without a pair's seed, the
   aggregator included, can tell a masked vector from uniform words;
4. the aggregator adds the masked vectors modulo 2^64 (:func:`sum_words`): every mask between two
   contributors cancels exactly; if clients dropped out after step 1, each surviving peer
   reveals its seeds with them (:meth:`SecureSumClient.reveal`) and :func:`recovery_mask` removes
   the masks left uncancelled; :func:`from_fixed` gives the float sum.

What it protects, against whom: an aggregator (and anyone on the wire) that follows the protocol
learns the sum over the contributors and who contributed, not a single vector. Not protected:
a client that colludes with the aggregator learns its pair seeds (so with ``K - 1`` colluders
the last vector is exposed by subtraction, as for any secure sum); an aggregator that asks for
a client's seeds and later accepts that client's upload unmasks it (the double masking of
Bonawitz et al. closes this; here the protocol must refuse uploads from clients it declared
dropped); an active aggregator that lies about public keys (no authentication of the keys).

Precision: :func:`to_fixed` stores ``x`` as ``(high + low / 2^40) / 2^20`` with ``high = floor(x
2^20)`` and ``low = round(frac 2^40)``: each value is moved by at most ``2^-61`` and the sum of
``K`` values is read back within ``K 2^-61`` plus one float64 rounding of the result; the range
is ``|x| < 2^42 / K`` (refused beyond, naming the argument). With ``words=1`` (one uint64 word
per value: half the keystream, half the upload) ``x`` is stored as ``round(x 2^38)``: each value
moves by at most ``2^-39`` (about 1.8e-12), the sum of ``K`` values is read back within
``K 2^-39`` plus one rounding, and the range is ``|x| < 2^24 / K`` (:func:`fixed_point_limit`,
proof there; refused beyond, so a caller can fall back to two limbs).

Examples
--------
>>> import numpy as np
>>> values = [np.array([0.25, -1.0]), np.array([1.5, 2.0]), np.array([-0.5, 3.0])]
>>> clients = [SecureSumClient(k, 0, private_bytes=bytes([k + 1]) * 32) for k in range(3)]
>>> publics = {c.index: c.public_bytes for c in clients}
>>> masked = [c.mask(v, publics, n_summands=3) for c, v in zip(clients, values)]
>>> unmask(sum_words(masked)).tolist()
[1.25, 4.0]
>>> # client 2 dropped after the key agreement: the survivors reveal their seeds with it
>>> revealed = [(k, 2, clients[k].reveal([2], publics)[2]) for k in (0, 1)]
>>> unmask(sum_words(masked[:2]), revealed).tolist()
[1.75, 1.0]
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from ..errors import InvalidArgumentError, OptionalDependencyError

#: Bytes of an X25519 public key and of a pair seed.
PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
#: Two-limb fixed point: ``x = (high + low / 2^LOW_BITS) / 2^HIGH_BITS``.
HIGH_BITS = 20
LOW_BITS = 40
#: Words (uint64) per value in the two-limb fixed-point encoding (the default).
WORDS_PER_VALUE = 2
#: Fraction bits of the one-limb encoding (``words=1``): ``x = word / 2^ONE_LIMB_BITS``.
ONE_LIMB_BITS = 38
#: Keystream bytes generated and added per chunk (keeps the chunk in cache while it is added).
CHUNK_BYTES = 1 << 18
#: The HKDF label of pair seeds unless a caller names its own.
DEFAULT_LABEL = "immersion-securesum"
#: The purpose of the masks' seeds.
MASK = "mask"


class FixedPointRangeError(InvalidArgumentError):
    """Values too large (or not finite) for the fixed-point range of :func:`to_fixed`."""


Revealed = tuple[int, int, bytes]  # (survivor, dropped, the pair's mask seed)
S = TypeVar("S")


def _crypto() -> tuple[Any, Any, Any, Any]:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.x25519 import (
            X25519PrivateKey,
            X25519PublicKey,
        )
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError:
        raise OptionalDependencyError("cryptography", "fl", "secure summation") from None
    return X25519PrivateKey, X25519PublicKey, HKDF, hashes.SHA256


@dataclass
class KeyAgreement:
    """One client's ephemeral X25519 key pair for one round, and its pair seeds.

    Parameters
    ----------
    client : int
        The client's index (pairs are named by their two indices).
    round_t : int
        The round (seeds of different rounds differ).
    private_bytes : bytes, optional
        32 raw bytes of the private key (a simulation that wants reproducible runs, or a node
        that restores the key it advertised); by default a fresh key from OS entropy.
    label : str
        The first part of the HKDF info: two uses with different labels get unrelated seeds from
        the same key pair (MP-DP uses ``"immersion-mpdp"``).

    Examples
    --------
    >>> a, b = KeyAgreement(0, 3), KeyAgreement(5, 3)
    >>> a.pair_seed(5, b.public_bytes, "mask") == b.pair_seed(0, a.public_bytes, "mask")
    True
    """

    client: int
    round_t: int
    private_bytes: bytes | None = field(default=None, repr=False)
    label: str = DEFAULT_LABEL
    _extracted: dict[bytes, bytes] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        private_cls = _crypto()[0]
        if self.private_bytes is None:
            self._private = private_cls.generate()
        else:
            if not isinstance(self.private_bytes, bytes) or len(self.private_bytes) != 32:
                raise InvalidArgumentError("private_bytes", "expected 32 bytes")
            self._private = private_cls.from_private_bytes(self.private_bytes)

    def private_key_bytes(self) -> bytes:
        """The raw private key (32 bytes), for a node that must keep it between messages.

        Returns
        -------
        bytes
            32 bytes; :class:`KeyAgreement` with ``private_bytes`` set to them is the same key.
        """
        from cryptography.hazmat.primitives import serialization

        raw: bytes = self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return raw

    @property
    def public_bytes(self) -> bytes:
        """The raw public key (32 bytes), what the client publishes."""
        from cryptography.hazmat.primitives import serialization

        raw: bytes | None = self.__dict__.get("_public")
        if raw is None:
            raw = self.__dict__["_public"] = self._private.public_key().public_bytes(
                serialization.Encoding.Raw,
                serialization.PublicFormat.Raw,
            )
        return raw

    def shared_secret(self, peer_public: bytes) -> bytes:
        """The raw X25519 Diffie-Hellman secret with the holder of ``peer_public``.

        Parameters
        ----------
        peer_public : bytes
            The peer's raw public key (32 bytes).

        Returns
        -------
        bytes
            32 bytes (the same on both sides); seeds come from it through HKDF, never directly.
        """
        public_cls = _crypto()[1]
        if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
            raise InvalidArgumentError(
                "peer_public", f"expected {PUBLIC_KEY_BYTES} raw bytes of an X25519 key"
            )
        secret: bytes = self._private.exchange(public_cls.from_public_bytes(peer_public))
        return secret

    def pair_seeds(
        self,
        peer: int,
        peer_public: bytes,
        purposes: tuple[str, ...],
        *,
        round_t: int | None = None,
        attempt: int = 0,
    ) -> dict[str, bytes]:
        """32-byte seeds shared with ``peer``, one per purpose (both sides get the same bytes).

        One Diffie-Hellman exchange, then HKDF-SHA256 with info
        ``"{label}/{purpose}/round {round_t}/pair {low}-{high}"`` (and ``"/attempt {attempt}"``
        after it for a retried round, ``attempt > 0``). The HKDF-Extract of each peer's secret
        is kept, so a key pair used over several rounds pays for the exchange once per peer;
        the seeds of one round (and attempt) say nothing about those of another (HKDF is a PRF
        in its info).

        Parameters
        ----------
        peer : int
            The other client's index.
        peer_public : bytes
            Its raw public key (32 bytes).
        purposes : tuple of str
            One seed per purpose (masks, noise, ...).
        round_t : int, optional
            The round the seeds are for; this key pair's ``round_t`` by default.
        attempt : int
            The retry of that round (0: the first try).

        Returns
        -------
        dict of str to bytes
            ``{purpose: seed}``.
        """
        if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
            raise InvalidArgumentError(
                "peer_public", f"expected {PUBLIC_KEY_BYTES} raw bytes of an X25519 key"
            )
        prk = self._extracted.get(peer_public)
        if prk is None:
            prk = self._extracted[peer_public] = hkdf_extract(self.shared_secret(peer_public))
        low, high = sorted((self.client, peer))
        at = self.round_t if round_t is None else int(round_t)
        tail = f"/attempt {attempt}" if attempt else ""
        return {
            purpose: hkdf_expand(
                prk, f"{self.label}/{purpose}/round {at}/pair {low}-{high}{tail}".encode()
            )
            for purpose in purposes
        }

    def pair_seed(self, peer: int, peer_public: bytes, purpose: str) -> bytes:
        """The seed shared with ``peer`` for one ``purpose``.

        Parameters
        ----------
        peer : int
            The other client's index.
        peer_public : bytes
            Its raw public key (32 bytes).
        purpose : str
            What the seed is for.

        Returns
        -------
        bytes
            32 bytes.
        """
        return self.pair_seeds(peer, peer_public, (purpose,))[purpose]


def hkdf_extract(secret: bytes) -> bytes:
    """HKDF-SHA256's Extract step with no salt (RFC 5869: ``HMAC(0^32, secret)``).

    Parameters
    ----------
    secret : bytes
        The input keying material (a Diffie-Hellman secret).

    Returns
    -------
    bytes
        The 32-byte pseudo-random key for :func:`hkdf_expand`.
    """
    return hmac.digest(bytes(32), secret, "sha256")


def hkdf_expand(prk: bytes, info: bytes, length: int = SEED_BYTES) -> bytes:
    """HKDF-SHA256's Expand step (RFC 5869), ``length`` bytes for ``info``.

    ``hkdf_expand(hkdf_extract(secret), info)`` is ``cryptography``'s
    ``HKDF(SHA256(), 32, salt=None, info).derive(secret)`` (``tests/test_securesum.py``).

    Parameters
    ----------
    prk : bytes
        From :func:`hkdf_extract`.
    info : bytes
        What the output is for.
    length : int
        Bytes wanted, at most ``255 * 32``.

    Returns
    -------
    bytes
        ``length`` bytes.

    Examples
    --------
    >>> len(hkdf_expand(hkdf_extract(bytes(32)), b"a doctest", 40))
    40
    """
    if not 0 < length <= 255 * 32:
        raise InvalidArgumentError("length", f"expected 1 to {255 * 32} bytes, got {length}")
    out, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
    return out[:length]


def _stream_key(seed: bytes) -> bytes:
    """The AES-128 key of a pair seed: its first 16 bytes, which are HKDF-SHA256's output of
    length 16 for the same info (HKDF-Expand's output is a prefix of any longer one). 128 bits
    match X25519's security level (as TLS 1.3's AES-128 suites with x25519), and AES-128-CTR
    runs about 1.3x faster than AES-256 here, which the masks of large vectors feel."""
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise InvalidArgumentError("seed", f"expected {SEED_BYTES} bytes, got {seed!r:.40}")
    return seed[:16]


def keystream(seed: bytes, n_words: int) -> np.ndarray:
    """``n_words`` pseudo-random 64-bit words: AES-128 in counter mode keyed by ``seed``.

    A cryptographic PRG (as fast here as numpy's Philox).

    Parameters
    ----------
    seed : bytes
        32 bytes (a pair seed; its first 16 are the key).
    n_words : int
        How many words.

    Returns
    -------
    np.ndarray
        ``uint64``, shape ``(n_words,)``.

    Examples
    --------
    >>> words = keystream(bytes(32), 4)
    >>> words.dtype, len(words), bool((words == keystream(bytes(32), 4)).all())
    (dtype('uint64'), 4, True)
    """
    from .prg import aes_ctr

    key = _stream_key(seed)
    stream = aes_ctr(key, 8 * n_words, extra="fl", purpose="secure summation")
    return np.frombuffer(stream, dtype=np.uint64)


def keystream_chunks(
    seed: bytes,
    n_words: int,
    *,
    chunk_words: int = CHUNK_BYTES // 8,
    buffer: bytearray | None = None,
) -> Iterator[tuple[int, np.ndarray]]:
    """:func:`keystream`'s words chunk by chunk in one reused buffer (use a chunk before asking
    for the next): the same words, without a vector-sized stream in memory.

    Parameters
    ----------
    seed : bytes
        32 bytes (a pair seed).
    n_words : int
        Length of the stream in words.
    chunk_words : int
        Words per chunk.
    buffer : bytearray, optional
        The buffer to write chunks into (:func:`~immersion.securesum.prg.chunk_buffer`): one
        buffer for the streams of all the peers of a mask, read in turn.

    Yields
    ------
    tuple of (int, np.ndarray)
        The index of the chunk's first word and the chunk (``uint64``, a view of the buffer).

    Examples
    --------
    >>> parts = [c.copy() for _, c in keystream_chunks(bytes(32), 5, chunk_words=2)]
    >>> bool((np.concatenate(parts) == keystream(bytes(32), 5)).all())
    True
    """
    from .prg import aes_ctr_chunks

    return aes_ctr_chunks(
        _stream_key(seed),
        n_words,
        chunk_words=chunk_words,
        extra="fl",
        purpose="secure summation",
        buffer=buffer,
    )


def keystream_uniform(seed: bytes, n: int, low: float, high: float) -> np.ndarray:
    """``n`` uniform draws in ``[low, high)`` from :func:`keystream` (53 random bits each).

    Parameters
    ----------
    seed : bytes
        32 bytes.
    n : int
        How many draws.
    low, high : float
        The interval.

    Returns
    -------
    np.ndarray
        float64, shape ``(n,)``.

    Examples
    --------
    >>> u = keystream_uniform(bytes(32), 1000, -1.0, 1.0)
    >>> bool((u >= -1).all() and (u < 1).all())
    True
    """
    unit = (keystream(seed, n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return low + (high - low) * unit


def fixed_point_limit(n_summands: int, *, words: int = WORDS_PER_VALUE) -> float:
    """The largest ``|x|`` :func:`to_fixed` takes when ``n_summands`` vectors will be summed.

    Two limbs: ``2^(62 - HIGH_BITS) / n_summands``: the high limbs of the sum stay below ``2^62``.
    One limb: ``2^(62 - ONE_LIMB_BITS) / n_summands``. Proof that the sum is then exact modulo
    ``2^64`` and reads back correctly: each word is ``q_k = round(x_k 2^F)`` with ``F =
    ONE_LIMB_BITS`` and ``|x_k| < 2^(62-F) / K``, so ``|q_k| <= 2^62 / K + 1/2`` and
    ``|sum_k q_k| <= 2^62 + K/2 < 2^63``: the true integer sum lies in the int64 range, so its
    residue modulo ``2^64``, read as two's complement, is the sum itself, whatever masks were
    added and cancelled on the way. Its value ``sum_k q_k / 2^F`` differs from ``sum_k x_k`` by
    at most ``K 2^-(F+1)``.

    Parameters
    ----------
    n_summands : int
        How many vectors the sum has (at least 1).
    words : {1, 2}
        Words per value (one or two limbs).

    Returns
    -------
    float
        The bound (exclusive).

    Examples
    --------
    >>> fixed_point_limit(1) == 2.0**42, fixed_point_limit(4, words=1) == 2.0**22
    (True, True)
    """
    bits = HIGH_BITS if _words(words) == 2 else ONE_LIMB_BITS
    return 2.0 ** (62 - bits) / max(1, int(n_summands))


def _words(words: object) -> int:
    if isinstance(words, bool) or words not in (1, 2):
        raise InvalidArgumentError("words", f"expected 1 or 2 words per value, got {words!r}")
    return int(words)  # type: ignore[call-overload]


def to_fixed(
    values: np.ndarray, n_summands: int, *, argument: str = "values", words: int = WORDS_PER_VALUE
) -> np.ndarray:
    """Fixed point (two uint64 words per value by default, or one), ready to be masked.

    Two limbs: ``high = floor(x 2^20)``, ``low = round((x 2^20 - high) 2^40)``: each value moves
    by at most ``2^-61``. One limb (``words=1``): ``round(x 2^38)``, each value moves by at most
    ``2^-39``; the range is 2^18 times smaller (:func:`fixed_point_limit`).

    Parameters
    ----------
    values : np.ndarray
        Finite float64 values, any shape (flattened).
    n_summands : int
        How many such vectors will be summed: values whose sum could overflow are refused.
    argument : str
        The name used in the error (the caller's argument).
    words : {1, 2}
        Words per value.

    Returns
    -------
    np.ndarray
        ``uint64``, shape ``(words * values.size,)``: ``(high, low)`` per value, or one word,
        two's complement.

    Examples
    --------
    >>> from_fixed(to_fixed(np.array([1 / 3, -2.5]), 4)).tolist() == [1 / 3, -2.5]
    True
    >>> from_fixed(to_fixed(np.array([0.75, -2.5]), 4, words=1), words=1).tolist()
    [0.75, -2.5]
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    limit = fixed_point_limit(n_summands, words=words)
    worst = float(np.max(np.abs(values))) if values.size else 0.0
    if not np.isfinite(worst) or worst >= limit:
        raise FixedPointRangeError(
            argument,
            f"max |{argument}| = {worst:.3g} exceeds the fixed-point range "
            f"{limit:.3g} for {n_summands} summands"
            + (" in one 64-bit word (two words per value allow more)" if words == 1 else ""),
        )
    if words == 1:
        one: np.ndarray = np.rint(values * 2.0**ONE_LIMB_BITS).astype(np.int64).view(np.uint64)
        return one
    scaled = values * 2.0**HIGH_BITS
    high = np.floor(scaled)
    low = np.round((scaled - high) * 2.0**LOW_BITS)
    return np.stack([high.astype(np.int64), low.astype(np.int64)], axis=1).ravel().view(np.uint64)


def from_fixed(total: np.ndarray, *, words: int = WORDS_PER_VALUE) -> np.ndarray:
    """The float values of summed (mod 2^64) fixed-point words.

    Parameters
    ----------
    total : np.ndarray
        ``uint64`` words from :func:`to_fixed` or their sum (masks removed).
    words : {1, 2}
        Words per value, as given to :func:`to_fixed`.

    Returns
    -------
    np.ndarray
        float64, one value per ``words`` words.
    """
    if _words(words) == 1:
        one: np.ndarray = np.ascontiguousarray(total).view(np.int64) * 2.0**-ONE_LIMB_BITS
        return one
    limbs = np.ascontiguousarray(total).view(np.int64).reshape(-1, 2).astype(np.float64)
    out: np.ndarray = (limbs[:, 0] + limbs[:, 1] / 2.0**LOW_BITS) / 2.0**HIGH_BITS
    return out


def pair_mask(seed: bytes, n_values: int) -> np.ndarray:
    """The pair's uniform 64-bit mask for ``n_values`` fixed-point values (two words each).

    Parameters
    ----------
    seed : bytes
        The pair's 32-byte mask seed.
    n_values : int
        How many values the masked vector holds.

    Returns
    -------
    np.ndarray
        ``uint64``, shape ``(2 * n_values,)``.
    """
    return keystream(seed, WORDS_PER_VALUE * n_values)


def add_pair_mask(words: np.ndarray, me: int, peer: int, seed: bytes) -> None:
    """Add, in place and modulo 2^64, what ``me`` puts into its words for its pair with ``peer``.

    The pair's mask with ``+`` if ``me < peer``, ``-`` otherwise, so the two cancel in a sum.
    The mask is the pair's keystream, ``words.size`` words long (:func:`pair_mask` for two-limb
    values), whatever the words encode.

    Parameters
    ----------
    words : np.ndarray
        ``uint64`` fixed-point words (changed in place).
    me, peer : int
        The two clients' indices.
    seed : bytes
        The pair's mask seed.
    """
    mask(words, me, {peer: seed})


def mask(words: np.ndarray, me: int, seeds: Mapping[int, bytes]) -> np.ndarray:
    """``words`` plus, modulo 2^64, the signed masks of every pair of ``me`` (in place).

    The keystreams are generated chunk by chunk into one reused buffer and added while the
    chunk is in cache: the same words as :func:`keystream` (block ``i`` of a pair's stream does
    not depend on where a chunk starts), without a fresh stream-sized array per peer.

    Parameters
    ----------
    words : np.ndarray
        ``uint64`` fixed-point words (:func:`to_fixed`), contiguous, changed in place.
    me : int
        This client's index.
    seeds : mapping of int to bytes
        ``{peer: mask seed}`` for every peer of this round.

    Returns
    -------
    np.ndarray
        ``words`` (the same array).

    Examples
    --------
    >>> w = mask(np.zeros(3, dtype=np.uint64), 0, {1: bytes(32)})
    >>> bool((w == keystream(bytes(32), 3)).all())
    True
    """
    if words.dtype != np.uint64 or not words.flags.c_contiguous:
        raise InvalidArgumentError("words", "expected contiguous uint64 words")
    for peer, seed in seeds.items():
        if peer == me:
            raise InvalidArgumentError("peer", f"a client has no pair with itself ({me})")
        _stream_key(seed)  # refused by name before anything is written
    from .prg import chunk_buffer

    chunk = min(CHUNK_BYTES // 8, max(1, words.size))
    shared = chunk_buffer(chunk)
    for peer in sorted(seeds):
        op = np.add if me < peer else np.subtract
        for start, stream in keystream_chunks(
            seeds[peer], words.size, chunk_words=chunk, buffer=shared
        ):
            part = words[start : start + stream.size]
            op(part, stream, out=part)
    return words


def mask_fixed(
    values: np.ndarray,
    n_summands: int,
    me: int,
    seeds: Mapping[int, bytes],
    *,
    words: int = WORDS_PER_VALUE,
    argument: str = "values",
    overwrite: bool = False,
) -> np.ndarray:
    """``mask(to_fixed(values, ...), me, seeds)`` in one pass, chunk by chunk: the same words.

    Each chunk of ``values`` is turned into fixed point and every peer's keystream for it is
    added while the chunk is in cache, with no vector-sized temporary. Values out of range (or
    not finite) are refused before anything is written, as by :func:`to_fixed`.

    Parameters
    ----------
    values : np.ndarray
        Finite float64 values (flattened).
    n_summands : int
        How many such vectors will be summed (the range check).
    me : int
        This client's index.
    seeds : mapping of int to bytes
        ``{peer: mask seed}`` for every peer of this round (empty: :func:`to_fixed` alone).
    words : {1, 2}
        Words per value.
    argument : str
        The name a refusal uses.
    overwrite : bool
        With one word per value, write the words over ``values`` (contiguous float64 the caller
        gives up; it holds the words, read as float64, afterwards). No allocation then.

    Returns
    -------
    np.ndarray
        ``uint64``, ``words * values.size`` words.

    Examples
    --------
    >>> x, seeds = np.array([0.5, -2.0, 1e-3]), {1: bytes(32), 4: bytes([1]) * 32}
    >>> want = mask(to_fixed(x, 3, words=1), 2, seeds)
    >>> bool((mask_fixed(x, 3, 2, seeds, words=1) == want).all())
    True
    """
    w = _words(words)
    flat = np.asarray(values, dtype=np.float64)
    in_place = overwrite and w == 1 and flat.flags.c_contiguous and flat.flags.writeable
    flat = flat.reshape(-1) if in_place else np.ascontiguousarray(flat).reshape(-1)
    for peer, seed in seeds.items():
        if peer == me:
            raise InvalidArgumentError("peer", f"a client has no pair with itself ({me})")
        _stream_key(seed)  # refused by name before anything is written
    limit = fixed_point_limit(n_summands, words=w)
    worst = max(float(np.max(flat)), -float(np.min(flat))) if flat.size else 0.0
    if not np.isfinite(worst) or worst >= limit:
        raise FixedPointRangeError(
            argument,
            f"max |{argument}| = {worst:.3g} exceeds the fixed-point range "
            f"{limit:.3g} for {n_summands} summands"
            + (" in one 64-bit word (two words per value allow more)" if w == 1 else ""),
        )
    n = flat.size
    out = flat.view(np.uint64) if in_place else np.empty(w * n, dtype=np.uint64)
    chunk = max(1, CHUNK_BYTES // (8 * w))
    scratch = np.empty(min(chunk, n))
    high = np.empty(min(chunk, n)) if w == 2 else scratch
    from .prg import chunk_buffer

    shared = chunk_buffer(min(w * chunk, max(1, w * n)))  # every peer's chunk, in turn
    streams = [
        (
            np.add if me < peer else np.subtract,
            keystream_chunks(seeds[peer], w * n, chunk_words=w * chunk, buffer=shared),
        )
        for peer in sorted(seeds)
    ]
    for start in range(0, n, chunk):
        part = flat[start : start + chunk]
        size = part.size
        s, h = scratch[:size], high[:size]
        target = out[w * start : w * (start + size)]
        if w == 1:  # as to_fixed: rint(x 2^F) as int64 (the cast of an integral float: exact)
            np.multiply(part, 2.0**ONE_LIMB_BITS, out=s)
            np.rint(s, out=target.view(np.int64), casting="unsafe")
        else:  # as to_fixed: high = floor(x 2^20), low = round((x 2^20 - high) 2^40)
            np.multiply(part, 2.0**HIGH_BITS, out=s)
            np.floor(s, out=h)
            np.subtract(s, h, out=s)
            np.multiply(s, 2.0**LOW_BITS, out=s)
            np.round(s, out=s)
            pairs = target.view(np.int64).reshape(size, 2)
            pairs[:, 0] = h
            pairs[:, 1] = s
        for op, chunks in streams:
            _, stream = next(chunks)
            op(target, stream, out=target)
    return out


def sum_words(masked: Sequence[np.ndarray]) -> np.ndarray:
    """The sum modulo 2^64 of masked word vectors (what the aggregator computes).

    Parameters
    ----------
    masked : sequence of np.ndarray
        ``uint64`` vectors of one length.

    Returns
    -------
    np.ndarray
        ``uint64``.
    """
    if not masked:
        raise InvalidArgumentError("masked", "nothing to sum")
    total = np.array(masked[0], dtype=np.uint64, copy=True)
    for words in masked[1:]:
        if words.shape != total.shape or words.dtype != np.uint64:
            raise InvalidArgumentError(
                "masked",
                f"expected uint64 words of shape {total.shape}, got {words.dtype} {words.shape}",
            )
        total += words
    return total


def recovery_mask(revealed: Iterable[Revealed], n_words: int) -> np.ndarray:
    """What the survivors' words hold of their pairs with dropped clients, to subtract.

    Parameters
    ----------
    revealed : iterable of (int, int, bytes)
        ``(survivor, dropped, mask seed)`` for every pair between a survivor and a client that
        dropped out after the key agreement.
    n_words : int
        Length of the masked vectors.

    Returns
    -------
    np.ndarray
        ``uint64``, shape ``(n_words,)``.
    """
    correction = np.zeros(n_words, dtype=np.uint64)
    for survivor, dropped, seed in revealed:
        add_pair_mask(correction, survivor, dropped, seed)
    return correction


def unmask(total: np.ndarray, revealed: Iterable[Revealed] = ()) -> np.ndarray:
    """The float sum from the aggregator's masked sum and the seeds revealed for dropouts.

    Parameters
    ----------
    total : np.ndarray
        :func:`sum_words` of the contributors' masked words.
    revealed : iterable of (int, int, bytes)
        ``(survivor, dropped, mask seed)`` for every pair between a contributor and a client
        that advertised a key but did not contribute (:func:`recovery_mask`).

    Returns
    -------
    np.ndarray
        float64, one value per two words.
    """
    return from_fixed(total - recovery_mask(revealed, total.size))


def reveal_requests(
    dropped: Sequence[int], neighbours: Mapping[int, Iterable[int]], contributors: Container[int]
) -> dict[int, list[int]]:
    """Which contributor must reveal its pair seeds with which dropped clients (step 4).

    Parameters
    ----------
    dropped : sequence of int
        Clients that advertised a key but did not contribute.
    neighbours : mapping of int to iterable of int
        Each client's peers (every other member for a complete graph).
    contributors : container of int
        The clients whose masked vectors are in the sum.

    Returns
    -------
    dict of int to list of int
        ``{survivor: [dropped peers]}``.

    Examples
    --------
    >>> reveal_requests([2], {0: [1, 2], 1: [0, 2], 2: [0, 1]}, {0, 1})
    {0: [2], 1: [2]}
    """
    asked: dict[int, list[int]] = {}
    for d in dropped:
        for v in neighbours[d]:
            if v in contributors:
                asked.setdefault(v, []).append(d)
    return asked


def revealed_pairs(
    dropped: Sequence[int],
    neighbours: Mapping[int, Iterable[int]],
    contributors: Container[int],
    seeds: Mapping[int, Mapping[int, S]],
) -> list[tuple[int, int, S]]:
    """``(survivor, dropped, seed)`` for every pair to recover, in a fixed order.

    Parameters
    ----------
    dropped, neighbours, contributors
        As in :func:`reveal_requests`.
    seeds : mapping
        ``seeds[survivor][dropped]``: what each survivor revealed (a seed, or seeds by purpose).

    Returns
    -------
    list of tuple
        In the order of ``dropped`` then ``neighbours`` (so every engine sums identically).
    """
    return [(v, d, seeds[v][d]) for d in dropped for v in neighbours[d] if v in contributors]


@dataclass
class SecureSumClient:
    """One client's part in one round of a secure sum (steps 1, 3 and the reveal of step 4).

    Parameters
    ----------
    index : int
        The client's index.
    round_t : int
        The round.
    private_bytes : bytes, optional
        The private key (reproducible simulations, or a node restoring its key); OS entropy by
        default.
    label : str
        HKDF label (:class:`KeyAgreement`).
    """

    index: int
    round_t: int
    private_bytes: bytes | None = field(default=None, repr=False)
    label: str = DEFAULT_LABEL

    def __post_init__(self) -> None:
        self.agreement = KeyAgreement(self.index, self.round_t, self.private_bytes, self.label)

    @property
    def public_bytes(self) -> bytes:
        """The public key to advertise."""
        return self.agreement.public_bytes

    def seeds(self, peers: Iterable[int], publics: Mapping[int, bytes]) -> dict[int, bytes]:
        """The mask seeds with ``peers``.

        Parameters
        ----------
        peers : iterable of int
            Other clients of the round.
        publics : mapping of int to bytes
            Every client's public key.

        Returns
        -------
        dict of int to bytes
            ``{peer: seed}``.
        """
        out = {}
        for v in peers:
            if v == self.index:
                continue
            if v not in publics:
                raise InvalidArgumentError("publics", f"no public key for client {v}")
            out[v] = self.agreement.pair_seed(v, publics[v], MASK)
        return out

    def mask(
        self,
        values: np.ndarray,
        publics: Mapping[int, bytes],
        *,
        n_summands: int,
        argument: str = "values",
    ) -> np.ndarray:
        """This client's masked upload: fixed point of ``values`` plus a mask per peer.

        Parameters
        ----------
        values : np.ndarray
            What this client contributes to the sum (float64, any shape, flattened).
        publics : mapping of int to bytes
            The public key of every client of the round (its own included or not); every other
            client listed is a peer.
        n_summands : int
            How many clients the sum may have (the fixed-point range check).
        argument : str
            The name a refusal (non-finite or out-of-range values) uses.

        Returns
        -------
        np.ndarray
            ``uint64``, two words per value.
        """
        words = to_fixed(values, n_summands, argument=argument)
        return mask(words, self.index, self.seeds(publics, publics))

    def reveal(self, dropped: Iterable[int], publics: Mapping[int, bytes]) -> dict[int, bytes]:
        """The mask seeds with clients that dropped out (and only those), for the aggregator.

        Parameters
        ----------
        dropped : iterable of int
            Clients that advertised a key and did not contribute.
        publics : mapping of int to bytes
            Their public keys.

        Returns
        -------
        dict of int to bytes
            ``{dropped client: seed}``.
        """
        return self.seeds(dropped, publics)
