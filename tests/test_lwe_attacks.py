"""The audit's attacks against the LWE coding fail; the ciphertext words are indistinguishable
from uniform; and both tests are able to fail (controls on words without the LWE mask)."""

from __future__ import annotations

import numpy as np
import pytest
from immersion.audit import run_audit
from immersion.lwe import encrypt_controller
from immersion.lwe.attacks import run_known_plaintext, run_subspace
from immersion.lwe.examples import lqg_loop
from immersion.lwe.keys import public_vectors
from immersion.lwe.target import HEADER


def test_subspace_attack_fails_on_lwe_and_works_without_the_mask():
    (row,) = run_subspace(quick=True, seed=3)
    assert row.scheme == "lwe" and row.verdict == "resists"
    assert row.value < 0.25 and row.detail["control_without_mask"] > 0.99


def test_known_plaintext_attack_fails_on_lwe_and_works_at_a_toy_dimension():
    (row,) = run_known_plaintext(quick=True, seed=4)
    assert row.verdict == "resists" and row.value > 0.9 and row.baseline == pytest.approx(1.0)
    assert row.detail["control_without_mask"] < 1e-3
    toy = row.detail["toy_dimension_key_search"]
    assert toy["key_found"] and toy["decode_error_with_found_key"] < 1e-3


def test_audit_lists_the_lwe_rows():
    result = run_audit(scheme="lwe", attack="subspace", quick=True)
    assert [(r["attack"], r["scheme"], r["verdict"]) for r in result["attacks"]] == [
        ("subspace", "lwe", "resists")
    ]


def _words(message: float, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uplink words for y_k = message (-1)^k (the u fed back is the controller's own), and the
    same words without the mask <a, s> (the control)."""
    loop = lqg_loop(2)
    imm = encrypt_controller(  # open loop: a wide output range keeps u inside it
        loop.controller, input_range=loop.input_range, output_range=100.0, rng=seed
    )
    xt = imm.encode_state()
    words = np.empty((samples, 2), dtype=np.uint64)
    for k in range(samples):
        yt = imm.encode_input([message * (-1) ** k])
        ut, xt = imm.target.advance(xt, yt)
        imm.decode_output(ut, yt)
        words[k] = yt[HEADER:]
    a = public_vectors(xt[:2].astype("<u8").tobytes(), 0, 2 * samples, 4096, imm.prg)
    masks = np.einsum("cn,n->c", a, imm._key.secret.astype(np.int64).view(np.uint64))
    return words, words - masks.reshape(samples, 2)


def _bits(words: np.ndarray) -> np.ndarray:
    return (words[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)


def _advantage(first: np.ndarray, second: np.ndarray) -> float:
    """The best of 128 simple distinguishers: one bit of the word, or ``|signed word| < 2^j``.

    Advantage: ``|P(test | first) - P(test | second)|``, maximised over the tests.
    """
    bits = np.abs(_bits(first).mean(axis=0) - _bits(second).mean(axis=0)).max()

    def size(w: np.ndarray) -> np.ndarray:
        return np.abs(w.view(np.int64).astype(np.float64))[:, None] < 2.0 ** np.arange(64)

    return float(max(bits, np.abs(size(first).mean(axis=0) - size(second).mean(axis=0)).max()))


def test_ciphertext_words_are_indistinguishable():
    """Words for y = 0 and for y = +-0.9 of the range: uniform bits, same law, no distinguisher.

    Bit-wise: each of the 64 bits of 3,000 words is 1 with frequency 1/2 within 4.5 standard
    errors (0.041); a Kolmogorov-Smirnov test against uniform passes; the best one-bit
    distinguisher (one bit, or a size threshold) has advantage below 0.07 (about 4 standard
    errors).
    The same checks on the unmasked words fail (the test can fail).
    """
    from scipy.stats import kstest

    samples = 3000
    edge = 0.9 * lqg_loop(2).input_range
    zero, zero_plain = _words(0.0, samples, seed=1)
    high, high_plain = _words(edge, samples, seed=2)
    for words in (zero[:, 0], high[:, 0], zero[:, 1], high[:, 1]):
        assert np.abs(_bits(words).mean(axis=0) - 0.5).max() < 4.5 * 0.5 / np.sqrt(samples)
        assert kstest(words.astype(np.float64) / 2.0**64, "uniform").pvalue > 1e-3
    assert _advantage(zero[:, 0], high[:, 0]) < 0.07
    # controls: without the mask the words are far from uniform and y is read off a high bit
    assert kstest(zero_plain[:, 0].astype(np.float64) / 2.0**64, "uniform").pvalue < 1e-6
    assert _advantage(zero_plain[:, 0], high_plain[:, 0]) > 0.9
