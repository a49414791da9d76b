"""LWE parameters (HE standard table), the bits budget, refusals of wrapping settings, samplers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from immersion import InvalidArgumentError
from immersion.lwe import (
    HE_STANDARD_TERNARY,
    WrapAroundError,
    encrypt_controller,
    history_form,
    linear_controller,
    lwe_parameters,
)
from immersion.lwe.examples import lqg_loop
from immersion.lwe.fixed_point import CHECK_BITS, design, ranges
from immersion.lwe.keys import LweSecretKey, error_probabilities, public_vectors

PI = ([[1.0]], [[0.05]], [[1.0]], [[2.0]])


def test_table_is_the_he_standard_ternary_rows():
    # HE standard (ternary, sigma 3.2, classical) = SEAL's SEAL_HE_STD_PARMS_*_TC
    assert HE_STANDARD_TERNARY[128][4096] == 109 and HE_STANDARD_TERNARY[128][2048] == 54
    assert HE_STANDARD_TERNARY[192][4096] == 75 and HE_STANDARD_TERNARY[256][4096] == 58
    assert HE_STANDARD_TERNARY[256][8192] == 118
    for level in (128, 192, 256):  # monotone: more dimension, more modulus
        bits = [HE_STANDARD_TERNARY[level][n] for n in sorted(HE_STANDARD_TERNARY[level])]
        assert bits == sorted(bits)


@pytest.mark.parametrize(
    "level, modulus_bits, n",
    [(128, 64, 4096), (192, 64, 4096), (256, 64, 8192), (128, 104, 4096), (128, 128, 8192),
     (256, 128, 16384), (128, 32, 2048)],
)  # fmt: skip
def test_smallest_table_dimension(level, modulus_bits, n):
    p = lwe_parameters(security_bits=level, modulus_bits=modulus_bits)
    assert p.dimension == n and p.table_max_modulus_bits >= modulus_bits
    assert p.sigma == 3.2 and p.error_bound == 19 and "Homomorphic Encryption Security" in p.source
    assert "hestdparms.h" in p.source and f"_{level}_TC" in p.source  # SEAL's row, same entries


def test_dimension_checked_against_the_table():
    assert lwe_parameters(security_bits=128, dimension=5000).table_dimension == 4096
    with pytest.raises(InvalidArgumentError, match="dimension.*n >= 4096"):
        lwe_parameters(security_bits=128, dimension=2048)  # 2048 allows log2 q <= 54
    with pytest.raises(InvalidArgumentError, match="dimension"):
        lwe_parameters(security_bits=256, dimension=4096)  # 58 < 64
    unclaimed = lwe_parameters(security_bits=None, dimension=10)
    assert unclaimed.security_bits is None and unclaimed.table_max_modulus_bits is None


@pytest.mark.parametrize(
    "kwargs, name",
    [({"security_bits": 100}, "security_bits"), ({"security_bits": None}, "security_bits"),
     ({"modulus_bits": 200}, "modulus_bits"), ({"modulus_bits": 64.0}, "modulus_bits"),
     ({"modulus_bits": True}, "modulus_bits"), ({"dimension": 1}, "dimension")],
)  # fmt: skip
def test_bad_parameters_are_named(kwargs, name):
    with pytest.raises(InvalidArgumentError) as err:
        lwe_parameters(**kwargs)
    assert err.value.argument == name


def _fp(system, in_range, out_range, bits=64, frac=None, scale_bits=None):
    h = history_form(linear_controller(system))
    return design(
        h,
        input_range=ranges("input_range", in_range, h.n_input),
        output_range=ranges("output_range", out_range, h.n_output),
        modulus_bits=bits,
        error_bound=19,
        fractional_bits=frac,
        scale_bits=scale_bits,
    )


@pytest.mark.parametrize("bits", [64, 100, 128])
def test_budget_proves_no_wrap(bits):
    """A decoder that rounds: L * acc_max + noise_max < q / 2 with L / 2 > noise_max; acc_max
    recomputed here from the integer matrix."""
    fp = _fp(PI, 3.0, 10.0, bits)
    entry = [*fp.input_max_q, *fp.output_max_q, *fp.input_max_q]  # [y_k, u_(k-1), y_(k-1)]
    acc_max = max(sum(abs(c) * m for c, m in zip(row, entry, strict=True)) for row in fp.matrix)
    noise_max = 19 * max(sum(abs(c) for c in row) for row in fp.matrix)
    assert acc_max == fp.acc_bound and 2 ** (fp.noise_bits - 1) > noise_max
    assert (acc_max << fp.noise_bits) + noise_max < 2 ** (bits - 1)
    # the search used the budget: one more coefficient bit would not fit
    with pytest.raises(WrapAroundError, match="could wrap"):
        _fp(PI, 3.0, 10.0, bits, (fp.frac_input, fp.frac_output, fp.frac_gain + 2))


@pytest.mark.parametrize("bits", [64, 100, 128])
def test_budget_with_the_noise_subtracted_proves_no_wrap(bits):
    """The LWE handle subtracts the noise exactly: L = 2^CHECK_BITS and L * acc_max < q / 2,
    whatever the noise (it never reaches the budget), and the scales use the bits it frees."""
    fp = _fp(PI, 3.0, 10.0, bits, scale_bits=CHECK_BITS)
    entry = [*fp.input_max_q, *fp.output_max_q, *fp.input_max_q]
    acc_max = max(sum(abs(c) * m for c, m in zip(row, entry, strict=True)) for row in fp.matrix)
    assert acc_max == fp.acc_bound and fp.noise_bits == CHECK_BITS
    assert acc_max << CHECK_BITS < 2 ** (bits - 1)
    rounding = _fp(PI, 3.0, 10.0, bits)
    assert fp.predicted_step_error < rounding.predicted_step_error / 100  # the noise's bits, back
    with pytest.raises(WrapAroundError, match="could wrap"):
        _fp(PI, 3.0, 10.0, bits, (fp.frac_input, fp.frac_output, fp.frac_gain + 2), CHECK_BITS)


def test_report_states_the_budget():
    imm = encrypt_controller(PI, input_range=3.0, output_range=10.0, rng=0)
    r = imm.report()
    assert r.parameters.dimension == 4096 and r.parameters.security_bits == 128
    assert 0 < r.headroom_bits < 64 and r.noise_bound == imm.design.noise_gain * 19
    assert r.noise_scale_bits == CHECK_BITS  # L is not sized by the noise: it is subtracted
    total = imm.design.acc_bound << r.noise_scale_bits
    assert math.isclose(r.headroom_bits, 63 - math.log2(total))
    assert r.uplink_bytes == 8 * (3 + 2) and r.downlink_bytes == 8 * (3 + 1)
    assert r.as_dict()["coding"] == "lwe" and r.predicted_step_error_relative > 0
    assert r.input_range == (3.0,) and r.output_range == (10.0,)  # the signal ranges budgeted
    assert r.as_dict()["input_range"] == (3.0,) and r.as_dict()["output_range"] == (10.0,)
    assert r.predicted_step_error_relative == r.predicted_step_error / 10.0
    mimo = lqg_loop(3, n_input=2, n_output=2)
    wide = encrypt_controller(mimo.controller, input_range=[1.5, 2.5], output_range=4.0, rng=0)
    d = json.loads(json.dumps(wide.report().as_dict()))  # JSON-ready, per component
    assert d["input_range"] == [1.5, 2.5] and d["output_range"] == [4.0, 4.0]


def test_wrapping_settings_are_refused():
    with pytest.raises(WrapAroundError, match="no fixed-point scaling: the ciphertexts could wrap"):
        encrypt_controller(PI, input_range=1e30, output_range=1e30, rng=0)
    with pytest.raises(WrapAroundError, match="fractional_bits"):
        encrypt_controller(PI, input_range=1, output_range=1, fractional_bits=(30, 30, 30), rng=0)
    with pytest.raises(InvalidArgumentError, match="fractional_bits"):
        encrypt_controller(PI, input_range=1, output_range=1, fractional_bits=(1, 2), rng=0)
    with pytest.raises(InvalidArgumentError, match="input_range"):
        encrypt_controller(PI, input_range=-1, output_range=1, rng=0)
    with pytest.raises(InvalidArgumentError, match="output_range"):
        encrypt_controller(PI, input_range=1, output_range=[1, 2, 3], rng=0)


def test_values_outside_the_declared_ranges_are_refused_at_run_time():
    imm = encrypt_controller(PI, input_range=1.0, output_range=5.0, rng=0)
    xt = imm.encode_state()
    with pytest.raises(WrapAroundError, match=r"input_range: y\[0\] = 1.5"):
        imm.encode_input([1.5])
    for _ in range(2):  # the PI integrates a constant error until u leaves +-5
        yt = imm.encode_input([1.0])
        imm.decode_output(imm.target.output(xt, yt), yt)
        xt = imm.target.step(xt, yt)
    with pytest.raises(WrapAroundError, match="output_range"):
        for _ in range(200):
            yt = imm.encode_input([1.0])
            imm.decode_output(imm.target.output(xt, yt), yt)
            xt = imm.target.step(xt, yt)


def test_error_sampler_is_the_clipped_gaussian():
    key = LweSecretKey(bytes(range(32)), lwe_parameters(security_bits=None, dimension=16))
    e = key.errors(bytes(16), 0, 200_000)
    assert e.dtype == np.int64 and np.abs(e).max() <= 19
    counts = np.bincount(e + 19, minlength=39)
    expected = error_probabilities(3.2, 19) * e.size
    big = expected > 20
    chi2 = float((((counts - expected) ** 2)[big] / expected[big]).sum())
    assert chi2 < 60  # ~ 25 degrees of freedom: far below this unless the law is wrong
    assert abs(e.std() - 3.2) < 0.05
    assert not np.array_equal(e[:100], key.errors(bytes(16), 100, 100))  # distinct per index


def test_secret_is_ternary_uniform_and_not_pickled():
    import pickle

    key = LweSecretKey(bytes(32), lwe_parameters())
    values, counts = np.unique(key.secret, return_counts=True)
    assert values.tolist() == [-1, 0, 1] and np.all(np.abs(counts - 4096 / 3) < 4 * 30)
    assert "fingerprint" in repr(key) and str(key.secret[:8].tolist()) not in repr(key)
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(key)


@pytest.mark.parametrize("prg", ["aes128-ctr", "shake128"])
def test_public_vectors_depend_on_seed_and_index_only(prg):
    a = public_vectors(b"s" * 16, 5, 3, 64, prg)
    assert a.shape == (3, 64) and a.dtype == np.uint64
    assert np.array_equal(a[1:], public_vectors(b"s" * 16, 6, 2, 64, prg))
    assert not np.array_equal(a, public_vectors(b"t" * 16, 5, 3, 64, prg))
    bits = np.unpackbits(a.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.02
