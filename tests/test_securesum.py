"""The core secure-sum primitive: key agreement, seeds, keystream, fixed point, masks, dropouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cryptography")

from immersion import InvalidArgumentError
from immersion.securesum import protocol as securesum  # noqa: E402
from immersion.securesum.prg import chunk_buffer  # noqa: E402
from immersion.securesum.protocol import (  # noqa: E402
    KeyAgreement,
    SecureSumClient,
    from_fixed,
    keystream,
    sum_words,
    to_fixed,
    unmask,
)


def _clients(k: int, round_t: int = 0) -> list[SecureSumClient]:
    return [SecureSumClient(i, round_t, private_bytes=bytes([i + 1]) * 32) for i in range(k)]


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(2, 6),
    n=st.integers(1, 30),
    data=st.data(),
)
def test_masked_sum_equals_the_fixed_point_sum_for_any_dropouts(k, n, data):
    """Every contributor set: the unmasked sum is the sum of the contributors' fixed-point values,
    bit for bit, and within k 2^-61 (plus one rounding) of the float sum."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    values = [rng.normal(0, 10.0 ** rng.integers(-6, 6), n) for _ in range(k)]
    dropped = data.draw(st.sets(st.integers(0, k - 1), max_size=k - 1))
    clients = _clients(k)
    publics = {c.index: c.public_bytes for c in clients}
    masked = {c.index: c.mask(values[c.index], publics, n_summands=k) for c in clients}
    alive = [i for i in range(k) if i not in dropped]
    revealed = [(s, d, clients[s].reveal([d], publics)[d]) for s in alive for d in sorted(dropped)]
    got = unmask(sum_words([masked[i] for i in alive]), revealed)
    exact_words = sum_words([to_fixed(values[i], k) for i in alive])
    assert np.array_equal(got, from_fixed(exact_words))
    # the exact sum, correctly rounded (np.sum's own rounding grows with the terms, not the sum)
    plain = np.array([math.fsum(column) for column in np.stack([values[i] for i in alive]).T])
    assert np.abs(got - plain).max() <= k * 2.0**-61 + 2 * np.finfo(float).eps * np.abs(plain).max()


def test_a_masked_upload_is_unrelated_to_its_values():
    """What the aggregator sees of one client: uniform words, whatever the values (bit balance and
    no correlation with the fixed-point words); without its peers' uploads the value is lost."""
    clients = _clients(3)
    publics = {c.index: c.public_bytes for c in clients}
    values = np.linspace(-1, 1, 20_000)
    words = clients[0].mask(values, publics, n_summands=3)
    bits = np.unpackbits(words.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.005  # 1.28 M bits: 5 sigma is 0.0022
    plain_words = to_fixed(values, 3)
    high = words.view(np.int64)[0::2].astype(float)
    assert abs(np.corrcoef(high, plain_words.view(np.int64)[0::2].astype(float))[0, 1]) < 0.05
    assert np.abs(from_fixed(words) - values).max() > 1e6  # reading it as is gives noise


def test_masks_cancel_only_in_the_complete_sum():
    """Leaving a contributor out without the reveal leaves the masks: the sum is garbage."""
    clients = _clients(3)
    publics = {c.index: c.public_bytes for c in clients}
    masked = [c.mask(np.ones(4), publics, n_summands=3) for c in clients]
    assert unmask(sum_words(masked)).tolist() == [3.0] * 4
    assert np.abs(unmask(sum_words(masked[:2])) - 2.0).max() > 1e6


def test_fixed_point_round_trip_and_overflow_refusal():
    values = np.array([0.0, -1.5, 3.25e6, -7e-13, 1 / 3])
    assert np.abs(from_fixed(to_fixed(values, 4)) - values).max() <= 2.0**-61
    limit = securesum.fixed_point_limit(10)
    assert limit == 2.0**42 / 10
    to_fixed(np.array([np.nextafter(limit, 0)]), 10)
    with pytest.raises(InvalidArgumentError, match="update"):
        to_fixed(np.array([limit]), 10, argument="update")
    with pytest.raises(InvalidArgumentError, match="values"):
        to_fixed(np.array([1.0, np.nan]), 2)


def test_key_agreement_labels_purposes_rounds_and_bad_keys():
    a, b = KeyAgreement(0, 3), KeyAgreement(5, 3)
    seed = a.pair_seed(5, b.public_bytes, "mask")
    assert seed == b.pair_seed(0, a.public_bytes, "mask")
    assert seed != a.pair_seed(5, b.public_bytes, "delta")
    private = a.private_key_bytes()
    relabelled = KeyAgreement(0, 3, private, label="immersion-mpdp")
    assert relabelled.public_bytes == a.public_bytes
    assert relabelled.pair_seed(5, b.public_bytes, "mask") != seed  # labels separate uses
    assert KeyAgreement(0, 4, private).pair_seed(5, b.public_bytes, "mask") != seed  # rounds
    with pytest.raises(InvalidArgumentError, match="peer_public"):
        a.pair_seed(5, b"short", "mask")
    with pytest.raises(InvalidArgumentError, match="private_bytes"):
        KeyAgreement(0, 0, b"short")
    with pytest.raises(InvalidArgumentError, match="seed"):
        keystream(b"short", 4)
    client = _clients(2)[0]
    with pytest.raises(InvalidArgumentError, match="publics"):
        client.reveal([7], {})


def test_mpdp_uses_the_core_primitive_under_its_own_label():
    """MP-DP's seeds are the core's with label "immersion-mpdp": existing runs stay bit-identical
    (the HKDF info is unchanged), and no plugin keeps its own key agreement."""
    from immersion_mpdp import agreement

    private = bytes(range(32))
    mpdp = agreement.KeyAgreement(2, 7, private)
    core = KeyAgreement(2, 7, private, label="immersion-mpdp")
    peer = KeyAgreement(9, 7)
    assert isinstance(mpdp, KeyAgreement)
    assert mpdp.pair_seeds(9, peer.public_bytes, ("delta", "mask")) == core.pair_seeds(
        9, peer.public_bytes, ("delta", "mask")
    )
    # the HKDF info MP-DP has always used, computed independently
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PrivateKey.from_private_bytes(peer.private_key_bytes()).public_key()
    )
    info = b"immersion-mpdp/mask/round 7/pair 2-9"
    expected = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)
    assert mpdp.pair_seed(9, peer.public_bytes, "mask") == expected


def test_sum_words_refuses_mismatched_vectors():
    with pytest.raises(InvalidArgumentError, match="masked"):
        sum_words([])
    with pytest.raises(InvalidArgumentError, match="masked"):
        sum_words([np.zeros(4, np.uint64), np.zeros(6, np.uint64)])


def test_one_word_fixed_point_range_precision_and_masks():
    """One 64-bit word per value: within 2^-39 per value, the proven range 2^24 / K (refused
    beyond with FixedPointRangeError), and pairwise masks that cancel exactly in the sum of words,
    at the edge of the range included."""
    limit = securesum.fixed_point_limit(3, words=1)
    assert limit == 2.0**24 / 3
    rng = np.random.default_rng(0)
    values = [rng.uniform(-1, 1, 1000) * 50 for _ in range(3)]
    values[0][:2] = [np.nextafter(limit, 0), -np.nextafter(limit, 0)]
    values[1][:2] = values[2][:2] = values[0][:2]
    words = [to_fixed(v, 3, words=1) for v in values]
    assert words[0].size == 1000
    for v, w in zip(values, words, strict=True):
        assert np.abs(from_fixed(w, words=1) - v).max() <= 2.0**-39
    seeds = {(0, 1): bytes([7]) * 32, (0, 2): bytes([8]) * 32, (1, 2): bytes([9]) * 32}
    masked = []
    for me, w in enumerate(words):
        peers = {v: seeds[min(me, v), max(me, v)] for v in range(3) if v != me}
        masked.append(securesum.mask(w.copy(), me, peers))
    assert np.abs(from_fixed(masked[0], words=1) - values[0]).max() > 1e6  # hidden
    total = from_fixed(sum_words(masked), words=1)
    assert np.array_equal(total, from_fixed(sum_words(words), words=1))
    assert np.abs(total - sum(values)).max() <= 3 * 2.0**-39 + 1e-16 * 3 * limit
    with pytest.raises(securesum.FixedPointRangeError, match="one 64-bit word"):
        to_fixed(np.array([limit]), 3, words=1, argument="corrections")
    with pytest.raises(InvalidArgumentError, match="words"):
        to_fixed(np.ones(2), 3, words=3)


def test_chunked_mask_equals_the_keystream_across_chunk_edges(monkeypatch):
    """mask() adds the same words as keystream() for every peer, whatever the chunk size."""
    seeds = {1: bytes([3]) * 32, 4: bytes([5]) * 32}
    want = np.zeros(1001, dtype=np.uint64) - keystream(seeds[1], 1001) + keystream(seeds[4], 1001)
    for chunk_bytes in (8, 1000, 1 << 18):
        monkeypatch.setattr(securesum, "CHUNK_BYTES", chunk_bytes)
        assert np.array_equal(securesum.mask(np.zeros(1001, dtype=np.uint64), 2, seeds), want)


def test_streams_sharing_one_buffer_read_in_turn_are_each_their_own_keystream():
    """Several peers' keystreams written chunk by chunk into one shared buffer (how the masks
    avoid one allocation per peer) are, chunk by chunk, each peer's own stream; a buffer too
    small for a chunk is refused by name."""
    seeds = [bytes([s]) * 32 for s in (1, 2, 3)]
    shared = chunk_buffer(4)
    streams = [securesum.keystream_chunks(s, 10, chunk_words=4, buffer=shared) for s in seeds]
    got: list[list[np.ndarray]] = [[], [], []]
    for _ in range(3):  # chunks of 4, 4 and 2 words
        for i, stream in enumerate(streams):
            got[i].append(next(stream)[1].copy())
    for seed, parts in zip(seeds, got, strict=True):
        assert np.array_equal(np.concatenate(parts), keystream(seed, 10))
    with pytest.raises(InvalidArgumentError, match="buffer"):
        next(securesum.keystream_chunks(seeds[0], 10, chunk_words=4, buffer=bytearray(32)))


@pytest.mark.parametrize("words", [1, 2])
def test_fused_fixed_point_and_masks_equal_to_fixed_then_mask(monkeypatch, words):
    """mask_fixed gives the words of mask(to_fixed(...)) bit for bit, whatever the chunk size,
    with or without writing over its input (one word), and refuses out-of-range values by name
    before writing anything."""
    rng = np.random.default_rng(1)
    values = rng.normal(0, 100, 1001)
    values[:3] = [0.0, -0.5, np.nextafter(securesum.fixed_point_limit(4, words=words), 0)]
    seeds = {0: bytes([3]) * 32, 5: bytes([5]) * 32, 9: bytes([7]) * 32}
    want = securesum.mask(to_fixed(values, 4, words=words), 2, seeds)
    for chunk_bytes in (8, 1000, 1 << 18):
        monkeypatch.setattr(securesum, "CHUNK_BYTES", chunk_bytes)
        got = securesum.mask_fixed(values, 4, 2, seeds, words=words)
        assert np.array_equal(got, want)
        mine = values.copy()
        spent = securesum.mask_fixed(mine, 4, 2, seeds, words=words, overwrite=True)
        assert np.array_equal(spent, want)
        assert (spent.ctypes.data == mine.ctypes.data) == (words == 1)  # no copy with one word
    assert np.array_equal(
        securesum.mask_fixed(values, 4, 2, {}, words=words), to_fixed(values, 4, words=words)
    )
    bad = values.copy()
    bad[500] = np.nan
    with pytest.raises(securesum.FixedPointRangeError, match="corrections"):
        securesum.mask_fixed(bad, 4, 2, seeds, words=words, argument="corrections", overwrite=True)
    assert np.array_equal(bad[:500], values[:500])  # refused before anything was written
    with pytest.raises(InvalidArgumentError, match="peer"):
        securesum.mask_fixed(values, 4, 2, {2: bytes(32)}, words=words)


def test_hkdf_is_rfc5869_and_seeds_are_fresh_per_round_and_attempt():
    """The HMAC-based HKDF equals cryptography's for several lengths; one key pair gives the
    same seeds as a fresh key pair's of that round (attempt 0), and different seeds for every
    round and every retry, with the Diffie-Hellman exchange done once per peer."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret, info = bytes(range(32)), b"immersion-mpdp/mask/round 3/pair 1-4"
    for length in (16, 32, 40, 64, 100):
        expected = HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(
            secret
        )
        assert securesum.hkdf_expand(securesum.hkdf_extract(secret), info, length) == expected
    with pytest.raises(InvalidArgumentError, match="length"):
        securesum.hkdf_expand(bytes(32), info, 0)
    private = bytes([9]) * 32
    long_lived, peer = KeyAgreement(1, 0, private), KeyAgreement(4, 0)
    seen = set()
    for t in range(3):
        for attempt in range(2):
            seeds = long_lived.pair_seeds(
                4, peer.public_bytes, ("delta", "mask"), round_t=t, attempt=attempt
            )
            assert seeds == peer.pair_seeds(
                1, long_lived.public_bytes, ("delta", "mask"), round_t=t, attempt=attempt
            )
            if attempt == 0:  # as a key pair made for that round
                assert seeds == KeyAgreement(1, t, private).pair_seeds(
                    4, peer.public_bytes, ("delta", "mask")
                )
            seen.update(seeds.values())
    assert len(seen) == 3 * 2 * 2
    assert len(long_lived._extracted) == 1  # one exchange with that peer
