"""The audit's attacks against the LWE coding fail; the uplink words are indistinguishable from
uniform; and both tests are able to fail (controls on words without the RLWE mask)."""

from __future__ import annotations

import numpy as np
import pytest
from immersion.audit.lwe import run_known_plaintext, run_subspace
from immersion.audit.runner import run_audit
from immersion.lwe import encrypt_controller
from immersion.lwe.examples import lqg_loop
from immersion.lwe.rlwe import expand_uniform


def test_subspace_attack_fails_on_lwe_and_works_without_the_mask():
    (row,) = run_subspace(quick=True, seed=3)
    assert row.scheme == "lwe" and row.verdict == "resists"
    assert row.value < 0.25 and row.detail["control_without_mask"] > 0.99


def test_known_plaintext_attack_fails_on_lwe_and_works_in_a_toy_ring():
    (row,) = run_known_plaintext(quick=True, seed=4)
    assert row.verdict == "resists" and row.value > 0.9 and row.baseline == pytest.approx(1.0)
    assert row.detail["control_without_mask"] < 1e-3
    toy = row.detail["toy_ring_key_search"]
    assert toy["key_found"] and toy["decode_error_with_found_key"] < 1e-2


def test_audit_lists_the_lwe_rows():
    result = run_audit(scheme="lwe", attack="subspace", quick=True)
    assert [(r["attack"], r["scheme"], r["verdict"]) for r in result["attacks"]] == [
        ("subspace", "lwe", "resists")
    ]


def _words(message: float, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uplink residues (first prime, coefficient 0: the slot of y) for y_k = message (-1)^k, and
    the same with the mask a s removed, modulo t (the control)."""
    loop = lqg_loop(2)
    ctrl = encrypt_controller(  # open loop: a wide output range keeps u inside it
        loop.controller, input_range=loop.input_range, output_range=100.0, rng=seed
    )
    ring, key, t = ctrl._key.ring, ctrl._key, ctrl.design.plaintext_modulus
    xt = ctrl.encode_state()
    words, plain = np.empty(samples), np.empty(samples)
    for k in range(samples):
        yt = ctrl.encode_input([message * (-1) ** k])
        ut, xt = ctrl.target.advance(xt, yt)
        ctrl.decode_output(ut, yt)
        b = yt[4:].reshape(ring.n_primes, ring.degree).astype(np.uint64)
        words[k] = ring.intt(b)[0, 0] / ring.primes[0]
        a = expand_uniform(ring, yt[:4].tobytes(), ctrl.design.prg)
        phase = ring.crt(ring.intt(ring.add(b, ring.mul(a, key.s)))[:, :1])[0]
        plain[k] = (phase % t) / t  # m mod t: y on the grid
    return words, plain


def test_ciphertext_words_are_indistinguishable():
    """Words for y = 0 and for y = +-0.9 of the range: uniform on [0, 1) by a Kolmogorov-Smirnov
    test and alike (two-sample test); without the mask they are not (the test can fail)."""
    from scipy.stats import ks_2samp, kstest

    samples = 1500
    edge = 0.9 * lqg_loop(2).input_range
    zero, zero_plain = _words(0.0, samples, seed=1)
    high, high_plain = _words(edge, samples, seed=2)
    for words in (zero, high):
        assert kstest(words, "uniform").pvalue > 1e-3
    assert ks_2samp(zero, high).pvalue > 1e-3
    assert kstest(high_plain, "uniform").pvalue < 1e-6
    assert ks_2samp(zero_plain, high_plain).pvalue < 1e-6
