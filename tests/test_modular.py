"""Modular coding: exact round trips mod 2^64, uniform elements, bit-exact immersion, files."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import (
    InvalidArgumentError,
    KeyFileError,
    draw_keys,
    immerse,
    load_keys,
    save_keys,
)
from immersion.coding.modular import FixedPointTwin, ModularImmersion
from immersion.integer import (
    decode_fixed,
    encode_fixed,
    to_signed,
    uniform_noise,
    weighted_sum,
    wrapping_matmul,
)
from immersion.keys import Keys, ModularKeys, draw_modular_code
from immersion.testing import assert_target_has_no_secrets, random_contractive_system
from scipy.stats import chisquare

ONE = np.uint64(1)
LEGACY_KEYS = "tests/data/legacy/siml-nn-x2.keyfile"


# ---------------------------------------------------------------- codes
@settings(max_examples=40)
@given(
    st.integers(1, 60),
    st.integers(1, 8),
    st.sampled_from(["dense", "block"]),
    st.integers(1, 20),
    st.integers(0, 2**32 - 1),
)
def test_codes_round_trip_exactly_mod_2_64(n, extra, kind, block_size, seed):
    code = draw_modular_code(n, extra, kind=kind, block_size=block_size, rng=seed)
    rng = np.random.default_rng(seed)
    q, s = uniform_noise(rng, (3, n)), uniform_noise(rng, (3, extra))
    encoded = code.noisy_encoder()(q, s)
    assert encoded.dtype == np.uint64 and encoded.shape == (3, n + extra)
    assert np.array_equal(code.decoder()(encoded), q)  # Pi_left (Pi q + N s) = q
    assert np.array_equal(code.noise_decoder()(encoded), s)  # N_left (Pi q + N s) = s
    assert np.array_equal(code.decoder()(code.encoder()(q)), q)
    # the dense views are the same linear maps, and [Pi N] is inverted by [Pi_left; N_left]
    pi, basis = code.dense_pi(), code.dense_noise_basis()
    assert np.array_equal(encoded, wrapping_matmul(q, pi.T) + wrapping_matmul(s, basis.T))
    k = np.concatenate([pi, basis], axis=1)
    k_inv = np.concatenate([code.dense_pi_left(), code.dense_noise_left()])
    assert np.array_equal(wrapping_matmul(k_inv, k), np.eye(n + extra, dtype=np.uint64))
    # every row of N has an odd entry, and the factor-based check agrees with the matrix
    odd = code.odd_noise_rows()
    assert odd.all() and np.array_equal(odd, (basis & ONE).any(axis=1))


def test_aggregating_encoded_uploads_with_integer_weights_decodes_to_the_weighted_sum():
    """The federated use: sum_k w_k (Pi q_k + N s_k) decodes to sum_k w_k q_k exactly."""
    code = draw_modular_code(5000, 2, rng=1)
    rng = np.random.default_rng(2)
    models = [rng.standard_normal(5000) for _ in range(4)]
    weights = [120, 80, 95, 101]
    qs = [encode_fixed(m, 32, name="w") for m in models]
    uploads = [code.noisy_encoder()(q, uniform_noise(rng, 2)) for q in qs]
    aggregate = code.decoder()(weighted_sum(uploads, weights))
    assert np.array_equal(aggregate, weighted_sum(qs, weights))
    exact = [
        sum(w * int(q) for w, q in zip(weights, col, strict=True))
        for col in zip(*[to_signed(q) for q in qs], strict=True)
    ]
    assert to_signed(aggregate).tolist() == exact


@pytest.mark.slow
def test_block_code_for_the_cnn_state_fits_and_round_trips():
    n = 1_199_882
    code = draw_modular_code(n, 2, rng=0)
    assert code.nbytes < 0.4e9  # two uint64 arrays of n~ x 16 plus indices
    rng = np.random.default_rng(0)
    q = encode_fixed(rng.standard_normal(n), 32, name="w")
    assert np.array_equal(code.decoder()(code.noisy_encoder()(q, uniform_noise(rng, 2))), q)
    assert code.odd_noise_rows().all()


# ---------------------------------------------------------------- uniformity
def _chi_square_p(values: np.ndarray, shift: int, mask: int = 15) -> np.ndarray:
    """p-values of a chi-square test of 16 equiprobable bins per column (bits shift..shift+3)."""
    bins = ((values >> np.uint64(shift)) & np.uint64(mask)).astype(np.int64)
    counts = np.stack([np.bincount(col, minlength=16) for col in bins.T])
    return chisquare(counts, axis=1).pvalue


@pytest.mark.parametrize("kind", ["dense", "block"])
def test_each_element_is_uniform_whatever_the_input(kind):
    """Top and bottom 4 bits of every element of y~, for two very different inputs: 16 equal bins.

    4,000 encodings per input; the smallest p-value over all elements and both bit ranges must
    exceed 1e-4 / (number of tests) (Bonferroni): a non-uniform element fails it (see the
    control below).
    """
    keys = draw_keys(3, 6, 2, extra_input=3, keys=kind, block_size=4, arithmetic="modular", rng=3)
    imm = immerse(
        lambda x, y: x,
        lambda x, y: x[:2],
        3,
        6,
        2,
        extra_input=3,
        keys=keys,
        arithmetic="modular",
        rng=4,
    )
    tests = 0
    worst = 1.0
    for y in (np.zeros(6), np.full(6, 1e6)):
        enc = imm.encode_input(np.broadcast_to(y, (4000, 6)))
        for shift in (0, 60):
            p = _chi_square_p(enc, shift)
            tests += p.size
            worst = min(worst, float(p.min()))
    assert worst > 1e-4 / tests


def test_uniformity_check_detects_a_row_without_odd_noise():
    """Control: an element whose noise coefficients are all even keeps its data's parity."""
    code = draw_modular_code(4, 2, kind="dense", rng=0)
    pi, basis = code.dense_pi(), code.dense_noise_basis().copy()
    basis[0] = basis[0] * np.uint64(2)  # row 0: even entries only
    rng = np.random.default_rng(1)
    q = encode_fixed(np.full((4000, 4), 0.37), 32)
    enc = wrapping_matmul(q, pi.T) + wrapping_matmul(uniform_noise(rng, (4000, 2)), basis.T)
    p_low = _chi_square_p(enc, 0)
    assert p_low[0] < 1e-30 and p_low[1:].min() > 1e-6


# ---------------------------------------------------------------- the immersion
@settings(max_examples=15)
@given(
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from(["dense", "block"]),
    st.integers(8, 40),
    st.integers(0, 2**16),
)
def test_decoded_trajectory_is_bit_identical_to_the_fixed_point_twin(
    n_state, n_input, n_output, kind, fraction_bits, seed
):
    f, g = random_contractive_system(n_state, n_input, n_output, seed=seed)
    imm = immerse(
        f,
        g,
        n_state,
        n_input,
        n_output,
        keys=kind,
        block_size=2,
        arithmetic="modular",
        fraction_bits=fraction_bits,
        rng=seed,
    )
    assert isinstance(imm, ModularImmersion)
    twin = FixedPointTwin(f, g, fraction_bits=fraction_bits)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n_state)
    xt = imm.encode_state(x)
    x = decode_fixed(encode_fixed(x, fraction_bits), fraction_bits)
    for _ in range(30):
        y = rng.standard_normal(n_input)
        yt = imm.encode_input(y)
        u = imm.decode_output(imm.target.output(xt, yt), yt)
        assert u.tobytes() == twin.output(x, y).tobytes()  # bit for bit, every step
        xt, x = imm.target.step(xt, yt), twin.step(x, y)
        assert imm.decode_state(xt).tobytes() == x.tobytes()
        assert np.array_equal(imm.decode_state_fixed(xt), encode_fixed(x, fraction_bits))


def test_fixed_point_run_stays_within_the_grid_of_the_float_run():
    f, g = random_contractive_system(3, 2, 2, seed=5)
    imm = immerse(f, g, 3, 2, 2, arithmetic="modular", fraction_bits=40, rng=0)
    x, xt = np.zeros(3), imm.encode_state(np.zeros(3))
    for y in np.random.default_rng(0).standard_normal((50, 2)):
        yt = imm.encode_input(y)
        u = imm.decode_output(imm.target.output(xt, yt), yt)
        assert np.abs(u - g(x, y)).max() < 1e-9  # 2^-40 ~ 1e-12 per rounding, contractive f
        xt, x = imm.target.step(xt, yt), f(x, y)


def test_advance_equals_output_and_step_and_works_with_a_public_signal():
    def f(x, y, w):
        return 0.5 * x + y * w

    def g(x, y, w):
        return x - w

    imm = immerse(f, g, 1, 1, 1, arithmetic="modular", fraction_bits=16, n_public=1, rng=0)
    xt, yt, w = imm.encode_state([0.25]), imm.encode_input([2.0]), np.array([3.0])
    ut, xt1 = imm.target.advance(xt, yt, w)
    assert np.array_equal(ut, imm.target.output(xt, yt, w))
    assert np.array_equal(xt1, imm.target.step(xt, yt, w))
    assert imm.decode_state(xt1).tolist() == [6.125]
    assert imm.decode_output(ut, yt).tolist() == [-2.75]


def test_overflow_is_refused_naming_the_signal_and_the_largest_magnitude():
    imm = immerse(
        lambda x, y: 1e7 * x,
        lambda x, y: 1e7 * y,
        1,
        1,
        1,
        arithmetic="modular",
        fraction_bits=40,
        rng=0,
    )  # fixed point with f = 40 represents |v| < 2^23 = 8.4e6
    with pytest.raises(InvalidArgumentError, match=r"^y: .*below 8\.38861e\+06 \(2\^23\)"):
        imm.encode_input([9e6])
    with pytest.raises(InvalidArgumentError, match="^state: "):
        imm.encode_state([-(2.0**23)])
    xt, yt = imm.encode_state([1.0]), imm.encode_input([1.0])
    with pytest.raises(InvalidArgumentError, match=r"^f: \|f\| reaches 1e\+07"):
        imm.target.step(xt, yt)
    with pytest.raises(InvalidArgumentError, match=r"^g: \|g\| reaches 1e\+07"):
        imm.target.output(xt, yt)


def test_bad_input_is_named():
    def f(x, y):
        return x

    imm = immerse(f, f, 1, 1, 1, arithmetic="modular", rng=0)
    yt = imm.encode_input([0.5])
    with pytest.raises(InvalidArgumentError, match="^encoded_input: .*floating point"):
        imm.target.step(imm.encode_state([0.0]), yt.astype(np.float64))
    with pytest.raises(InvalidArgumentError, match=r"^encoded_state: expected shape \(\.\.\., 2\)"):
        imm.target.step(np.zeros(5, dtype=np.uint64), yt)
    with pytest.raises(InvalidArgumentError, match="^encoded_output: "):
        imm.decode_output([1.5, 2.5, 3.5], yt)
    with pytest.raises(InvalidArgumentError, match="^y: "):
        imm.encode_input([np.nan])
    for option, value in (
        ("epsilon_input", 0.5),
        ("noise", "gaussian"),
        ("sensitivity_output", 2.0),
        ("backend", "torch"),
        ("dtype", "float32"),
    ):
        with pytest.raises(InvalidArgumentError, match=f"^{option}: "):
            immerse(f, f, 1, 1, 1, arithmetic="modular", rng=0, **{option: value})
    with pytest.raises(InvalidArgumentError, match="^fraction_bits: applies to arithmetic"):
        immerse(f, f, 1, 1, 1, fraction_bits=16, rng=0)
    with pytest.raises(InvalidArgumentError, match="^fraction_bits: "):
        immerse(f, f, 1, 1, 1, arithmetic="modular", fraction_bits=63, rng=0)
    with pytest.raises(InvalidArgumentError, match="^arithmetic: "):
        immerse(f, f, 1, 1, 1, arithmetic="integer", rng=0)
    with pytest.raises(InvalidArgumentError, match="^keys: are float keys"):
        immerse(f, f, 1, 1, 1, arithmetic="modular", keys=draw_keys(1, 1, 1, rng=0), rng=0)
    with pytest.raises(InvalidArgumentError, match="^keys: are integer keys"):
        immerse(f, f, 1, 1, 1, keys=draw_keys(1, 1, 1, arithmetic="modular", rng=0), rng=0)
    with pytest.raises(InvalidArgumentError, match="^keys: were made for"):
        immerse(f, f, 1, 1, 1, arithmetic="modular", keys=draw_keys(2, 1, 1, arithmetic="modular"))


def test_draw_keys_gives_the_keys_immerse_draws():
    keys = draw_keys(3, 2, 1, arithmetic="modular", rng=7)
    imm = immerse(lambda x, y: x, lambda x, y: x[:1], 3, 2, 1, arithmetic="modular", rng=7)
    assert isinstance(keys, ModularKeys) and keys.fingerprint == imm.keys.fingerprint
    assert "fingerprint=" in repr(keys) and str(keys.Pi1[0, 0]) not in repr(keys)


def test_report_gives_epsilon_zero_the_grid_step_and_what_is_not_protected():
    imm = immerse(
        lambda x, y: x, lambda x, y: x, 1, 1, 1, arithmetic="modular", fraction_bits=20, rng=0
    )
    r = imm.report()
    assert (r.arithmetic, r.epsilon_input, r.epsilon_output, r.decode_error_estimate) == (
        "modular",
        0.0,
        0.0,
        0.0,
    )
    assert r.quantisation_step == 2.0**-20 and r.largest_magnitude == 2.0**43
    assert r.composed(1000)["epsilon_input"] == 0.0
    assert "NOT protected" in r.guarantee and "Pi1_left" in r.guarantee
    # float reports are unchanged and say so
    float_report = immerse(lambda x, y: x, lambda x, y: x, 1, 1, 1, rng=0).report()
    assert float_report.arithmetic == "float" and float_report.quantisation_step is None


def test_report_refuses_to_claim_uniformity_for_a_row_without_odd_noise():
    import dataclasses

    keys = draw_keys(2, 1, 1, arithmetic="modular", rng=0)
    bad_code = dataclasses.replace(
        keys.input_code, noise_basis=keys.input_code.noise_basis * np.uint64(2)
    )
    bad = dataclasses.replace(keys, input_code=bad_code)
    with pytest.raises(InvalidArgumentError, match="^Pi1: "):  # no longer K, K^-1 either
        bad.validate()
    from immersion.privacy.report import modular_privacy_report

    assert modular_privacy_report(bad, 16).epsilon_input == float("inf")


@pytest.mark.parametrize("kind", ["dense", "block"])
def test_pickled_target_has_no_secrets_and_still_decodes(kind):
    def f(x, y):
        return np.tanh(0.5 * x + y.sum())

    def g(x, y):
        return x[:2] - y[0]

    imm = immerse(f, g, 3, 2, 2, keys=kind, block_size=2, arithmetic="modular", rng=0)
    cloud = pickle.loads(assert_target_has_no_secrets(imm))
    x0, y = np.array([0.1, 0.2, 0.3]), np.array([0.5, -0.5])
    yt = imm.encode_input(y)
    xt = cloud.step(imm.encode_state(x0), yt)
    twin = FixedPointTwin(f, g, fraction_bits=32)
    assert imm.decode_state(xt).tobytes() == twin.step(x0, y).tobytes()
    assert (
        imm.decode_output(cloud.output(xt, yt), yt).tobytes()
        == twin.output(twin.step(x0, y), y).tobytes()
    )


# ---------------------------------------------------------------- files
@pytest.mark.files
@pytest.mark.parametrize("kind", ["dense", "block"])
def test_integer_keys_save_and_load(tmp_path, kind):
    keys = draw_keys(4, 3, 2, keys=kind, block_size=3, arithmetic="modular", rng=1)
    path = save_keys(keys, tmp_path / "k.keys")
    assert path.read_bytes().startswith(b"IMMERSION-KEYS-2\n")
    back = load_keys(path)
    assert isinstance(back, ModularKeys) and back.fingerprint == keys.fingerprint
    imm = immerse(
        lambda x, y: x, lambda x, y: y[:2], 4, 3, 2, arithmetic="modular", keys=back, rng=0
    )
    yt = imm.encode_input([1.0, 2.0, 3.0])
    assert imm.decode_output(imm.target.output(imm.encode_state(np.zeros(4)), yt), yt).tolist() == [
        1.0,
        2.0,
    ]


@pytest.mark.files
def test_float_keys_keep_format_1_and_old_files_still_load(tmp_path):
    keys = draw_keys(2, 1, 1, rng=0)
    assert save_keys(keys, tmp_path / "f.keys").read_bytes().startswith(b"IMMERSION-KEYS-1\n")
    legacy = tmp_path / "legacy.keys"
    shutil.copyfile(LEGACY_KEYS, legacy)  # written before integer keys existed
    legacy.chmod(0o600)
    old = load_keys(legacy)
    assert isinstance(old, Keys) and old.arithmetic == "float" and old.noise_kind == "laplace"


@pytest.mark.files
def test_an_altered_integer_key_file_is_refused(tmp_path):
    from immersion.files import write_signed
    from immersion.keys.store import MAGIC_MODULAR, modular_meta

    keys = draw_keys(3, 2, 2, keys="block", block_size=2, arithmetic="modular", rng=2)
    arrays = keys.arrays()
    arrays["input.blocks_inv"] = arrays["input.blocks_inv"] + np.uint64(
        1
    )  # valid checksum, bad key
    path = tmp_path / "bad.keys"
    write_signed(path, MAGIC_MODULAR, modular_meta(keys), arrays, prefix=".k-")
    with pytest.raises(KeyFileError, match="malformed .*Pi1: a block is not inverted"):
        load_keys(path)
    arrays = keys.arrays()
    arrays["mask.weights"] = arrays["mask.weights"] - np.uint64(1)  # even weights
    write_signed(path, MAGIC_MODULAR, modular_meta(keys), arrays, prefix=".k-")
    with pytest.raises(KeyFileError, match="Pi4: has an even weight"):
        load_keys(path)


def test_codec_benchmark_reports_both_codecs_and_exactness():
    from immersion.bench.core import bench_codec

    row = bench_codec(sizes=(3000,), repeats=1)["results"][0]
    assert row["modular_decode_equals_fixed_point"] is True
    assert row["float_max_abs_decode_error"] < 1e-6
    assert row["modular_over_float"] == row["modular_round_trip_s"] / row["float_round_trip_s"]


def test_code_arrays_of_integer_codes():
    from immersion.keys import code_arrays

    dense = draw_modular_code(5, 2, kind="dense", rng=0)
    assert set(code_arrays(dense)) == {"pi", "pi_left", "noise_basis", "noise_left"}
    block = draw_modular_code(50, 2, block_size=8, rng=0)
    arrays = code_arrays(block)
    assert {"blocks", "blocks_inv", "signal_pos", "noise_pos"} <= set(arrays)
    assert all(a.dtype.kind in "iu" for a in arrays.values())
