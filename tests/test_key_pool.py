"""Key periods drawn ahead (immersion.coding.key_pool): the law and design of immerse's, exact
decoding."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from immersion import NonFiniteError, PrecisionError, immerse
from immersion.coding.key_pool import DenseKeyPool, PooledImmersion, draw_dense_codes
from immersion.coding.rotation import RotatingImmersion
from immersion.coding.target import TargetAlgorithm
from immersion.privacy.bounds import exact_decode_output_errors
from immersion.remote.kinds import public_target_matrices
from scipy.stats import ks_2samp

A = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.1], [0.1, 0.0, 0.7]])


def f(x, y):
    return A @ x + 0.5 * y[0]


def g(x, y):
    return x[:1] - y


def _pool(**options):
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, keys="dense", rng=0, **options)
    return imm, DenseKeyPool(imm._design, np.random.default_rng(1))


def test_drawn_codes_have_the_algebra_proposition_1_needs():
    pi, pi_left, noise = draw_dense_codes(np.random.default_rng(2), 200, 3, 2)
    eye = np.eye(3)
    assert np.abs(pi_left @ pi - eye).max() < 1e-13
    assert np.abs(pi_left @ noise).max() < 1e-13
    # orthonormal noise columns, one of them flat: every row of N carries noise
    assert np.abs(noise.transpose(0, 2, 1) @ noise - np.eye(2)).max() < 1e-13
    assert np.allclose(np.abs(noise[..., 0]), 1 / np.sqrt(5), rtol=0, atol=1e-14)
    # Pi = a Q with a log-uniform in [1/2, 2]
    a = np.linalg.norm(pi[:, :, 0], axis=1)
    assert 0.5 <= a.min() and a.max() <= 2.0


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_pooled_keys_follow_the_law_and_design_of_immerse(noise):
    """Noise scales, mask scales and key entries: same distributions as immerse's draws."""
    imm, pool = _pool(noise=noise, epsilon_input=1e-2, epsilon_output=2e-2)
    pooled = [pool.take().keys for _ in range(400)]
    drawn = [
        immerse(f, g, 3, 1, 1, keys="dense", noise=noise, epsilon_input=1e-2, epsilon_output=2e-2,
                rng=seed).keys
        for seed in range(400)
    ]  # fmt: skip
    for stat in (
        lambda k: k.noise_scale,
        lambda k: np.abs(k.Pi4).max(),
        lambda k: np.abs(k.Pi1).sum(),
        lambda k: np.abs(k.Pi2_left).max(),
        lambda k: np.abs(k.N1).min(),
    ):
        assert ks_2samp([stat(k) for k in pooled], [stat(k) for k in drawn]).pvalue > 1e-3
    for keys in pooled[:20]:
        keys.validate()
        assert keys.noise.kind == noise and keys.kind == "dense" and keys.mask_is_generated
        assert keys.noise.mean == 0.0 and keys.noise.sensitivity_input == 1.0


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"noise": "gaussian", "delta_input": 1e-6, "epsilon_output": 0.5},
        {"noise_mean": 0.25, "sensitivity_input": 2.0},
    ],
)
def test_each_period_meets_the_epsilon_targets_and_decodes_exactly(options):
    imm, pool = _pool(**options)
    target_report = imm.report()
    for _ in range(5):
        period = pool.take()
        assert isinstance(period, PooledImmersion)
        report = period.report()
        for name in ("epsilon_input", "epsilon_output"):
            assert getattr(report, name) == pytest.approx(getattr(target_report, name), rel=1e-12)
        assert report.decode_error_estimate <= 1e-6
        x = np.array([0.2, -0.1, 0.4])
        xt = period.encode_state(x)
        for k in range(4):
            y = np.array([np.sin(k) + 0.1])
            yt = period.encode_input(y)
            ut, xt = period.target.advance(xt, yt)
            u = period.decode_output(ut, yt)
            np.testing.assert_allclose(u, g(x, y), rtol=0, atol=1e-9)
            x = f(x, y)
            bounded = period.decode_output_with_bound(ut, yt)
            assert (bounded.value == u).all()
            assert (exact_decode_output_errors(period.keys, ut, yt, u) <= bounded.error_bound).all()
        np.testing.assert_allclose(period.decode_state(xt), x, rtol=0, atol=1e-9)


def test_batched_and_bad_inputs_take_the_general_path():
    _, pool = _pool(noise_mean=0.5)
    period = pool.take()
    ys = np.linspace(-1.0, 1.0, 6)[:, None]
    yt = period.encode_input(ys)  # a batch: noise from the same stream, the keys' law
    xt = period.encode_state(np.ones(3))
    ut = np.stack([period.target.output(xt, row) for row in yt])
    np.testing.assert_allclose(period.decode_output(ut, yt), 1.0 - ys, rtol=0, atol=1e-9)
    np.testing.assert_allclose(period.encode_input([0.5]) @ period.keys.Pi1_left.T, [0.5])
    for bad in (np.nan, np.inf):
        with pytest.raises(NonFiniteError, match="y"):
            period.encode_input(np.array([bad]))
        with pytest.raises(NonFiniteError, match="encoded_state"):
            period.target.advance(np.full(4, bad), yt[0])


def test_a_period_over_the_tolerance_is_refused_when_it_is_due():
    imm, _ = _pool()
    strict_design = dataclasses.replace(imm._design.design, tolerance=1e-30)
    strict = dataclasses.replace(imm._design, design=strict_design)
    pool = DenseKeyPool(strict, np.random.default_rng(3))
    with pytest.raises(PrecisionError, match="tolerance"):
        pool.take()


def test_rotation_ships_what_a_remote_rekey_needs_and_pickles():
    rot = RotatingImmersion(f, g, 3, 1, 1, rotate_keys_every=2, keys="dense", rng=4)
    xt, fingerprints = rot.encode_state(np.zeros(3)), set()
    for k in range(4):
        _, xt = rot.step(np.array([0.1 * k]), xt)
        fingerprints.add(rot.keys.fingerprint)
    assert isinstance(rot.current, PooledImmersion) and rot.period == 2 and len(fingerprints) == 3
    # what RemoteTarget.rekey sends: the cloud built from it computes what the rotation carried
    matrices = public_target_matrices(rot.current.keys)
    t = rot.target
    remote = TargetAlgorithm.from_matrices(f=t._f, g=t._g, backend=t.backend, **matrices)
    yt = rot.encode_input(np.array([0.3]))
    for other in (remote, pickle.loads(pickle.dumps(t))):
        for a, b in zip(other.advance(xt, yt), t.advance(xt, yt), strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(other.step(xt, yt), t.advance(xt, yt)[1])
