"""Decoding is exact to floating-point tolerance, round by round (seed 002, Proposition 1)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import immerse
from immersion.testing import assert_close_to_plain, random_contractive_system, run_side_by_side


@settings(max_examples=25)
@given(
    n_state=st.integers(1, 8),
    n_input=st.integers(1, 4),
    n_output=st.integers(1, 4),
    extra_state=st.integers(1, 3),
    extra_input=st.integers(1, 3),
    extra_output=st.integers(1, 3),
    keys=st.sampled_from(["dense", "block"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_decoded_run_equals_plain_for_random_nonlinear_systems(
    n_state, n_input, n_output, extra_state, extra_input, extra_output, keys, seed
):
    f, g = random_contractive_system(n_state, n_input, n_output, seed=seed)
    imm = immerse(
        f,
        g,
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
        keys=keys,
        block_size=3,
        rng=seed,
    )
    inputs = np.random.default_rng(seed).standard_normal((100, n_input))
    run = run_side_by_side(imm, f, g, x0=np.full(n_state, 0.3), inputs=inputs)
    assert_close_to_plain(run, rtol=1e-9)
    assert run.max_output_error <= imm.report().decode_error_estimate


def test_two_time_scales_cloud_iterates_on_one_encoded_input(contractive_system):
    """Corollary 1: the cloud calls step T times on one y~; decoding is unchanged."""
    f, g = contractive_system
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, rng=1)
    for k in range(5):  # five user samples, each iterated T = 20 times in the cloud
        y = np.array([np.cos(k)])
        yt = imm.encode_input(y)
        if k == 0:
            x, xt = np.array([0.2, -0.1, 0.4]), imm.encode_state(np.array([0.2, -0.1, 0.4]))
        for _ in range(20):
            x, xt = f(x, y), imm.target.step(xt, yt)
            np.testing.assert_allclose(imm.decode_state(xt), x, rtol=0, atol=1e-9)
        u = imm.decode_output(imm.target.output(xt, yt), yt)
        np.testing.assert_allclose(u, g(x, y), rtol=0, atol=1e-9)


def test_public_signal_w_is_passed_unencoded():
    def f(x, y, w):
        return 0.5 * x + y * w[0]

    def g(x, y, w):
        return x + w

    imm = immerse(f, g, n_state=2, n_input=2, n_output=2, n_public=2, rng=3)
    x, xt = np.ones(2), imm.encode_state(np.ones(2))
    for k in range(30):
        y, w = np.array([np.sin(k), 1.0]), np.array([0.3 * k, -1.0])
        yt = imm.encode_input(y)
        np.testing.assert_allclose(
            imm.decode_output(imm.target.output(xt, yt, w), yt), g(x, y, w), atol=1e-9
        )
        x, xt = f(x, y, w), imm.target.step(xt, yt, w)
    np.testing.assert_allclose(imm.decode_state(xt), x, atol=1e-9)


def test_encode_input_draws_fresh_noise_every_call(contractive_system):
    f, g = contractive_system
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, rng=0)
    y = np.array([0.7])
    a, b = imm.encode_input(y), imm.encode_input(y)
    assert not np.allclose(a, b)
    np.testing.assert_allclose(imm.keys.Pi1_left @ a, y, atol=1e-9)
    np.testing.assert_allclose(imm.keys.Pi1_left @ b, y, atol=1e-9)


def test_batched_encoding_decodes_row_by_row(contractive_system):
    f, g = contractive_system
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, keys="block", block_size=2, rng=0)
    ys = np.linspace(-1, 1, 12).reshape(4, 3, 1)
    encoded = imm.encode_input(ys)
    assert encoded.shape == (4, 3, 3)
    np.testing.assert_allclose(encoded @ imm.keys.Pi1_left.T, ys, atol=1e-9)


def test_gaussian_noise_is_exact_too(contractive_system):
    f, g = contractive_system
    imm = immerse(
        f,
        g,
        n_state=3,
        n_input=1,
        n_output=1,
        noise="gaussian",
        delta_input=1e-5,
        delta_output=1e-5,
        rng=5,
    )
    run = run_side_by_side(
        imm, f, g, x0=np.zeros(3), inputs=np.random.default_rng(0).standard_normal((100, 1))
    )
    assert_close_to_plain(run, rtol=1e-9)


def test_same_seed_gives_same_keys_and_noise(contractive_system):
    f, g = contractive_system
    a = immerse(f, g, n_state=3, n_input=1, n_output=1, rng=11)
    b = immerse(f, g, n_state=3, n_input=1, n_output=1, rng=11)
    assert a.keys.fingerprint == b.keys.fingerprint
    np.testing.assert_array_equal(a.encode_input(np.array([1.0])), b.encode_input(np.array([1.0])))
    c = immerse(f, g, n_state=3, n_input=1, n_output=1, secure=True)
    assert c.keys.fingerprint != a.keys.fingerprint


def test_advance_equals_output_then_step(contractive_system):
    f, g = contractive_system
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, rng=2)
    xt, yt = imm.encode_state(np.array([0.1, 0.2, 0.3])), imm.encode_input(np.array([0.4]))
    ut, xt_next = imm.target.advance(xt, yt)
    np.testing.assert_array_equal(ut, imm.target.output(xt, yt))
    np.testing.assert_array_equal(xt_next, imm.target.step(xt, yt))
