"""The cloud-side target carries no N1, no Pi3_left and no noise generator (DESIGN.md)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from immersion import immerse
from immersion.testing import assert_target_has_no_secrets


@pytest.mark.parametrize("kind", ["dense", "block"])
@pytest.mark.parametrize("n_output", [1, 4])
def test_pickled_target_has_no_secrets_and_still_works(kind, n_output):
    def f(x, y):
        return np.tanh(0.5 * x + y.sum())

    def g(x, y):
        return np.repeat(x.sum() + y[0], n_output)

    imm = immerse(f, g, n_state=3, n_input=2, n_output=n_output, keys=kind, block_size=2, rng=0)
    blob = assert_target_has_no_secrets(imm)
    cloud = pickle.loads(blob)
    x0 = np.array([0.1, 0.2, 0.3])
    y = np.array([0.5, -0.5])
    yt = imm.encode_input(y)
    xt = cloud.step(imm.encode_state(x0), yt)
    np.testing.assert_allclose(imm.decode_state(xt), f(x0, y), atol=1e-9)
    np.testing.assert_allclose(
        imm.decode_output(cloud.output(xt, yt), yt), g(f(x0, y), y), atol=1e-9
    )


def test_the_secret_check_can_fail():
    """If the target did hold N1, the check must notice (guards against a vacuous test)."""
    imm = immerse(lambda x, y: x, lambda x, y: x, n_state=2, n_input=1, n_output=2, rng=0)
    imm.target.leak = imm.keys.N1.copy()
    with pytest.raises(AssertionError, match="N1"):
        assert_target_has_no_secrets(imm)
