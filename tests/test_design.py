"""``immersion.Design``: the dimensions and coding options of an immersion as one checked value.

``immerse(f, g, design=d)`` and ``draw_keys(design=d)`` must equal the keyword forms bit for bit
(same keys, same encodings, same decodings for the same seed), a bad option must raise the error
``immerse`` raises for it, and the option list spelled in the three signatures must agree.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from immersion import Design, InvalidArgumentError, Keys, draw_keys, immerse
from immersion.keys import ModularKeys

ROOT = Path(__file__).resolve().parents[1]
A = np.array([[0.9, 0.1], [0.0, 0.8]])
B = np.array([0.0, 1.0])
DIMS = (2, 1, 1)


def f(x: Any, y: Any) -> Any:
    return A @ x + B * y[0]


def g(x: Any, y: Any) -> Any:
    return x[:1] + y


#: Option sets covering both arithmetics, both noise laws and both kinds of keys.
OPTION_SETS = [
    {},
    {"epsilon_input": 1e-2, "epsilon_output": 5e-3, "sensitivity_output": 2.0},
    {"noise": "gaussian", "delta_output": 1e-6, "noise_mean": 0.5},
    {"keys": "block", "block_size": 2, "extra_state": 3, "extra_input": 4},
    {"tolerance": None, "keys": "dense"},
    {"arithmetic": "modular"},
    {"arithmetic": "modular", "fraction_bits": 20, "keys": "block", "block_size": 3},
]


def run_loop(imm: Any) -> list[bytes]:
    """The bytes of three closed-loop samples: encodings, cloud results and decodings."""
    out = []
    xt = imm.encode_state(np.array([1.0, -1.0]))
    for k in range(3):
        yt = imm.encode_input(np.array([np.sin(k)]))
        ut = imm.target.output(xt, yt)
        u = imm.decode_output(ut, yt)
        xt = imm.target.step(xt, yt)
        out += [np.asarray(a).tobytes() for a in (yt, ut, u, xt)]
    return out + [np.asarray(imm.decode_state(xt)).tobytes()]


@pytest.mark.parametrize("options", OPTION_SETS)
def test_immerse_with_a_design_equals_immerse_with_keywords_bit_for_bit(options):
    by_keywords = immerse(f, g, *DIMS, rng=7, **options)
    by_design = immerse(f, g, design=Design(*DIMS, **options), rng=7)
    assert type(by_design) is type(by_keywords)
    assert by_design.keys.fingerprint == by_keywords.keys.fingerprint
    assert run_loop(by_design) == run_loop(by_keywords)


@pytest.mark.parametrize("options", OPTION_SETS)
def test_draw_keys_with_a_design_gives_the_keys_immerse_draws(options):
    design = Design(*DIMS, **options)
    keyword_options = {k: v for k, v in options.items() if k not in ("fraction_bits", "tolerance")}
    keys = draw_keys(design=design, rng=3)
    assert isinstance(keys, ModularKeys if design.arithmetic == "modular" else Keys)
    assert keys.fingerprint == draw_keys(*DIMS, rng=3, **keyword_options).fingerprint
    assert keys.fingerprint == immerse(f, g, design=design, rng=3).keys.fingerprint
    # round trip: the drawn keys handed back to immerse give the handle immerse drew itself
    # (the encoding noise comes from the same seed's second stream)
    given = immerse(f, g, design=design, keys=keys, rng=3)
    assert run_loop(given) == run_loop(immerse(f, g, design=design, rng=3))


def test_a_generator_rng_gives_the_same_keys_through_both_forms():
    design = Design(*DIMS, keys="block", block_size=2)
    via_design = draw_keys(design=design, rng=np.random.default_rng(5))
    via_keywords = draw_keys(*DIMS, keys="block", block_size=2, rng=np.random.default_rng(5))
    assert via_design.fingerprint == via_keywords.fingerprint


BAD_OPTIONS = [
    ("n_state", 0),
    ("n_input", 1.5),
    ("extra_output", True),
    ("epsilon_input", -1.0),
    ("epsilon_output", float("nan")),
    ("sensitivity_input", "1"),
    ("noise", "Laplace"),
    ("delta_input", 1e-5),  # Laplace is pure DP
    ("noise_mean", float("inf")),
    ("keys", "Dense"),
    ("block_size", 0),
    ("arithmetic", "int"),
    ("fraction_bits", 16),  # float arithmetic
    ("tolerance", 0.0),
    ("backend", 3),
    ("dtype", 64),
    ("n_public", 0),
]


@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS)
def test_a_bad_option_is_named_with_the_message_immerse_gives(name, value):
    dims = dict(zip(("n_state", "n_input", "n_output"), DIMS, strict=True))
    options = {name: value}
    dims.update({k: options.pop(k) for k in list(options) if k in dims})
    with pytest.raises(InvalidArgumentError) as by_design:
        Design(*dims.values(), **options)
    assert by_design.value.argument == name
    assert str(by_design.value).startswith(f"{name}: ")
    with pytest.raises(InvalidArgumentError) as by_immerse:
        immerse(f, g, *dims.values(), rng=0, **options)
    assert str(by_immerse.value) == str(by_design.value)


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"epsilon_input": 1e-2}, "epsilon_input"),
        ({"noise": "gaussian"}, "noise"),
        ({"sensitivity_output": 2.0}, "sensitivity_output"),
        ({"backend": "torch"}, "backend"),
        ({"device": "cuda"}, "device"),
        ({"fraction_bits": 63}, "fraction_bits"),  # values would not fit in 2^64
    ],
)
def test_modular_designs_refuse_what_does_not_apply_to_them(options, name):
    with pytest.raises(InvalidArgumentError) as exc:
        Design(*DIMS, arithmetic="modular", **options)
    assert exc.value.argument == name


def test_defaults_are_resolved_once_so_equal_designs_compare_equal():
    assert Design(*DIMS) == Design(*DIMS, block_size=32, extra_state=np.int64(1))
    assert Design(*DIMS).block_size == 32
    modular = Design(*DIMS, arithmetic="modular")
    assert (modular.block_size, modular.fraction_bits, modular.targets) == (16, 32, None)
    gaussian = Design(*DIMS, noise="gaussian")
    assert (gaussian.delta_input, gaussian.delta_output) == (1e-5, 1e-5)
    assert Design(*DIMS, epsilon_input=1).epsilon_input == 1.0
    assert type(Design(*DIMS, epsilon_input=1).epsilon_input) is float
    assert Design(*DIMS).immersed_sizes == (3, 3, 3)
    assert dataclasses.replace(gaussian) == gaussian  # re-validating resolved values is a no-op


def test_a_design_is_frozen_and_hashable():
    design = Design(*DIMS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        design.n_state = 3  # type: ignore[misc]
    assert hash(design) == hash(Design(*DIMS))


def test_the_two_call_forms_do_not_mix():
    design = Design(*DIMS)
    for kwargs, name in [
        ({"n_state": 2}, "n_state"),
        ({"epsilon_input": 1e-2}, "epsilon_input"),
        ({"keys": "dense"}, "keys"),
        ({"arithmetic": "modular"}, "arithmetic"),
        ({"tolerance": None}, "tolerance"),
    ]:
        with pytest.raises(InvalidArgumentError, match="part of design=") as exc:
            immerse(f, g, design=design, rng=0, **kwargs)
        assert exc.value.argument == name
    with pytest.raises(InvalidArgumentError, match="part of design=") as exc:
        draw_keys(design=design, block_size=8)
    assert exc.value.argument == "block_size"
    with pytest.raises(InvalidArgumentError, match="Design") as exc:
        immerse(f, g, design={"n_state": 2}, rng=0)  # type: ignore[arg-type]
    assert exc.value.argument == "design"
    with pytest.raises(InvalidArgumentError, match="required") as exc:
        draw_keys(2, 1, rng=0)
    assert exc.value.argument == "n_output"


def test_the_options_of_immerse_and_draw_keys_are_the_fields_of_design():
    """The option list is spelled in three signatures (every option visible in ``help()`` and to
    type checkers); this keeps them one list: same names, same defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(Design)}
    for function, left_out in [
        (immerse, ()),
        (draw_keys, ("fraction_bits", "tolerance", "backend", "device", "dtype", "n_public")),
    ]:
        params = inspect.signature(function).parameters
        options = {
            name: p.default
            for name, p in params.items()
            if name not in ("f", "g", "design", "probe", "rng", "secure")
        }
        expected = {k: v for k, v in fields.items() if k not in left_out}
        expected.update(n_state=None, n_input=None, n_output=None)  # required unless design=
        assert options == expected, function.__name__


def test_plugins_build_immersions_through_the_public_design():
    """No plugin reaches into the key drawing or option checks behind ``immerse``; the random
    stream helpers of :mod:`immersion.coding.keygen` are all they may take from it."""
    allowed = {"split_rng", "resolve_rng", "warn_seeded_key"}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "immersion.coding.keygen",
                "immersion.coding.design",
                "immersion.coding.factory",
            ):
                names = {alias.name for alias in node.names}
                assert node.module == "immersion.coding.keygen" and names <= allowed, (path, names)
