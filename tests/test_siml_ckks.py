"""The CKKS (TenSEAL) baseline for the nn-x2 network: correctness of the encrypted step, timing
fields, errors."""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any

import numpy as np
import pytest
from immersion import InvalidArgumentError, OptionalDependencyError
from immersion_siml import ckks


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip(
        "sklearn.datasets", reason="scikit-learn provides the digits data"
    )
    x, y = datasets.load_digits(return_X_y=True)
    return x / 16.0, y


@pytest.fixture(scope="module")
def measured(digits):
    pytest.importorskip("tenseal", reason="the CKKS baseline needs tenseal (extra 'baselines')")
    x, y = digits
    return ckks.measure_ckks_training(x, y, n_samples=2, seed=1)


def test_plain_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    w = ckks.init_weights(5, 4, 3, seed=2)
    x, y = rng.random(5), np.eye(3)[1]

    def loss(p):
        a = x @ p["W1"] + p["b1"]
        z = (a * a) @ p["W2"] + p["b2"]
        return 0.5 * float(np.sum((z - y) ** 2))

    g = ckks.plain_gradients(x, y, w)
    eps = 1e-6
    for name, value in w.items():
        num = np.zeros_like(value)
        for i in np.ndindex(value.shape):
            up = {k: v.copy() for k, v in w.items()}
            dn = {k: v.copy() for k, v in w.items()}
            up[name][i] += eps
            dn[name][i] -= eps
            num[i] = (loss(up) - loss(dn)) / (2 * eps)
        np.testing.assert_allclose(g[name], num, rtol=1e-6, atol=1e-9)


def test_count_parameters():
    assert ckks.count_parameters(64) == 64 * 16 + 16 + 16 * 10 + 10
    assert ckks.count_parameters(784, 16, 10) == 12730


@pytest.mark.slow
def test_encrypted_gradients_match_float64(measured):
    # CKKS noise at scale 2**40 after depth 7 is ~1e-5; a wrong circuit or packing is off by O(1).
    assert 0.0 <= measured.gradient_max_rel_error < 1e-3


@pytest.mark.slow
def test_timing_fields(measured, digits):
    m = measured
    n = len(digits[1])
    assert m.n_measured == 2 and m.n_train == n
    assert m.extrapolated is True
    assert m.per_sample_s == pytest.approx(m.encrypt_s + m.compute_s + m.decrypt_s)
    assert m.extrapolated_epoch_s == pytest.approx(m.per_sample_s * n, rel=1e-12)
    assert m.per_sample_s > m.plain_per_sample_s > 0
    assert min(m.encrypt_s, m.compute_s, m.decrypt_s, m.setup_s) > 0
    assert m.poly_modulus_degree == 16384 and m.parameters == 1210
    assert m.upload_bytes > 0 and m.download_bytes > 0
    d = m.as_dict()
    assert d["extrapolated"] is True and d["parameters"] == 1210
    json.dumps(d)


@pytest.mark.slow
def test_padded_shapes_are_exact():
    pytest.importorskip("tenseal", reason="the CKKS baseline needs tenseal (extra 'baselines')")
    rng = np.random.default_rng(3)
    x, y = rng.random((5, 9)), rng.integers(0, 3, 5)
    m = ckks.measure_ckks_training(x, y, hidden=5, n_classes=3, n_samples=1, seed=4)
    assert m.gradient_max_rel_error < 1e-3
    assert m.parameters == 9 * 5 + 5 + 5 * 3 + 3


def test_missing_tenseal_raises(monkeypatch):
    monkeypatch.setitem(sys.modules, "tenseal", None)
    spec = importlib.util.find_spec("immersion_siml.ckks")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)  # a fresh copy imports without tenseal (sys.modules untouched)
    assert fresh.tenseal_available() is False
    assert ckks.tenseal_available() is False
    x, y = np.random.default_rng(0).random((4, 3)), np.array([0, 1, 2, 3])
    with pytest.raises(OptionalDependencyError, match="baselines") as err:
        ckks.measure_ckks_training(x, y, n_samples=1)
    assert "tenseal" in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"x_train": np.zeros(4)}, "x_train"),
        ({"x_train": np.full((4, 3), np.nan)}, "x_train"),
        ({"y_train": np.zeros(3, dtype=int)}, "y_train"),
        ({"y_train": np.array([0, 1, 2, 10])}, "y_train"),
        ({"y_train": np.array([0.0, 1.0, 2.0, 3.0])}, "y_train"),
        ({"n_samples": 0}, "n_samples"),
        ({"n_samples": 5}, "n_samples"),
        ({"hidden": 0}, "hidden"),
        ({"hidden": 10_000}, "hidden"),
        ({"n_classes": 1}, "n_classes"),
    ],
)
def test_bad_input_names_the_argument(kwargs, argument):
    args: dict[str, Any] = {
        "x_train": np.random.default_rng(0).random((4, 3)),
        "y_train": np.array([0, 1, 2, 3]),
        "n_samples": 1,
    }
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError) as err:
        ckks.measure_ckks_training(args.pop("x_train"), args.pop("y_train"), **args)
    assert err.value.argument == argument
    assert argument in str(err.value)
