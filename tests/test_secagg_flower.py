"""Flower's SecAgg+ as seed 001's summation step: the server's sum is the exact sum up to
quantisation.

One Flower run (Ray start included, about 25 s on two cores): 4 users, 2 rounds, 12 values each.
Round 0: every user contributes, and one coordinate of user 0 lies beyond the clipping range;
round 1: user 2 drops out before sending its masked vector, and the others are still summed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from immersion_secagg.flower_secagg import (  # noqa: E402
    FixedUpdates,
    exact_sums,
    quantization_error_bound,
    secagg_sum,
)

USERS, ROUNDS, DIM, CLIP, LEVELS = 4, 2, 12, 2.0, 2**22


@pytest.fixture(scope="module")
def secagg_run():
    rng = np.random.default_rng(7)
    values = rng.uniform(-1.0, 1.0, (ROUNDS, USERS, DIM))
    values[0, 0, 3] = CLIP + 1.5  # beyond the clipping range
    updates = FixedUpdates(values)
    run = secagg_sum(
        updates,
        USERS,
        ROUNDS,
        clipping_range=CLIP,
        quantization_range=LEVELS,
        dropouts={(1, 2): "collect_masked_vectors"},
    )
    return values, updates, run


@pytest.mark.slow
def test_secagg_sum_is_the_exact_sum_within_the_quantisation_bound(secagg_run):
    values, updates, run = secagg_run
    assert run.contributors == [[0, 1, 2, 3], [0, 1, 3]]
    assert all(s is not None for s in run.sums)
    clipped = FixedUpdates(np.clip(values, -CLIP, CLIP))
    for t, (got, want) in enumerate(
        zip(run.sums, exact_sums(clipped, USERS, ROUNDS, run.contributors), strict=True)
    ):
        bound = quantization_error_bound(len(run.contributors[t]), CLIP, LEVELS)
        assert got.shape == (DIM,)
        assert np.max(np.abs(got - want)) < bound
        # the server's own output is the mean over the contributors
        assert np.allclose(
            run.server_outputs[t] * len(run.contributors[t]), got, rtol=0, atol=1e-12
        )
    # away from the clipped coordinate, the raw float64 sum is matched too; at it, the excess is
    # lost
    raw = exact_sums(updates, USERS, ROUNDS, run.contributors)
    keep = np.arange(DIM) != 3
    assert np.max(np.abs(run.sums[0][keep] - raw[0][keep])) < quantization_error_bound(
        USERS, CLIP, LEVELS
    )
    assert abs((raw[0][3] - run.sums[0][3]) - 1.5) < quantization_error_bound(USERS, CLIP, LEVELS)
    assert np.max(np.abs(run.sums[1] - raw[1])) < quantization_error_bound(3, CLIP, LEVELS)


def test_secagg_sum_rejects_settings_that_would_wrap_around():
    with pytest.raises(ValueError, match="wraps around"):
        secagg_sum(
            FixedUpdates(np.zeros((1, 3, 2))),
            3,
            1,
            quantization_range=2**31 - 1,
            modulus_range=2**32,
        )
    with pytest.raises(ValueError, match="int32"):
        secagg_sum(
            FixedUpdates(np.zeros((1, 3, 2))), 3, 1, quantization_range=2**31, modulus_range=2**40
        )


@pytest.mark.slow
def test_gd_dp_on_flower_with_secagg_trains_like_the_local_engine_up_to_quantisation():
    """noise off: the only difference between the engines is SecAgg+'s fixed-point sum."""
    from immersion_fl.runtime.engine import RunConfig, run_federated

    cfg = RunConfig.from_flat(
        dict(
            scheme="gd-dp",
            noise="off",
            model="linear",
            clients=3,
            rounds=2,
            batch_size=8,
            lr=0.5,
            secure_sum="secagg+",
        )
    )
    local, flower = run_federated(cfg), run_federated(cfg, engine="flower")
    assert flower.accuracy == local.accuracy
    assert max(abs(a - b) for a, b in zip(flower.loss, local.loss, strict=True)) < 1e-5
    assert flower.loss != local.loss  # the quantisation is there (not the same code path)


@pytest.mark.slow
def test_gd_dp_on_flower_with_the_core_secure_sum_trains_like_the_local_engine():
    """noise off: the core secure sum (the default) is within N 2^-61 of the exact sum, so the
    Flower run's model equals the in-process one to 1e-15, where SecAgg+ differs by 1e-5."""
    from immersion_fl.runtime.engine import RunConfig, run_federated

    cfg = RunConfig.from_flat(
        dict(scheme="gd-dp", noise="off", model="linear", clients=3, rounds=2, batch_size=8, lr=0.5)
    )
    local, flower = run_federated(cfg), run_federated(cfg, engine="flower")
    assert flower.accuracy == local.accuracy
    assert float((flower.final_model - local.final_model).abs().max()) < 1e-15
    assert max(flower.diff_vs_plain) < 1e-15


def test_the_secure_sum_option_is_checked_by_name():
    from immersion import InvalidArgumentError
    from immersion_fl.runtime.engine import RunConfig

    with pytest.raises(InvalidArgumentError, match="secure_sum"):
        RunConfig.from_flat(dict(scheme="gd-dp", secure_sum="plain"))
    with pytest.raises(InvalidArgumentError, match="secure_sum"):
        RunConfig.from_flat(dict(scheme="sifl-m1", secure_sum="secagg+"))
