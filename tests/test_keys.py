"""Key algebra (seed 002 Proposition 1), block-structured keys, save and load."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import KeyFileError, Keys, load_keys, save_keys
from immersion.keys.stats import dense_row_stats

dims = st.fixed_dictionaries(
    {
        "n_state": st.integers(1, 30),
        "n_input": st.integers(1, 30),
        "n_output": st.integers(1, 30),
        "extra_state": st.integers(1, 12),
        "extra_input": st.integers(1, 12),
        "extra_output": st.integers(1, 12),
    }
)
pytestmark = pytest.mark.files  # key derivation and key files: also run under a second BLAS kernel


def _check_algebra(keys: Keys) -> None:
    for pi, left, name in (
        (keys.Pi1, keys.Pi1_left, "1"),
        (keys.Pi2, keys.Pi2_left, "2"),
        (keys.Pi3, keys.Pi3_left, "3"),
    ):
        assert np.linalg.matrix_rank(pi) == pi.shape[1], f"Pi{name} not full column rank"
        np.testing.assert_allclose(left @ pi, np.eye(pi.shape[1]), atol=1e-12)
    np.testing.assert_allclose(keys.Pi1_left @ keys.N1, 0.0, atol=1e-12)
    assert np.linalg.matrix_rank(keys.N1) == keys.N1.shape[1]
    assert np.linalg.norm(keys.N1, axis=1).min() > 1e-8, "N1 has a (near) zero row"
    np.testing.assert_allclose(keys.Pi4 @ keys.Pi1, 0.0, atol=1e-12)  # the mask carries noise only
    assert np.linalg.norm(keys.Pi4 @ keys.N1, axis=1).min() > 1e-8  # ... and every output gets some


@settings(max_examples=30)
@given(
    d=dims,
    kind=st.sampled_from(["dense", "block"]),
    block=st.integers(1, 9),
    seed=st.integers(0, 10**6),
)
def test_drawn_keys_satisfy_proposition_1(d, kind, block, seed):
    keys = Keys.draw(**d, kind=kind, block_size=block, rng=seed)
    assert keys.Pi1.shape == (d["n_input"] + d["extra_input"], d["n_input"])
    assert keys.N1.shape == (d["n_input"] + d["extra_input"], d["extra_input"])
    assert keys.Pi4.shape == (d["n_output"] + d["extra_output"], d["n_input"] + d["extra_input"])
    _check_algebra(keys)
    assert not np.allclose(keys.Pi3_left, keys.Pi3.T), "Pi_left should not be a plain transpose"


@settings(max_examples=30)
@given(d=dims, block=st.integers(1, 9), seed=st.integers(0, 10**6))
def test_structured_row_norms_equal_the_dense_ones(d, block, seed):
    keys = Keys.draw(**d, kind="block", block_size=block, rng=seed)
    for code in (keys.input_code, keys.state_code, keys.output_code):
        fast, exact = code.row_stats(), dense_row_stats(code.dense_pi(), code.dense_noise_basis())
        for field in ("l1_signal", "l2_signal", "l2_noise"):
            np.testing.assert_allclose(
                getattr(fast, field), getattr(exact, field), rtol=1e-10, atol=1e-13
            )
        assert np.all(fast.linf_noise <= exact.linf_noise * (1 + 1e-10))  # a valid lower bound
        assert np.all(fast.linf_noise > 0)
    np.testing.assert_allclose(
        keys.mask_noise_row_norms, np.linalg.norm(keys.Pi4 @ keys.N1, axis=1), rtol=1e-10
    )


def test_block_keys_apply_in_o_n_b_and_match_dense_views():
    keys = Keys.draw(
        n_state=500,
        n_input=300,
        n_output=200,
        extra_state=40,
        extra_input=30,
        extra_output=20,
        kind="block",
        block_size=16,
        rng=2,
    )
    from immersion.backends import NumpyBackend

    be = NumpyBackend()
    y = np.random.default_rng(0).standard_normal((4, 300))
    s = np.random.default_rng(1).standard_normal((4, 30))
    enc = keys.input_code.noisy_encoder(be)(y, s)
    np.testing.assert_allclose(enc, y @ keys.Pi1.T + s @ keys.N1.T, atol=1e-12)
    np.testing.assert_allclose(keys.input_code.decoder(be)(enc), y, atol=1e-12)
    # memory: O(n b), far below the dense n~^2
    assert keys.state_code.nbytes < 540 * 16 * 8 * 2 + 540 * 8 * 6


def test_cnn_sized_block_keys_fit_in_memory_budget():
    """Seed 000's CNN state (1,199,882 entries, n~ - n = 129): block keys stay well under 1 GB."""
    keys = Keys.draw(n_state=1_199_882, n_input=1, n_output=1, extra_state=129, kind="block", rng=0)
    assert keys.state_code.n_total == 1_200_011
    assert keys.nbytes < 1e9
    stats = keys.state_code.row_stats()
    assert stats.l2_noise.min() > 0  # every element carries noise
    with pytest.raises(ValueError, match="dense view"):
        _ = keys.Pi2


def test_user_matrices_are_validated_and_usable():
    rng = np.random.default_rng(0)
    pi1, pi2, pi3 = (
        rng.standard_normal((4, 2)),
        rng.standard_normal((3, 2)),
        rng.standard_normal((3, 1)),
    )
    pi4 = rng.standard_normal((3, 4))
    keys = Keys.from_matrices(Pi1=pi1, Pi2=pi2, Pi3=pi3, Pi4=pi4)
    np.testing.assert_allclose(keys.Pi1_left @ keys.N1, 0, atol=1e-12)
    assert keys.N1.shape == (4, 2)
    assert not keys.mask_is_generated
    assert keys.mask_data_row_l1.max() > 0  # this Pi4 lets data into the mask: the report counts it


def test_save_load_roundtrip_keeps_every_array(tmp_path):
    for kind in ("dense", "block"):
        keys = Keys.draw(n_state=7, n_input=5, n_output=3, kind=kind, block_size=3, rng=4)
        path = save_keys(keys, tmp_path / f"{kind}.keys")
        assert (path.stat().st_mode & 0o777) == 0o600
        loaded = load_keys(path)
        assert loaded.fingerprint == keys.fingerprint
        for name in ("Pi1", "Pi1_left", "N1", "Pi2", "Pi3", "Pi3_left", "Pi4"):
            np.testing.assert_array_equal(getattr(loaded, name), getattr(keys, name))
    assert sorted(os.listdir(tmp_path)) == ["block.keys", "dense.keys"]  # no temporary files left


def test_corrupted_key_file_is_refused(tmp_path):
    path = save_keys(Keys.draw(n_state=2, n_input=1, n_output=1, rng=0), tmp_path / "k.keys")
    blob = bytearray(path.read_bytes())
    blob[-10] ^= 0xFF
    path.write_bytes(bytes(blob))
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match="integrity"):
        load_keys(path)


def test_repr_never_shows_key_material():
    keys = Keys.draw(n_state=2, n_input=1, n_output=1, rng=0)
    text = repr(keys)
    assert "fingerprint=" in text and "[" not in text
    assert f"{keys.Pi1[0, 0]:.4f}"[:6] not in text


def test_draw_keys_gives_the_keys_immerse_draws_and_they_survive_a_round_trip(tmp_path):
    from immersion import draw_keys, immerse

    def f(x, y):
        return 0.5 * x + y

    def g(x, y):
        return 2.0 * x

    keys = draw_keys(
        2,
        2,
        2,
        epsilon_input=1e-2,
        epsilon_output=5e-3,
        sensitivity_input=3.0,
        noise="gaussian",
        rng=5,
    )
    imm = immerse(
        f,
        g,
        2,
        2,
        2,
        epsilon_input=1e-2,
        epsilon_output=5e-3,
        sensitivity_input=3.0,
        noise="gaussian",
        rng=5,
    )
    assert keys.fingerprint == imm.keys.fingerprint
    loaded = load_keys(save_keys(keys, tmp_path / "k.keys"))
    assert loaded.noise == keys.noise  # law, sensitivities and deltas travel with the keys
    again = immerse(f, g, 2, 2, 2, keys=loaded, rng=9)  # design options are not needed again
    for field in (
        "epsilon_input",
        "epsilon_output",
        "sensitivity_input",
        "delta_input",
        "noise_scale",
    ):
        assert getattr(again.report(), field) == getattr(imm.report(), field)
    y = np.array([0.3, -0.1])
    yt = again.encode_input(y)
    np.testing.assert_allclose(
        again.decode_state(again.target.step(again.encode_state(np.zeros(2)), yt)), y, atol=1e-9
    )


# ---------------------------------------------------------------- vectorised drawing
def test_block_key_file_written_before_vectorised_drawing_loads_and_decodes_identically(tmp_path):
    """tests/data/legacy/block-keys-v1.*: block keys (300 states, blocks of 8) saved by the code
    that drew groups one by one, with encodings and decodings that code computed."""
    import shutil
    from pathlib import Path

    from immersion import draw_keys
    from immersion.backends import NumpyBackend
    from immersion.keys.arrays import key_arrays

    legacy = Path(__file__).parent / "data" / "legacy"
    path = tmp_path / "old.keys"
    shutil.copyfile(legacy / "block-keys-v1.keyfile", path)
    path.chmod(0o600)
    keys = load_keys(path)
    expected = np.load(legacy / "block-keys-v1.expected.npz")
    assert keys.kind == "block" and keys.fingerprint == str(expected["fingerprint"])
    # the same seed still draws these keys: the same integers (permutations, groups, positions)
    # and the same reals to rounding (their last bits depend on the CPU's LAPACK kernel, which is
    # why files carry their keys instead of a seed)
    redrawn = key_arrays(draw_keys(300, 7, 5, extra_state=9, keys="block", block_size=8, rng=11))
    saved = key_arrays(keys)
    assert sorted(redrawn) == sorted(saved)
    for name, array in saved.items():
        if array.dtype.kind == "f":
            np.testing.assert_allclose(redrawn[name], array, rtol=0, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(redrawn[name], array, err_msg=name)
    be = NumpyBackend()
    mask = keys.mask.operator(keys.input_code, keys.output_code, be)
    xt, yt, ut = (expected[k] for k in ("encoded_state", "encoded_input", "encoded_output"))
    for got, want in (
        (keys.state_code.decoder(be)(xt), expected["decoded_state"]),
        (keys.input_code.decoder(be)(yt), expected["decoded_input"]),
        (keys.output_code.decoder(be)(ut - mask(yt)), expected["decoded_output"]),
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def _greedy_noise_counts(sizes: list[int], n_noise: int) -> list[int]:
    """Oracle in plain Python: one noise entry per group, floor of a share of the rest in
    proportion to each group's free room, then what is left one group at a time, most room first."""
    rest = n_noise - len(sizes)
    total_room = max(sum(sizes) - len(sizes), 1)
    counts = [1 + min(size - 1, max(rest, 0) * (size - 1) // total_room) for size in sizes]
    left = n_noise - sum(counts)
    for g in sorted(range(len(sizes)), key=lambda g: counts[g] - sizes[g]):  # stable: ties in order
        extra = min(left, sizes[g] - counts[g])
        counts[g] += extra
        left -= extra
    return counts


@settings(max_examples=60)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    fill=st.floats(0.0, 1.0),
)
def test_noise_counts_match_the_greedy_rule(sizes, fill):
    from immersion.keys.structured import _noise_counts

    group_sizes = np.array(sizes, dtype=np.int64)
    n_noise = len(sizes) + int(fill * (group_sizes.sum() - len(sizes)))
    counts = _noise_counts(group_sizes, n_noise)
    assert counts.tolist() == _greedy_noise_counts(sizes, n_noise)
    assert counts.sum() == n_noise and np.all((1 <= counts) & (counts <= group_sizes))


def test_rows_chosen_in_groups_are_distinct_and_inside_their_group():
    from immersion.keys.structured import _per_group

    group_starts = np.array([0, 4, 7, 12])
    counts = np.array([2, 1, 5])
    rng = np.random.default_rng(0)
    for _ in range(50):
        noise_pos, flat_pos = _per_group(rng, group_starts, counts)
        parts = np.split(noise_pos, np.cumsum(counts)[:-1])
        for g, part in enumerate(parts):
            lo, hi = group_starts[g], group_starts[g + 1]
            assert np.all((lo <= part) & (part < hi)) and np.unique(part).size == counts[g]
            assert flat_pos[g] == part[0]
        assert np.array_equal(np.sort(parts[2]), np.arange(7, 12))  # a full group: every row


def test_user_handle_and_target_share_one_transform_and_the_key_blocks():
    from immersion import immerse

    imm = immerse(
        lambda x, y: np.tanh(x) + y.sum(),
        lambda x, y: x[:3] - y,
        n_state=300,
        n_input=3,
        n_output=3,
        keys="block",
        block_size=8,
        rng=0,
    )
    state_in = imm.target._state_in._transform
    assert state_in is imm._state_dec._transform is imm.target._state_out._transform
    assert imm.target._input_in._transform is imm._input_enc._transform
    assert imm.target._output_out._transform is imm._output_dec._transform
    # one copy of the blocks in memory: the transform (and its transpose) are views of the keys
    blocks = imm.keys.state_code.mix.blocks
    assert np.shares_memory(state_in._blocks, blocks)
    assert np.shares_memory(state_in._blocks_t, blocks)
    # a fresh backend object gets its own transform; the keys pickle without the shared one
    import pickle

    from immersion.backends import NumpyBackend

    assert imm.keys.state_code.transform(NumpyBackend()) is not state_in
    again = pickle.loads(pickle.dumps(imm.keys))
    assert again.fingerprint == imm.keys.fingerprint
    x = np.linspace(-1.0, 1.0, 300)
    np.testing.assert_allclose(imm.decode_state(imm.encode_state(x)), x, atol=1e-12)


def test_large_groups_keep_q_orthogonal_to_working_precision():
    """Two groups of 60,001 rows: each reflection vector has unit norm to about 1e-13, so a noise
    of 1e8 cancels on decoding to far below 1e-6 (a sequential norm sum left 6e-5)."""
    import math

    from immersion.backends import NumpyBackend
    from immersion.keys import draw_code

    code = draw_code(120_000, 2, kind="block", rng=3)
    h, gid = code.mix.householder, code.mix.group_ids
    for g in range(code.mix.n_groups):
        assert abs(math.fsum(h[gid == g] ** 2) - 1.0) < 1e-13  # a sequential sum: 6e-13
    be = NumpyBackend()
    y = np.random.default_rng(4).standard_normal(120_000)
    encoded = code.noisy_encoder(be)(y, np.array([1e8, -1e8]))
    assert np.abs(code.decoder(be)(encoded) - y).max() < 1e-6
