"""The shared integer arithmetic modulo 2^64 (immersion.integer): laws, refusals, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import InvalidArgumentError, NonFiniteError
from immersion.integer import (
    as_uint64,
    check_sum_headroom,
    decode_fixed,
    encode_fixed,
    inverse_mod,
    inverse_odd,
    largest_magnitude,
    quantise,
    random_unimodular,
    random_unimodular_stack,
    solve_mod,
    to_signed,
    uniform_noise,
    weighted_sum,
    wrapping_matmul,
)

MOD = 1 << 64


def _python_matmul(a: np.ndarray, b: np.ndarray) -> list[list[int]]:
    """Reference product with Python's unbounded integers, reduced modulo 2^64."""
    return [
        [
            sum(int(a[i, k]) * int(b[k, j]) for k in range(a.shape[1])) % MOD
            for j in range(b.shape[1])
        ]
        for i in range(a.shape[0])
    ]


@settings(max_examples=60)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_wrapping_matmul_equals_exact_integer_product_mod_2_64(n, k, m, seed):
    rng = np.random.default_rng(seed)
    a, b = uniform_noise(rng, (n, k)), uniform_noise(rng, (k, m))
    assert wrapping_matmul(a, b).tolist() == _python_matmul(a, b)


@settings(max_examples=80)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20),
    st.integers(0, 40),
)
def test_fixed_point_round_trip_is_the_rounding_to_the_grid(values, f):
    y = np.array(values)
    q = encode_fixed(y, f, name="y")
    assert q.dtype == np.uint64
    # q is round(y 2^f) exactly, checked with Python integers
    expected = [round(v * 2**f) for v in values]
    assert to_signed(q).tolist() == expected
    back = decode_fixed(q, f)
    assert np.all(np.abs(back - y) <= 2.0 ** -(f + 1))
    assert np.array_equal(quantise(y, f), back)
    assert np.array_equal(encode_fixed(back, f), q)  # grid values are fixed points


def test_range_check_names_the_signal_and_the_largest_magnitude():
    bound = largest_magnitude(40)
    assert bound == 2.0**23
    encode_fixed([bound * (1 - 2**-30)], 40, name="u")  # just below: accepted
    with pytest.raises(InvalidArgumentError, match=r"^u: .*below 8\.38861e\+06 \(2\^23\)"):
        encode_fixed([bound], 40, name="u")
    with pytest.raises(InvalidArgumentError, match=r"^w: .*headroom_bits=3 .*\(2\^20\)"):
        encode_fixed([2.0**20], 40, name="w", headroom_bits=3)
    with pytest.raises(NonFiniteError, match="^y: "):
        encode_fixed([np.nan], 8, name="y")
    with pytest.raises(InvalidArgumentError, match="^y: "):
        encode_fixed([1e308], 62, name="y")  # finite, overflows to inf once scaled


@pytest.mark.parametrize("bad", [-1, 63, 2.5, True, "8"])
def test_bad_fraction_bits_are_named(bad):
    with pytest.raises(InvalidArgumentError, match="^fraction_bits: "):
        encode_fixed([1.0], bad)


def test_as_uint64_refuses_floats_and_reads_negatives_in_twos_complement():
    assert as_uint64("y", np.array([-2], dtype=np.int32)).tolist() == [MOD - 2]
    assert as_uint64("y", [MOD - 1, 2**70 + 3]).tolist() == [MOD - 1, 3]
    with pytest.raises(InvalidArgumentError, match="^yt: .*floating point"):
        as_uint64("yt", np.array([1.0]))
    with pytest.raises(InvalidArgumentError, match=r"^yt: expected shape \(\.\.\., 3\)"):
        as_uint64("yt", np.zeros(2, dtype=np.uint64), last_dim=3)
    with pytest.raises(InvalidArgumentError, match="^yt: "):
        as_uint64("yt", ["a"])


@settings(max_examples=50)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=10))
def test_inverse_odd(values):
    a = np.array([2 * v + 1 for v in values], dtype=np.uint64)
    assert (a * inverse_odd(a)).tolist() == [1] * len(values)


def test_inverse_odd_refuses_even():
    with pytest.raises(InvalidArgumentError, match="^values: even"):
        inverse_odd(np.array([3, 4], dtype=np.uint64))


@settings(max_examples=40)
@given(st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_unimodular_draws_are_inverted_exactly(size, seed):
    k, k_inv = random_unimodular(size, np.random.default_rng(seed))
    eye = np.eye(size, dtype=np.uint64)
    assert np.array_equal(wrapping_matmul(k, k_inv), eye)
    assert np.array_equal(wrapping_matmul(k_inv, k), eye)
    assert np.array_equal(inverse_mod(k), k_inv)  # the inverse is unique


def test_unimodular_stack_is_reproducible_and_exact():
    ks, invs = random_unimodular_stack(np.random.default_rng(3), 5, 7)
    ks2, _ = random_unimodular_stack(np.random.default_rng(3), 5, 7)
    assert np.array_equal(ks, ks2)
    assert np.array_equal(
        np.matmul(ks, invs), np.broadcast_to(np.eye(7, dtype=np.uint64), ks.shape)
    )


@settings(max_examples=40)
@given(st.integers(1, 8), st.integers(0, 6), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_solve_mod_recovers_the_solution(cols, extra_rows, rhs_cols, seed):
    rng = np.random.default_rng(seed)
    k, _ = random_unimodular(cols, rng)  # invertible: a solution is unique
    a = np.concatenate([k, uniform_noise(rng, (extra_rows, cols))])[
        rng.permutation(cols + extra_rows)
    ]
    x = uniform_noise(rng, (cols, rhs_cols))
    assert np.array_equal(solve_mod(a, wrapping_matmul(a, x)), x)


def test_solve_mod_and_inverse_mod_refuse_singular_systems():
    even = np.array([[2, 4], [6, 1]], dtype=np.uint64)  # det = 2 - 24: even
    with pytest.raises(InvalidArgumentError, match="^m: is not invertible modulo 2"):
        inverse_mod(even, name="m")
    a = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.uint64)
    with pytest.raises(np.linalg.LinAlgError, match="no solution"):
        solve_mod(a, np.array([1, 1, 3], dtype=np.uint64))
    with pytest.raises(InvalidArgumentError, match="^matrix: expected a tall"):
        solve_mod(np.ones((1, 2), dtype=np.uint64), np.ones(1, dtype=np.uint64))


@settings(max_examples=40)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=8),
    st.lists(st.integers(-(2**20), 2**20), min_size=8, max_size=8),
    st.randoms(use_true_random=False),
)
def test_weighted_sum_is_exact_and_order_free(values, weights, shuffler):
    weights = weights[: len(values)]
    f = 24
    check_sum_headroom(1e3, weights, f, name="values")
    qs = [encode_fixed([v, -v], f) for v in values]
    total = weighted_sum(qs, weights)
    expected = sum(w * round(v * 2**f) for w, v in zip(weights, values, strict=True))
    assert to_signed(total).tolist() == [expected, -expected]
    order = list(range(len(values)))
    shuffler.shuffle(order)
    assert np.array_equal(weighted_sum([qs[i] for i in order], [weights[i] for i in order]), total)


def test_weighted_sum_bad_input():
    with pytest.raises(InvalidArgumentError, match="^weights: expected one integer"):
        weighted_sum([np.zeros(2, dtype=np.uint64)], [1, 2])
    with pytest.raises(InvalidArgumentError, match="^weights: expected integers"):
        weighted_sum([np.zeros(2, dtype=np.uint64)], [0.5])
    with pytest.raises(InvalidArgumentError, match=r"^arrays\[1\]: expected shape"):
        weighted_sum([np.zeros(2, dtype=np.uint64), np.zeros(3, dtype=np.uint64)], [1, 1])


def test_headroom_refusal_is_exactly_at_the_wrap():
    # values up to 1.0 with f = 60: q up to 2^60; a total weight of 8 reaches 2^63 and could wrap
    check_sum_headroom(1.0, [3, 4], 60, name="uploads")
    with pytest.raises(InvalidArgumentError, match="^uploads: .*total weight 8"):
        check_sum_headroom(1.0, [4, 4], 60, name="uploads")


def test_uniform_noise_covers_the_top_bit_and_depends_only_on_rng():
    a = uniform_noise(np.random.default_rng(5), 4000)
    assert np.array_equal(a, uniform_noise(np.random.default_rng(5), 4000))
    top = (a >> np.uint64(63)).astype(int)
    assert 0.45 < top.mean() < 0.55  # 4000 fair bits: 6 standard deviations either side


def test_torch_int64_products_equal_numpy_uint64_on_cpu():
    """The module docstring's claim: torch int64 products on the CPU wrap like numpy uint64."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a, b = uniform_noise(rng, (5, 4)), uniform_noise(rng, (4, 3))
    prod = torch.from_numpy(a.view(np.int64)) @ torch.from_numpy(b.view(np.int64))
    assert np.array_equal(prod.numpy().view(np.uint64), wrapping_matmul(a, b))
