"""Per-element DP numbers (seed 002 Theorem 1, seed 000 Theorem 2), composition and precision."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import PrecisionError, immerse
from immersion.privacy import (
    compose_laplace,
    gaussian_epsilon,
    gaussian_min_sigma_bar,
    laplace_epsilon,
    predict_decode_error,
)
from immersion.testing import random_contractive_system, run_side_by_side


def _identity_system(n):
    return (lambda x, y: 0.5 * x + 0.5 * y), (lambda x, y: x + y)


def test_paper_setting_reproduces_theorem_1_numbers():
    """seed 002: ||Pi1^i||_1 = 1e-4, ||N1^i||_2 = 1e4, sigma = 1e4, Delta = 1 -> eps = 1e-12."""
    assert laplace_epsilon(np.array([1e-4]), np.array([1e4]), 1e4)[0] == pytest.approx(1e-12)


def test_gaussian_closed_form_matches_seed000_checked_values():
    """seed000 notes section 9: sigma_bar >= 1.42e8 at eps = 1e-11, delta = 1e-5, s = 0.33e-3."""
    s = np.array([1e-3 * 0.33])
    bar = gaussian_min_sigma_bar(s, 1e-11, 1e-5)[0]
    assert bar == pytest.approx(1.4075e8, rel=1e-3)
    assert gaussian_epsilon(s, np.array([bar]), 1e-5)[0] == pytest.approx(1e-11, rel=1e-9)


@settings(max_examples=20)
@given(
    n=st.integers(1, 6),
    m=st.integers(1, 4),
    eps_in=st.floats(1e-4, 1.0),
    eps_out=st.floats(1e-4, 1.0),
    noise=st.sampled_from(["laplace", "gaussian"]),
    kind=st.sampled_from(["dense", "block"]),
    seed=st.integers(0, 10**6),
)
def test_report_epsilon_equals_epsilon_recomputed_from_keys(
    n, m, eps_in, eps_out, noise, kind, seed
):
    f, g = _identity_system(n)
    imm = immerse(
        f,
        g,
        n_state=n,
        n_input=n,
        n_output=n,
        extra_input=m,
        extra_output=m,
        epsilon_input=eps_in,
        epsilon_output=eps_out,
        noise=noise,
        keys=kind,
        block_size=2,
        tolerance=None,
        rng=seed,
    )
    k, r = imm.keys, imm.report()
    sigma = k.noise_scale
    if noise == "laplace":
        e_in = np.abs(k.Pi1).sum(1) / (np.linalg.norm(k.N1, axis=1) * sigma)
        e_out = np.abs(k.Pi3).sum(1) / (np.linalg.norm(k.Pi4 @ k.N1, axis=1) * sigma)
        proven_in = np.abs(k.Pi1).sum(1) / (np.abs(k.N1).max(1) * sigma)
        assert r.epsilon_input_proven == pytest.approx(proven_in.max(), rel=1e-9)
        assert r.epsilon_input_proven >= r.epsilon_input * (1 - 1e-12)
    else:
        e_in = gaussian_epsilon(
            np.linalg.norm(k.Pi1, axis=1), np.linalg.norm(k.N1, axis=1) * sigma, 1e-5
        )
        e_out = gaussian_epsilon(
            np.linalg.norm(k.Pi3, axis=1), np.linalg.norm(k.Pi4 @ k.N1, axis=1) * sigma, 1e-5
        )
    assert r.epsilon_input == pytest.approx(e_in.max(), rel=1e-9)
    assert r.epsilon_output == pytest.approx(e_out.max(), rel=1e-9)
    # the design meets each target exactly at the worst element
    assert r.epsilon_input == pytest.approx(eps_in, rel=1e-9)
    assert r.epsilon_output == pytest.approx(eps_out, rel=1e-9)


def test_user_mask_with_data_term_is_counted_and_targets_still_met():
    from immersion import Keys

    rng = np.random.default_rng(0)
    keys = Keys.from_matrices(
        Pi1=rng.standard_normal((3, 1)),
        Pi2=rng.standard_normal((2, 1)),
        Pi3=rng.standard_normal((3, 1)),
        Pi4=rng.standard_normal((3, 3)),
    )
    imm = immerse(
        lambda x, y: 0.5 * x + y,
        lambda x, y: x,
        n_state=1,
        n_input=1,
        n_output=1,
        keys=keys,
        epsilon_input=1e-2,
        epsilon_output=1e-2,
        rng=0,
    )
    r = imm.report()
    assert r.epsilon_input <= 1e-2 * (1 + 1e-9) and r.epsilon_output <= 1e-2 * (1 + 1e-9)
    k = imm.keys
    sens = np.abs(k.Pi3).sum(1) + np.abs(k.Pi4 @ k.Pi1).sum(1)
    assert r.epsilon_output == pytest.approx(
        (sens / (np.linalg.norm(k.Pi4 @ k.N1, axis=1) * k.noise_scale)).max()
    )


def test_composition_over_steps_is_between_one_step_and_basic_composition():
    f, g = _identity_system(1)
    r = immerse(f, g, n_state=1, n_input=1, n_output=1, rng=0).report()
    c = r.composed(1000, delta=1e-6)
    assert r.epsilon_input < c["epsilon_input"] < 1000 * r.epsilon_input
    assert compose_laplace(0.5, 1, 0.0) == 0.5
    rg = immerse(f, g, n_state=1, n_input=1, n_output=1, noise="gaussian", rng=0).report()
    cg = rg.composed(100, delta=1e-5)
    assert cg["epsilon_input"] > rg.epsilon_input


@pytest.mark.parametrize("epsilon", [1e-1, 1e-3, 1e-5, 1e-7])
@pytest.mark.parametrize("kind", ["dense", "block"])
def test_measured_decode_error_stays_below_prediction(epsilon, kind):
    """The precision model (seed002 notes section 5) bounds the measured error, within 1000x."""
    n = 6
    f, g = random_contractive_system(n, 2, 2, seed=1)
    imm = immerse(
        f,
        g,
        n_state=n,
        n_input=2,
        n_output=2,
        extra_input=3,
        extra_output=3,
        epsilon_input=epsilon,
        epsilon_output=epsilon,
        keys=kind,
        block_size=3,
        tolerance=None,
        rng=7,
    )
    run = run_side_by_side(
        imm, f, g, x0=np.zeros(n), inputs=np.random.default_rng(0).standard_normal((300, 2))
    )
    bound = imm.report().decode_error_bound
    assert run.max_output_error <= bound
    assert bound <= 1000 * max(run.max_output_error, 1e-16 * imm.report().max_encoded_input_entry)


def test_error_times_epsilon_is_roughly_constant_in_float64():
    """seed002 notes: eps x decode error ~ 1e-14 or worse in float64 for unit-scale data."""
    f, g = _identity_system(1)
    products = []
    for eps in (1e-2, 1e-4, 1e-6):
        imm = immerse(
            f, g, n_state=1, n_input=1, n_output=1, epsilon_input=eps, epsilon_output=eps, rng=0
        )
        products.append(eps * predict_decode_error(imm.keys, 2.0**-53).decode_error_bound)
    assert max(products) / min(products) < 1.5
    assert 1e-15 < products[0] < 1e-11


def test_unreachable_tolerance_is_refused_with_the_smallest_feasible_epsilon():
    f, g = _identity_system(2)
    with pytest.raises(PrecisionError) as info:
        immerse(
            f, g, n_state=2, n_input=2, n_output=2, epsilon_input=1e-12, epsilon_output=1e-12, rng=0
        )
    err = info.value
    assert "smallest feasible" in str(err)
    assert err.smallest_feasible_epsilon_input > 1e-12
    ok = immerse(
        f,
        g,
        n_state=2,
        n_input=2,
        n_output=2,
        epsilon_input=err.smallest_feasible_epsilon_input,
        epsilon_output=err.smallest_feasible_epsilon_output,
        rng=0,
    )
    assert ok.report().decode_error_bound <= 1e-6


def test_float32_default_epsilon_is_refused_at_default_tolerance():
    pytest.importorskip("torch")
    f, g = _identity_system(1)
    with pytest.raises(PrecisionError, match="float32"):
        immerse(f, g, n_state=1, n_input=1, n_output=1, backend="torch", dtype="float32", rng=0)


@pytest.mark.parametrize(
    "n,n_in,n_out,extra,kind",
    [(50, 40, 30, 10, "block"), (100, 300, 50, 3, "dense"), (200, 100, 100, 20, "block")],
)
def test_prediction_accounts_for_the_gain_of_f_and_g(n, n_in, n_out, extra, kind):
    """Wide inputs amplify decoding errors through f and g; the estimated input gain covers it."""
    f, g = random_contractive_system(n, n_in, n_out, seed=1)
    imm = immerse(
        f,
        g,
        n_state=n,
        n_input=n_in,
        n_output=n_out,
        extra_input=extra,
        extra_output=extra,
        keys=kind,
        rng=1,
        tolerance=None,
    )
    run = run_side_by_side(
        imm, f, g, x0=np.zeros(n), inputs=np.random.default_rng(1).standard_normal((60, n_in))
    )
    assert imm.report().input_gain > 10
    assert max(run.max_output_error, run.max_state_error) <= imm.report().decode_error_bound
