"""Plugin registry (pluggy) and the conformance of every registered algorithm and backend."""

from __future__ import annotations

import numpy as np
import pytest
from immersion import PluginError, immerse
from immersion.plugins.hookspecs import AlgorithmSpec, BackendSpec, hookimpl
from immersion.plugins.manager import build_registry, registry
from immersion.testing import assert_close_to_plain, assert_target_has_no_secrets, run_side_by_side


def test_builtins_and_examples_are_registered_through_entry_points():
    reg = registry()
    assert {"numpy", "torch"} <= set(reg.backends)
    assert "lqr-kalman" in reg.algorithms
    assert any(c.parent == "demo" and c.name == "controller" for c in reg.commands())


class _Duplicate:
    @hookimpl
    def immersion_register_backends(self):
        return [BackendSpec("numpy", lambda **kw: None, "an impostor")]


def test_duplicate_names_raise_unless_forced():
    with pytest.raises(PluginError, match="numpy"):
        build_registry(extra_plugins=(_Duplicate(),))
    forced = build_registry(extra_plugins=(_Duplicate(),), force=True)
    assert forced.backends["numpy"].description in (
        "an impostor",
        "numpy float64 reference backend",
    )


class _ThirdParty:
    @hookimpl
    def immersion_register_algorithms(self):
        def build():
            class Leaky:
                n_state, n_input, n_output = 2, 1, 1
                initial_state = np.zeros(2)

                @staticmethod
                def f(x, y):
                    return np.array([0.9 * x[0] + y[0], 0.5 * x[1] + x[0] ** 2 * 0.1])

                @staticmethod
                def g(x, y):
                    return np.array([x[0] - x[1]])

            return Leaky()

        return [AlgorithmSpec("leaky", build, "a third-party test algorithm")]


def test_third_party_plugin_registers_an_algorithm():
    reg = build_registry(extra_plugins=(_ThirdParty(),))
    assert reg.algorithm("leaky").description == "a third-party test algorithm"


ALGORITHMS = sorted(build_registry(extra_plugins=(_ThirdParty(),)).algorithms.items())


@pytest.mark.parametrize("name,spec", ALGORITHMS, ids=[n for n, _ in ALGORITHMS])
@pytest.mark.parametrize("backend", ["numpy"])
def test_conformance_of_registered_algorithms(name, spec, backend):
    """Decode-exactness, target-has-no-secrets and shape checks for every registered algorithm."""
    algo = spec.build()
    imm = immerse(
        algo.f,
        algo.g,
        n_state=algo.n_state,
        n_input=algo.n_input,
        n_output=algo.n_output,
        backend=backend,
        rng=0,
        probe=(algo.initial_state, np.zeros(algo.n_input)),
    )
    inputs = np.random.default_rng(1).standard_normal((100, algo.n_input)) * 0.1
    run = run_side_by_side(imm, algo.f, algo.g, x0=algo.initial_state, inputs=inputs)
    assert_close_to_plain(run, rtol=1e-9)
    assert_target_has_no_secrets(imm)
    with pytest.raises(ValueError, match="encoded_input"):
        imm.target.step(imm.encode_state(algo.initial_state), np.zeros(algo.n_input))


@pytest.mark.parametrize("name", sorted(registry().backends))
def test_every_backend_builds_and_decodes(name):
    if name == "torch":
        pytest.importorskip("torch")
    imm = immerse(
        lambda x, y: 0.5 * x + y,
        lambda x, y: 2 * x,
        n_state=2,
        n_input=2,
        n_output=2,
        backend=name,
        rng=0,
    )
    y = imm.backend.asarray(np.array([0.25, -0.5]))
    yt = imm.encode_input(y)
    x1 = imm.decode_state(imm.target.step(imm.encode_state(imm.backend.asarray(np.zeros(2))), yt))
    np.testing.assert_allclose(imm.backend.to_numpy(x1), [0.25, -0.5], atol=1e-9)
