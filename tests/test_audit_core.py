"""Eavesdropper attacks on ``immerse(f, g)`` and key rotation (issue 8; THREAT_MODEL.md eavesdropper
rows).

Each attack must succeed where the analysis says it must (seed 002 eq. 16: ``y~ = Pi1 y + N1 s``
with one key) and fail with the mitigation on; rotation must keep decoding exact round by round.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from immersion import InvalidArgumentError, immerse
from immersion.audit.eavesdropper import (
    EXTRA_INPUT,
    SCALAR,
    VECTOR,
    aligned_recovery,
    known_plaintext_attack,
    noise_dimension,
    relative_error,
    run_known_plaintext,
    subspace_attack,
)
from immersion.cli.main import main
from immersion.coding.rotation import KeyRotation, RotatingImmersion, public_target_bytes
from immersion.plugins.manager import registry
from immersion.remote.client import public_target_matrices

ROW_FIELDS = {"attack", "scheme", "metric", "value", "baseline", "verdict"}


def _stream(case, ys, *, rotate_keys_every=None, seed=0, fresh=None):
    """Encodings sent under one key (or rotating keys); with ``fresh``, extra encodings under each
    key."""
    k = len(ys) + 1 if rotate_keys_every is None else rotate_keys_every
    rot = RotatingImmersion(case.f, case.g, **case.dims(), rotate_keys_every=k, rng=seed)
    sent, extra = [], []
    for i, y in enumerate(ys):
        sent.append(rot.encode_input(y))
        if fresh is not None and (i + 1) % k == 0:
            extra.append(rot.encode_input(fresh))
        rot.tick()
    return np.array(sent), extra


# ---------------------------------------------------------------- subspace
@pytest.mark.parametrize("case", [SCALAR, VECTOR], ids=["scalar", "vector"])
def test_subspace_attack_recovers_y_under_one_key(case):
    ys = case.signal(1000, np.random.default_rng(1))
    enc, _ = _stream(case, ys, seed=2)
    found, gap = noise_dimension(enc)
    assert found == EXTRA_INPUT and gap > 1e4  # noise variance ~ 1/epsilon^2 above the signal's
    value = aligned_recovery(subspace_attack(enc), ys)  # noise dimension from the gap
    assert value > 0.99, value
    if case.n_input == 1:  # y up to scale: plain correlation of the estimate
        est = subspace_attack(enc)[:, 0]
        assert abs(np.corrcoef(est, ys[:, 0])[0, 1]) > 0.99
        best_raw = max(abs(np.corrcoef(enc[:, i], ys[:, 0])[0, 1]) for i in range(enc.shape[1]))
        assert best_raw < 0.2  # each raw coordinate is noise-dominated


@pytest.mark.parametrize("k", [1, EXTRA_INPUT])
@pytest.mark.parametrize("case", [SCALAR, VECTOR], ids=["scalar", "vector"])
def test_subspace_attack_finds_nothing_when_keys_rotate_every_k_le_extra_input(case, k):
    ys = case.signal(200, np.random.default_rng(3))
    enc, _ = _stream(case, ys, rotate_keys_every=k, seed=4)
    est = subspace_attack(enc, n_noise=EXTRA_INPUT, period=k)
    assert not est.any()  # k samples span <= extra_input directions: all "noise"
    assert aligned_recovery(est, ys, period=k) == 0.0


def test_subspace_attack_with_long_key_periods_still_gets_y_per_period():
    """Honest limit of the mitigation: with 25 samples per key, y up to a per-period scale leaks."""
    ys = SCALAR.signal(500, np.random.default_rng(5))
    enc, _ = _stream(SCALAR, ys, rotate_keys_every=25, seed=6)
    assert (
        aligned_recovery(subspace_attack(enc, n_noise=EXTRA_INPUT, period=25), ys, period=25) > 0.9
    )


# ---------------------------------------------------------------- known plaintext
@pytest.mark.parametrize("case", [SCALAR, VECTOR], ids=["scalar", "vector"])
def test_known_plaintext_decodes_exactly_with_n_tilde_pairs_and_fails_with_few(case):
    n_tot = case.n_encoded
    ys = case.signal(n_tot + 300, np.random.default_rng(7))
    enc, _ = _stream(case, ys, seed=8)
    fresh_y, fresh_enc = ys[n_tot:], enc[n_tot:]
    L = known_plaintext_attack(ys[:n_tot], enc[:n_tot])
    imm_keys = RotatingImmersion(case.f, case.g, **case.dims(), rotate_keys_every=1000, rng=8).keys
    np.testing.assert_allclose(L, imm_keys.Pi1_left, rtol=0, atol=1e-9)  # L = Pi1_left, so L N1 = 0
    assert relative_error(fresh_enc @ L.T, fresh_y) < 1e-8
    for j in range(1, EXTRA_INPUT + 1):  # pairs within the noise dimension: no decode
        L_few = known_plaintext_attack(ys[:j], enc[:j])
        assert relative_error(fresh_enc @ L_few.T, fresh_y) > 0.9
    L_short = known_plaintext_attack(ys[: n_tot - 1], enc[: n_tot - 1])
    assert relative_error(fresh_enc @ L_short.T, fresh_y) > 0.1  # one pair short: never exact


def test_known_plaintext_fails_with_rotation_every_k_below_n_tilde():
    k = SCALAR.n_encoded - 1  # 2 pairs per key, n~ = 3
    fresh = SCALAR.signal(100, np.random.default_rng(9))
    ys = SCALAR.signal(k * 20, np.random.default_rng(10))
    enc, extra = _stream(SCALAR, ys, rotate_keys_every=k, seed=11, fresh=fresh)
    errors = [
        relative_error(
            extra[p] @ known_plaintext_attack(ys[p * k : (p + 1) * k], enc[p * k : (p + 1) * k]).T,
            fresh,
        )
        for p in range(20)
    ]
    assert np.median(errors) > 0.9, errors


# ---------------------------------------------------------------- rotation
@pytest.mark.parametrize(
    ("k", "options"), [(1, {}), (3, {}), (4, {"keys": "block", "block_size": 3})]
)
def test_rotation_keeps_decoding_exact_round_by_round(contractive_system, k, options):
    f, g = contractive_system
    rot = RotatingImmersion(
        f, g, n_state=3, n_input=1, n_output=1, rotate_keys_every=k, rng=12, **options
    )
    x = np.array([0.2, -0.1, 0.4])
    xt = rot.encode_state(x)
    fingerprints = {rot.keys.fingerprint}
    for i in range(40):
        y = np.array([np.sin(0.3 * i) + 0.05 * i])
        u, xt = rot.step(y, xt)
        np.testing.assert_allclose(u, g(x, y), rtol=0, atol=1e-9)
        x = f(x, y)
        np.testing.assert_allclose(rot.decode_state(xt), x, rtol=0, atol=1e-9)
        fingerprints.add(rot.keys.fingerprint)
    assert rot.period == 40 // k and len(fingerprints) == rot.period + 1


def test_split_deployment_user_ticks_and_cloud_rekeys_in_order():
    f, g = (lambda x, y: 0.5 * x + y), (lambda x, y: 2.0 * x)
    rot = RotatingImmersion(f, g, n_state=1, n_input=1, n_output=1, rotate_keys_every=2, rng=13)
    cloud = rot.cloud
    x, xt = np.ones(1), rot.encode_state(np.ones(1))
    rotations = []
    for i in range(4):
        y = np.array([0.1 * i])
        yt = rot.encode_input(y)
        ut, xt = cloud.advance(xt, yt)
        np.testing.assert_allclose(rot.decode_output(ut, yt), g(x, y), atol=1e-12)
        x = f(x, y)
        rotation = rot.tick()
        if rotation is not None:
            assert isinstance(rotation, KeyRotation) and rotation.target is rot.target
            assert rotation.nbytes == sum(
                m.nbytes for m in public_target_matrices(rot.keys).values()
            )
            xt = cloud.rekey(rotation, xt)
            rotations.append(rotation)
    assert [r.period for r in rotations] == [1, 2] and cloud.period == 2
    np.testing.assert_allclose(rot.decode_state(xt), x, atol=1e-12)
    with pytest.raises(InvalidArgumentError) as err:
        cloud.rekey(rotations[0], xt)  # replayed: out of order
    assert err.value.argument == "rotation"


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "3", None])
def test_rotate_keys_every_bad_values_name_it(bad):
    with pytest.raises(InvalidArgumentError) as err:
        RotatingImmersion(
            lambda x, y: x, lambda x, y: x, n_state=1, n_input=1, n_output=1, rotate_keys_every=bad
        )
    assert err.value.argument == "rotate_keys_every"
    assert "rotate_keys_every" in str(err.value)


def test_rotation_refuses_fixed_keys():
    keys = immerse(lambda x, y: x, lambda x, y: x, n_state=1, n_input=1, n_output=1, rng=0).keys
    with pytest.raises(InvalidArgumentError) as err:
        RotatingImmersion(
            lambda x, y: x,
            lambda x, y: x,
            n_state=1,
            n_input=1,
            n_output=1,
            rotate_keys_every=2,
            keys=keys,
        )
    assert err.value.argument == "keys"


def test_public_target_bytes_counts_the_five_matrices():
    keys = immerse(SCALAR.f, SCALAR.g, **SCALAR.dims(), rng=0).keys
    assert public_target_bytes(keys) == 8 * (1 * 3 + 3 * 2 + 2 * 3 + 3 * 1 + 3 * 3)


# ---------------------------------------------------------------- audit rows and CLI
def test_both_attacks_are_registered_for_immerse():
    specs = registry().attacks()
    # lwe: tests/test_lwe_attacks.py
    assert specs["subspace"].schemes == ("immerse", "immerse-modular", "lwe")
    assert specs["known-plaintext"].schemes == ("immerse", "immerse-modular", "lwe")


def test_known_plaintext_rows_before_and_after_rotation():
    rows = run_known_plaintext(quick=True, seed=0)
    by = {(r.detail["case"].split(" ")[0], r.mitigation): r for r in rows}
    assert by["scalar", None].verdict == by["vector", None].verdict == "leaks"
    assert by["scalar", None].value < 1e-8 and by["scalar", None].baseline >= 1.0
    assert by["scalar", None].detail["error_by_number_of_pairs"]["2"] > 0.9
    assert by["scalar", "rotate_keys_every=2"].verdict == "resists"  # k = n~ - 1 = extra_input
    assert by["vector", f"rotate_keys_every={EXTRA_INPUT}"].verdict == "resists"
    assert by["scalar", "rotate_keys_every=6"].verdict == "leaks"  # k > n~: honest limit
    for r in rows:
        if r.mitigation is not None:
            assert "bytes per rotation" in r.cost and r.detail["cost"]["step_time_ratio"] > 0
            assert r.detail["decode_max_abs_error"] < 1e-9


def test_cli_audit_subspace_quick_json():
    result = CliRunner().invoke(
        main,
        ["audit", "--attack", "subspace", "--scheme", "immerse", "--quick", "--json"],
        prog_name="immersion",
    )
    assert result.exit_code == 0, result.output
    text = result.stdout.strip()
    assert "\n" not in text
    obj = json.loads(text)
    rows = obj["attacks"]
    assert rows and all(ROW_FIELDS <= set(r) for r in rows)
    assert {r["attack"] for r in rows} == {"subspace"} and {r["scheme"] for r in rows} == {
        "immerse"
    }
    plain = [r for r in rows if r["mitigation"] is None]
    assert len(plain) == 2 and all(r["verdict"] == "leaks" and r["value"] > 0.98 for r in plain)
    short = [r for r in rows if r["mitigation"] == f"rotate_keys_every={EXTRA_INPUT}"]
    assert len(short) == 2 and all(r["verdict"] == "resists" and r["value"] == 0.0 for r in short)
    assert all("bytes per rotation" in r["cost"] for r in rows if r["mitigation"])
