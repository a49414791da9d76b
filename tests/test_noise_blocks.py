"""The encoding noise drawn a block of samples ahead: same law, same stream, exact encodings."""

from __future__ import annotations

import numpy as np
import pytest
from immersion import NonFiniteError, immerse
from immersion.coding.keygen import split_rng
from immersion.coding.noise_blocks import NoiseBlocks, block_rows


def _contractive():
    A = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.1], [0.1, 0.0, 0.7]])
    return (lambda x, y: A @ x + 0.5 * y[0]), (lambda x, y: x[:1] - y)


@pytest.mark.parametrize("keys", ["dense", "block"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_encodings_use_the_unblocked_noise_stream_in_order(keys, noise):
    """Sample k's ``y~`` is ``Pi1 y_k + N1 s_k`` with ``s_k`` the k-th draw of the noise stream."""
    f, g = _contractive()
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, keys=keys, noise=noise, rng=7)
    _, noise_rng = split_rng(7, False)  # the stream immerse gives the handle
    law, k = imm.keys.noise, imm.keys
    draw = noise_rng.laplace if noise == "laplace" else noise_rng.normal
    ys = np.sin(np.arange(600.0))[:, None]  # more than two blocks
    worst = 0.0
    for y in ys:
        expected = k.Pi1 @ y + k.N1 @ draw(law.mean, law.scale, (k.input_code.n_noise,))
        got = imm.encode_input(y)
        worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
    assert worst < 1e-13


def test_batches_take_the_next_samples_or_a_fresh_draw():
    rng = np.random.default_rng(3)
    blocks = NoiseBlocks(lambda shape: rng.normal(0.0, 1.0, shape), 2, rows=8)
    reference = np.random.default_rng(3).normal(0.0, 1.0, (8, 2))
    assert (blocks.take(()) == reference[0]).all()
    assert (blocks.take((3,)) == reference[1:4]).all()  # fits in the block: its next rows
    assert (blocks.take((2, 2)) == reference[4:8].reshape(2, 2, 2)).all()
    big = blocks.take((10,))  # more than is left: drawn on its own, the right shape
    assert big.shape == (10, 2) and not np.isin(big, reference).any()
    assert blocks.take((0,)).shape == (0, 2)


def test_a_batch_encodes_like_single_samples_and_bad_input_is_still_named():
    f, g = _contractive()
    imm = immerse(f, g, n_state=3, n_input=1, n_output=1, keys="dense", rng=1)
    ys = np.linspace(-1.0, 1.0, 5)[:, None]
    yt = imm.encode_input(ys)
    ut = np.stack([imm.target.output(imm.encode_state(np.ones(3)), row) for row in yt])
    assert np.allclose(imm.decode_output(ut, yt), np.ones(1) - ys, rtol=0, atol=1e-9)
    for bad in (np.nan, np.inf):
        with pytest.raises(NonFiniteError, match="y"):
            imm.encode_input(np.array([bad]))


def test_block_rows_bound_the_memory_drawn_ahead():
    assert block_rows(3) == 256 and block_rows(8192) == 1
    assert all(block_rows(w) * w <= 8192 for w in range(1, 8193))
