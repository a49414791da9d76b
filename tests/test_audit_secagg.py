"""Audit of seed 001's summation: Flower SecAgg+'s 2^28 mask seeds against the core secure sum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr")
pytest.importorskip("torch")

from immersion.audit.runner import run_audit  # noqa: E402
from immersion_secagg.attacks import (  # noqa: E402
    SCHEMES,
    ascii_seed,
    fold32,
    mt_first_outputs,
    run_secagg_mask_seed,
)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=8))
def test_vectorised_mersenne_twister_matches_numpy(seeds):
    got = mt_first_outputs(np.array(seeds, dtype=np.uint64), 3)
    for seed, row in zip(seeds, got, strict=True):
        r = np.random.RandomState(seed)
        assert row.tolist() == r.randint(0, 2**32 - 1, 3, dtype=np.int64).tolist()


def test_flwr_folds_a_base64_key_so_seed32_has_28_bits():
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import generate_key_pairs

    folds = [
        fold32(generate_shared_key(generate_key_pairs()[0], generate_key_pairs()[1]))
        for _ in range(50)
    ]
    assert all(f & 0x80808080 == 0 for f in folds)
    assert fold32(bytes(range(8))) == 0x03020100 ^ 0x07060504
    index = np.arange(2**28, step=2**20 - 1)
    assert (ascii_seed(index) & 0x80808080 == 0).all() and len(set(ascii_seed(index))) == index.size


@pytest.fixture(scope="module")
def rows():
    return run_secagg_mask_seed(quick=True, seed=0)


def test_secagg_plus_masks_are_searched_and_the_update_recovered(rows):
    plain = [r for r in rows if r.mitigation is None]
    assert sorted(r.scheme for r in plain) == sorted(SCHEMES)
    for r in plain:
        assert (
            r.verdict == "leaks" and r.detail["seed_found"] and r.detail["quantized_vector_exact"]
        )
        assert r.value <= r.detail["quantisation_step"] and r.baseline > 1000 * r.value
        assert r.detail["full_search_seconds"] > 0  # measured rate, extrapolated to 2^28


def test_the_core_secure_sum_leaves_nothing_to_search(rows):
    core = [r for r in rows if r.mitigation == "core-secure-sum"]
    assert len(core) == len(SCHEMES)
    for r in core:
        assert r.verdict == "resists" and r.detail["candidates_whose_whole_mask_fits"] == 0
        assert r.value == r.baseline and r.cost


def test_the_core_secure_sum_row_carries_its_measured_cost(rows):
    for r in (r for r in rows if r.mitigation == "core-secure-sum"):
        d = r.detail
        assert d["cost_core_ms"] > 0 and d["cost_secaggplus_ms"] > 0 and d["cost_plain_us"] > 0
        assert f"{d['cost_core_ms']:.2f} ms" in r.cost and "README" not in r.cost
        assert f"{d['cost_secaggplus_ms']:.2f} ms" in r.cost
        assert d["cost_core_mean_error"] <= 2.0**-60  # two-limb fixed point: N 2^-61 on the sum
        assert 0 < d["cost_secaggplus_mean_error"] <= 2 * d["clipping_range"] / d["levels"]


def test_the_audit_covers_seed_001s_schemes():
    out = run_audit(attack="secagg-mask-seed", scheme="gd-dp", quick=True)
    assert {r["scheme"] for r in out["attacks"]} == {"gd-dp"}
    assert {r["mitigation"] for r in out["attacks"]} == {None, "core-secure-sum"}


def test_a_candidate_seed_counts_only_if_its_whole_mask_fits():
    """A full scan of 2^28 seeds passes about one false candidate per target on its first
    words; the control row must not call that a leak."""
    from immersion_secagg.attacks import LEVELS, MODULUS, _attack

    rng = np.random.default_rng(3)
    clip, n = 10.0, 200
    clipped = rng.uniform(-clip, clip, n)
    uniform = rng.integers(0, MODULUS, n + 1)  # a masked vector no ASCII seed explains
    assert _attack(uniform, [123, 456789], clipped, clip, 7.0) == (None, 7.0)
    seed = 987_654
    truth = np.concatenate([[0], np.round((clipped + clip) / (2 * clip) * LEVELS)]).astype(np.int64)
    r = np.random.RandomState(seed)
    mask = np.concatenate([r.randint(0, MODULUS - 1, 1), r.randint(0, MODULUS - 1, n)])
    found, error = _attack((truth + mask) % MODULUS, [111, seed], clipped, clip, 7.0)
    assert np.array_equal(found, truth) and error <= 2 * clip / LEVELS
