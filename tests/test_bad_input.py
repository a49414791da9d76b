"""Bad input gets a clear exception that names the offending argument.

Covers ``immerse`` arguments, the user's ``f``/``g`` (at immerse time through the probe and at
run time through ``target.step``/``target.output``), encoded vectors, user keys given to
``Keys.from_matrices``, key files (``save_keys``/``load_keys``) and the precision check
(``PrecisionError`` and its suggested epsilons).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from immersion import (
    ImmersionError,
    InvalidArgumentError,
    KeyFileError,
    Keys,
    NonFiniteError,
    PrecisionError,
    immerse,
    load_keys,
    save_keys,
)
from immersion.keys import store

N_STATE, N_INPUT, N_OUTPUT = 2, 1, 1
A = np.array([[0.9, 0.1], [0.0, 0.8]])
B = np.array([0.0, 1.0])

#: Hypothesis settings: few examples (every test stays well under a second or two), no deadline
#: (the first call builds the plugin registry), and tmp_path / module fixtures are fine here.
FAST = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def f(x: Any, y: Any) -> Any:
    return A @ x + B * y[0]


def g(x: Any, y: Any) -> Any:
    return x[:1] + y


def make(**kwargs: Any) -> Any:
    """``immerse(f, g, 2, 1, 1, rng=0, **kwargs)``."""
    kwargs.setdefault("rng", 0)
    return immerse(kwargs.pop("f", f), kwargs.pop("g", g), N_STATE, N_INPUT, N_OUTPUT, **kwargs)


def assert_names(exc_info: pytest.ExceptionInfo[Any], argument: str) -> None:
    """The exception carries ``argument`` and its message starts with it."""
    assert exc_info.value.argument == argument
    assert str(exc_info.value).startswith(f"{argument}: ")


@pytest.fixture(scope="module")
def imm() -> Any:
    return make()


@pytest.fixture(scope="module")
def encoded(imm: Any) -> dict[str, np.ndarray]:
    yt = imm.encode_input(np.array([0.5]))
    xt = imm.encode_state(np.array([1.0, -1.0]))
    return {"encoded_state": xt, "encoded_input": yt, "encoded_output": imm.target.output(xt, yt)}


def nonfinite_array(last_dim: int, *, max_batch_dims: int = 2) -> st.SearchStrategy[np.ndarray]:
    """Arrays of shape (*batch, last_dim) with at least one NaN or +-inf somewhere."""

    @st.composite
    def build(draw: Any) -> np.ndarray:
        batch = draw(st.lists(st.integers(1, 3), max_size=max_batch_dims))
        shape = tuple(batch) + (last_dim,)
        size = int(np.prod(shape))
        arr = np.array(draw(st.lists(st.floats(-1e3, 1e3), min_size=size, max_size=size))).reshape(
            shape
        )
        for _ in range(draw(st.integers(1, size))):
            arr.flat[draw(st.integers(0, size - 1))] = draw(
                st.sampled_from([np.nan, np.inf, -np.inf])
            )
        return arr

    return build()


# ============================================================== immerse(): arguments


@pytest.mark.parametrize(
    "keyword", ["epsilon", "eps_input", "extra_states", "tolerence", "seed", "sensitivity"]
)
def test_unknown_keyword_raises_type_error_naming_it(keyword: str) -> None:
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'"):
        make(**{keyword: 1})


def test_options_are_keyword_only() -> None:
    # a sixth positional argument (meant as extra_state) must not be silently accepted
    with pytest.raises(TypeError, match="positional argument"):
        immerse(f, g, N_STATE, N_INPUT, N_OUTPUT, 1)


@FAST
@given(
    name=st.sampled_from(
        ["extra_state", "extra_input", "extra_output", "n_state", "n_input", "n_output"]
    ),
    value=st.integers(max_value=0),
)
def test_sizes_below_one_name_the_argument(name: str, value: int) -> None:
    kwargs: dict[str, Any] = {"extra_state": 1, "extra_input": 2, "extra_output": 2}
    kwargs[name] = value
    dims = {"n_state": N_STATE, "n_input": N_INPUT, "n_output": N_OUTPUT}
    dims.update({k: kwargs.pop(k) for k in list(kwargs) if k.startswith("n_")})
    with pytest.raises(InvalidArgumentError, match=r"integer >= 1") as exc:
        immerse(f, g, dims["n_state"], dims["n_input"], dims["n_output"], rng=0, **kwargs)
    assert_names(exc, name)


@FAST
@given(
    name=st.sampled_from(["extra_state", "extra_input", "extra_output"]),
    value=st.one_of(
        st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
        st.text(max_size=3),
        st.booleans(),
        st.none(),
        st.just([2]),
        st.just(2.0),
    ),
)
def test_extra_sizes_must_be_integers(name: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(**{name: value})
    assert_names(exc, name)
    assert "integer" in str(exc.value)


def test_numpy_integer_extra_size_is_accepted() -> None:
    assert make(extra_state=np.int64(3)).keys.dims["extra_state"] == 3


@FAST
@given(
    name=st.sampled_from(
        ["epsilon_input", "epsilon_output", "sensitivity_input", "sensitivity_output", "tolerance"]
    ),
    value=st.one_of(
        st.floats(max_value=0.0),
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.integers(max_value=0),
        st.just("1e-3"),
        st.just(True),
        st.just(None),
    ),
)
def test_epsilons_and_sensitivities_must_be_positive_and_finite(name: str, value: Any) -> None:
    if name == "tolerance" and value is None:  # tolerance=None is documented: it disables the check
        return
    with pytest.raises(InvalidArgumentError) as exc:
        make(**{name: value})
    assert_names(exc, name)
    assert "positive" in str(exc.value) or "> 0" in str(exc.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("noise", "foo"),
        ("noise", "Laplace"),
        ("noise", None),
        ("keys", "foo"),
        ("keys", "Dense"),
        ("keys", ["dense"]),
        ("backend", "foo"),
        ("backend", "jax"),
        ("dtype", "float16"),
    ],
)
def test_unknown_option_value_names_the_option_and_the_choices(name: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(**{name: value})
    assert_names(exc, name)
    assert repr(value) in str(exc.value)


@FAST
@given(name=st.sampled_from(["noise", "keys", "backend"]), value=st.text(max_size=8))
def test_any_unknown_option_string_is_refused(name: str, value: str) -> None:
    allowed = {
        "noise": {"laplace", "gaussian"},
        "keys": {"auto", "dense", "block"},
        "backend": {"numpy", "torch"},
    }
    if value in allowed[name]:
        return
    with pytest.raises(InvalidArgumentError) as exc:
        make(**{name: value})
    assert_names(exc, name)
    # the message lists what is allowed
    assert all(choice in str(exc.value) for choice in allowed[name])


def test_keys_given_as_an_array_names_keys() -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(keys=np.eye(3))
    assert_names(exc, "keys")


def test_non_numeric_noise_mean_names_it() -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(noise_mean="a")
    assert_names(exc, "noise_mean")


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"noise_mean": math.nan}, "noise_mean"),
        ({"delta_input": 1e-5}, "delta_input"),  # Laplace is pure DP
        ({"noise": "gaussian", "delta_output": 1.5}, "delta_output"),
        ({"noise": "gaussian", "delta_input": 0.0}, "delta_input"),
        ({"block_size": 0}, "block_size"),
        ({"rng": -1}, "rng"),
        ({"rng": "seed"}, "rng"),
        ({"rng": 1, "secure": True}, "rng"),
        ({"device": "cuda"}, "device"),  # numpy runs on the CPU only
        ({"probe": [np.zeros(2), np.zeros(1)]}, "probe"),  # must be a tuple
        ({"probe": (np.zeros(3), np.zeros(1))}, "probe[0]"),
    ],
)
def test_other_bad_arguments_are_named(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(**kwargs)
    assert_names(exc, argument)


def test_nan_probe_point_is_a_non_finite_error() -> None:
    with pytest.raises(NonFiniteError) as exc:
        make(probe=(np.zeros(2), np.array([math.nan])))
    assert_names(exc, "probe[1]")


# ============================================================== f and g at immerse time (the probe)


@pytest.mark.parametrize("which", ["f", "g"])
def test_not_callable_or_wrong_signature(which: str) -> None:
    with pytest.raises(InvalidArgumentError, match="callable") as exc:
        make(**{which: 3.0})
    assert_names(exc, which)
    with pytest.raises(InvalidArgumentError, match="must take") as exc:
        make(**{which: lambda x: x})
    assert_names(exc, which)


@FAST
@given(shape=st.lists(st.integers(0, 3), max_size=3).map(tuple))
def test_f_returning_a_wrong_shape_is_caught_by_the_probe(shape: tuple[int, ...]) -> None:
    if shape == (N_STATE,):
        return
    with pytest.raises(InvalidArgumentError, match=r"returned shape") as exc:
        make(f=lambda x, y: np.zeros(shape))
    assert_names(exc, "f")
    assert not isinstance(exc.value, NonFiniteError)
    assert f"expected ({N_STATE},)" in str(exc.value)


@FAST
@given(shape=st.lists(st.integers(0, 3), max_size=3).map(tuple))
def test_g_returning_a_wrong_shape_is_caught_by_the_probe(shape: tuple[int, ...]) -> None:
    if shape in ((N_OUTPUT,), (), (1, 1)):  # a scalar or a 1x1 is accepted for a one-element output
        make(g=lambda x, y: np.zeros(shape))
        return
    with pytest.raises(InvalidArgumentError, match=r"returned shape") as exc:
        make(g=lambda x, y: np.zeros(shape))
    assert_names(exc, "g")


@pytest.mark.parametrize("which", ["f", "g"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_f_or_g_returning_nan_or_inf_is_caught_by_the_probe(which: str, bad: float) -> None:
    size = N_STATE if which == "f" else N_OUTPUT
    with pytest.raises(NonFiniteError, match="NaN or inf") as exc:
        make(**{which: lambda x, y: np.full(size, bad)})
    assert_names(exc, which)


def test_f_raising_at_the_probe_point_names_f_and_suggests_probe() -> None:
    def picky(x: Any, y: Any) -> Any:
        if y[0] == 0:
            raise ZeroDivisionError("y must be non-zero")
        return A @ x / y[0]

    with pytest.raises(InvalidArgumentError) as exc:
        make(f=picky)
    assert_names(exc, "f")
    assert "ZeroDivisionError" in str(exc.value) and "probe=" in str(exc.value)
    assert isinstance(exc.value.__cause__, ZeroDivisionError)
    # the suggested fix works
    imm = make(f=picky, probe=(np.zeros(2), np.ones(1)))
    assert imm.n_state == N_STATE


def test_f_using_w_needs_n_public() -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        make(f=lambda x, y, w: A @ x + w)
    assert_names(exc, "n_public")


# ============================================================== f and g at run time

BACKENDS = [
    "numpy",
    pytest.param(
        "torch",
        marks=pytest.mark.skipif(
            __import__("importlib").util.find_spec("torch") is None,
            reason="torch extra not installed",
        ),
    ),
]


def _runtime_immersion(
    backend: str, f_bad: Callable[..., Any] | None = None, g_bad: Callable[..., Any] | None = None
) -> Any:
    """f and g are fine for y < 1 (the probe point is y = 0) and misbehave above."""

    def f_run(x: Any, y: Any) -> Any:
        return f_bad(x, y) if float(y[0]) > 1 and f_bad else 0.5 * x + y[0]

    def g_run(x: Any, y: Any) -> Any:
        return g_bad(x, y) if float(y[0]) > 1 and g_bad else x[:1] + y

    return immerse(f_run, g_run, N_STATE, N_INPUT, N_OUTPUT, backend=backend, rng=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("which", "bad", "error", "text"),
    [
        ("f", lambda x, y: x * float("nan"), NonFiniteError, "NaN or inf"),
        ("f", lambda x, y: x * float("inf"), NonFiniteError, "NaN or inf"),
        ("f", lambda x, y: x[:1], InvalidArgumentError, "returned shape (1,), expected (2,)"),
        ("g", lambda x, y: x[:1] * float("nan"), NonFiniteError, "NaN or inf"),
        ("g", lambda x, y: x, InvalidArgumentError, "returned shape (2,), expected (1,)"),
    ],
)
def test_f_or_g_misbehaving_only_for_some_inputs_is_caught_at_run_time(
    backend: str, which: str, bad: Callable[..., Any], error: type, text: str
) -> None:
    imm = _runtime_immersion(backend, **{f"{which}_bad": bad})  # the probe (y = 0) passes
    xt = imm.encode_state([1.0, -1.0])
    good_y, bad_y = imm.encode_input([0.5]), imm.encode_input([5.0])
    imm.target.step(xt, good_y)  # fine for small inputs
    imm.target.output(xt, good_y)
    call = imm.target.step if which == "f" else imm.target.output
    with pytest.raises(error) as exc:
        call(xt, bad_y)
    assert type(exc.value) is error
    assert_names(exc, which)
    assert text in str(exc.value)


@pytest.mark.parametrize(
    ("which", "bad"),
    [
        ("f", lambda x, y: x * float("nan")),
        ("f", lambda x, y: x * float("inf")),
        ("f", lambda x, y: x[:1]),
        ("f", lambda x, y: [1.0, "x"]),
        ("g", lambda x, y: x[:1] * float("nan")),
        ("g", lambda x, y: x),
        ("g", lambda x, y: np.array([1 + 1j])),
    ],
)
def test_advance_raises_what_output_then_step_raise(which: str, bad: Callable[..., Any]) -> None:
    """The short path of advance (dense keys, numpy float64) names the culprit as the checked
    path does, in its order, without calling f or g a second time."""
    calls: list[int] = []

    def counted(x: Any, y: Any) -> Any:
        calls.append(1)
        return bad(x, y)

    imm = _runtime_immersion("numpy", **{f"{which}_bad": counted})
    xt, bad_y = imm.encode_state([1.0, -1.0]), imm.encode_input([5.0])
    with pytest.raises(ImmersionError) as expected:
        imm.target.output(xt, bad_y)
        imm.target.step(xt, bad_y)
    calls.clear()
    with pytest.raises(ImmersionError) as got:
        imm.target.advance(xt, bad_y)
    assert type(got.value) is type(expected.value) and str(got.value) == str(expected.value)
    assert got.value.argument == which and len(calls) == 1


def test_missing_public_signal_at_run_time_is_named() -> None:
    imm = immerse(lambda x, y, w: 0.5 * x + w, g, N_STATE, N_INPUT, N_OUTPUT, n_public=2, rng=0)
    xt, yt = imm.encode_state([1.0, 2.0]), imm.encode_input([0.5])
    with pytest.raises(InvalidArgumentError) as exc:
        imm.target.step(xt, yt)
    assert_names(exc, "w")


# ============================================================== y, state and encoded vectors


@FAST
@given(y=nonfinite_array(N_INPUT))
def test_nonfinite_y_is_refused(imm: Any, y: np.ndarray) -> None:
    with pytest.raises(NonFiniteError) as exc:
        imm.encode_input(y)
    assert_names(exc, "y")
    with pytest.raises(NonFiniteError) as exc:  # same answer for a plain list
        imm.encode_input(y.tolist())
    assert_names(exc, "y")


@FAST
@given(state=nonfinite_array(N_STATE))
def test_nonfinite_state_is_refused(imm: Any, state: np.ndarray) -> None:
    with pytest.raises(NonFiniteError) as exc:
        imm.encode_state(state)
    assert_names(exc, "state")


@FAST
@given(
    last=st.integers(0, 6).filter(lambda n: n != N_INPUT),
    batch=st.lists(st.integers(1, 3), max_size=2),
)
def test_y_of_the_wrong_length_is_refused(imm: Any, last: int, batch: list[int]) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"\(\.\.\., {N_INPUT}\)") as exc:
        imm.encode_input(np.zeros(tuple(batch) + (last,)))
    assert_names(exc, "y")
    assert not isinstance(exc.value, NonFiniteError)


@pytest.mark.parametrize("value", [0.5, np.float64(0.5), np.array(0.5)])
def test_scalar_y_is_refused(imm: Any, value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        imm.encode_input(value)
    assert_names(exc, "y")


TARGET_CALLS = [
    ("step", "encoded_state"),
    ("step", "encoded_input"),
    ("output", "encoded_state"),
    ("output", "encoded_input"),
]
DECODE_CALLS = [
    ("decode_output", "encoded_output"),
    ("decode_output", "encoded_input"),
    ("decode_state", "encoded_state"),
]


def _call(imm: Any, method: str, args: dict[str, Any]) -> Any:
    if method in ("step", "output"):
        return getattr(imm.target, method)(args["encoded_state"], args["encoded_input"])
    if method == "decode_output":
        return imm.decode_output(args["encoded_output"], args["encoded_input"])
    return imm.decode_state(args["encoded_state"])


@FAST
@given(
    call=st.sampled_from(TARGET_CALLS + DECODE_CALLS),
    length=st.integers(0, 8),
    as_list=st.booleans(),
)
def test_encoded_vector_of_the_wrong_length_is_named(
    imm: Any, encoded: dict[str, np.ndarray], call: tuple[str, str], length: int, as_list: bool
) -> None:
    method, argument = call
    size = encoded[argument].shape[-1]
    if length == size:
        return
    bad = np.resize(encoded[argument], length)
    args = {**encoded, argument: bad.tolist() if as_list else bad}
    with pytest.raises(InvalidArgumentError) as exc:
        _call(imm, method, args)
    assert_names(exc, argument)
    assert f"{size}" in str(exc.value) and not isinstance(exc.value, NonFiniteError)


@FAST
@given(
    call=st.sampled_from(TARGET_CALLS + DECODE_CALLS),
    position=st.integers(0, 100),
    bad=st.sampled_from([math.nan, math.inf, -math.inf]),
)
def test_nonfinite_encoded_vector_is_named(
    imm: Any, encoded: dict[str, np.ndarray], call: tuple[str, str], position: int, bad: float
) -> None:
    method, argument = call
    vec = encoded[argument].copy()
    vec[position % vec.shape[-1]] = bad
    with pytest.raises(NonFiniteError) as exc:
        _call(imm, method, {**encoded, argument: vec})
    assert_names(exc, argument)


@pytest.mark.parametrize("method", ["step", "output"])
def test_target_refuses_a_batch_of_encoded_vectors(
    imm: Any, encoded: dict[str, np.ndarray], method: str
) -> None:
    # the target runs one step at a time: a (1, n) array is a shape error, not a silent broadcast
    with pytest.raises(InvalidArgumentError) as exc:
        getattr(imm.target, method)(encoded["encoded_state"][None, :], encoded["encoded_input"])
    assert_names(exc, "encoded_state")


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="torch extra not installed"
)
def test_torch_tensors_are_checked_the_same_way() -> None:
    import torch

    imm = make(backend="torch", f=lambda x, y: 0.5 * x + y[0], g=lambda x, y: x[:1] + y)
    xt = imm.encode_state(torch.tensor([1.0, -1.0], dtype=torch.float64))
    yt = imm.encode_input(torch.tensor([0.5], dtype=torch.float64))
    with pytest.raises(NonFiniteError) as exc:
        imm.encode_input(torch.tensor([math.nan], dtype=torch.float64))
    assert_names(exc, "y")
    with pytest.raises(InvalidArgumentError) as exc:
        imm.target.step(xt[:-1], yt)
    assert_names(exc, "encoded_state")
    with pytest.raises(NonFiniteError) as exc:
        imm.target.output(xt, yt * math.inf)
    assert_names(exc, "encoded_input")
    with pytest.raises(InvalidArgumentError) as exc:
        imm.decode_state(xt[:-1])
    assert_names(exc, "encoded_state")


@pytest.mark.parametrize(
    "call",
    ["encode_input_str_array", "encode_input_object_array", "step_str_list", "step_str_array"],
)
def test_non_numeric_vectors_are_named(imm: Any, encoded: dict[str, np.ndarray], call: str) -> None:
    n = encoded["encoded_state"].shape[0]
    actions = {
        "encode_input_str_array": ("y", lambda: imm.encode_input(np.array(["a"]))),
        "encode_input_object_array": ("y", lambda: imm.encode_input(np.array([None]))),
        "step_str_list": (
            "encoded_state",
            lambda: imm.target.step(["a"] * n, encoded["encoded_input"]),
        ),
        "step_str_array": (
            "encoded_state",
            lambda: imm.target.step(np.array(["a"] * n), encoded["encoded_input"]),
        ),
    }
    argument, action = actions[call]
    with pytest.raises(InvalidArgumentError) as exc:
        action()
    assert_names(exc, argument)


def test_complex_y_array_is_refused_like_a_complex_list(imm: Any) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        imm.encode_input([1.0 + 1.0j])
    assert_names(exc, "y")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InvalidArgumentError) as exc:
            imm.encode_input(np.array([1.0 + 1.0j]))
    assert_names(exc, "y")


# ============================================================== Keys.from_matrices


@pytest.fixture(scope="module")
def mats() -> dict[str, np.ndarray]:
    k = Keys.draw(n_state=N_STATE, n_input=N_INPUT, n_output=N_OUTPUT, rng=0)
    return {
        "Pi1": k.Pi1,
        "Pi2": k.Pi2,
        "Pi3": k.Pi3,
        "Pi4": k.Pi4,
        "N1": k.N1,
        "Pi1_left": k.Pi1_left,
        "Pi2_left": k.Pi2_left,
        "Pi3_left": k.Pi3_left,
    }


def _user_keys(mats: dict[str, np.ndarray], **override: Any) -> Keys:
    kwargs = {**mats, **override}
    return Keys.from_matrices(**kwargs)


def test_valid_user_matrices_are_accepted_and_immerse(mats: dict[str, np.ndarray]) -> None:
    keys = _user_keys(mats)
    imm = make(keys=keys)
    yt = imm.encode_input([0.5])
    xt = imm.encode_state([1.0, -1.0])
    assert abs(imm.decode_output(imm.target.output(xt, yt), yt)[0] - 1.5) < 1e-6


@pytest.mark.parametrize(
    ("name", "bad", "text"),
    [
        ("Pi1", lambda m: np.zeros((3, 1)), "full column rank"),
        ("Pi2", lambda m: np.c_[m["Pi2"][:, 0], 2 * m["Pi2"][:, 0]], "full column rank"),
        ("Pi3", lambda m: 0 * m["Pi3"], "full column rank"),
    ],
)
def test_rank_deficient_pi_is_named(
    mats: dict[str, np.ndarray], name: str, bad: Callable[..., Any], text: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=text) as exc:
        _user_keys(
            mats,
            **{name: bad(mats), f"{name}_left": None, **({"N1": None} if name == "Pi1" else {})},
        )
    assert_names(exc, name)


@pytest.mark.parametrize(
    ("name", "bad", "text"),
    [
        ("Pi1", lambda m: m["Pi1"].T, "tall"),
        ("Pi2", lambda m: np.eye(3), "tall"),
        ("Pi3", lambda m: m["Pi3"][:, 0], "2-D"),
        ("Pi4", lambda m: m["Pi4"][:2], "expected shape (3, 3)"),
        ("Pi4", lambda m: m["Pi4"].ravel(), "2-D"),
        ("Pi1_left", lambda m: m["Pi1_left"].T, "expected shape (1, 3)"),
        ("Pi3_left", lambda m: np.c_[m["Pi3_left"], 0.0], "expected shape (1, 3)"),
        ("N1", lambda m: m["N1"][:, :1], "expected shape (3, 2)"),
        ("Pi2", lambda m: [["a", "b"]] * 3, "numbers"),
        ("Pi2", lambda m: np.where(m["Pi2"] == m["Pi2"][0, 0], math.nan, m["Pi2"]), "NaN"),
    ],
)
def test_wrong_shapes_and_values_are_named(
    mats: dict[str, np.ndarray], name: str, bad: Callable[..., Any], text: str
) -> None:
    override: dict[str, Any] = {name: bad(mats)}
    if name in ("Pi1", "Pi2", "Pi3"):  # drop the matching left inverse (it would not fit any more)
        override[f"{name}_left"] = None
    if name == "Pi1":
        override["N1"] = None
    with pytest.raises(InvalidArgumentError) as exc:
        _user_keys(mats, **override)
    assert_names(exc, name)
    assert text in str(exc.value)


@FAST
@given(
    which=st.sampled_from(["1", "2", "3"]),
    rel=st.one_of(st.floats(1e-3, 10.0), st.floats(-10.0, -1e-3)).filter(
        lambda r: abs(r + 1) > 1e-3
    ),
)
def test_a_wrong_left_inverse_is_named(mats: dict[str, np.ndarray], which: str, rel: float) -> None:
    name = f"Pi{which}_left"
    wrong = mats[name] * (1.0 + rel)  # (1 + rel) Pi_left @ Pi = (1 + rel) I != I
    with pytest.raises(InvalidArgumentError, match="not a left inverse") as exc:
        _user_keys(mats, **{name: wrong, **({"N1": None} if which == "1" else {})})
    assert_names(exc, name)


def test_a_slightly_wrong_left_inverse_is_named(mats: dict[str, np.ndarray]) -> None:
    wrong = mats["Pi3_left"] * (1.0 + 5e-6)
    try:
        keys = _user_keys(mats, Pi3_left=wrong)
    except InvalidArgumentError as exc:
        assert exc.argument == "Pi3_left"
        return
    imm = make(keys=keys)  # accepted: show the damage before failing
    yt, xt = imm.encode_input([0.5]), imm.encode_state([1.0, -1.0])
    u = imm.decode_output(imm.target.output(xt, yt), yt)[0]
    assert abs(u - 1.5) <= 1e-6, f"decoded u = {u!r}, expected 1.5"


@FAST
@given(
    c=st.lists(st.floats(-10, 10), min_size=2, max_size=2).filter(lambda c: max(map(abs, c)) > 1e-3)
)
def test_n1_outside_the_kernel_is_named(mats: dict[str, np.ndarray], c: list[float]) -> None:
    bad = mats["N1"] + mats["Pi1"] @ np.array([c])  # Pi1_left @ bad = c != 0
    with pytest.raises(InvalidArgumentError, match=r"ker\(Pi1_left\)") as exc:
        _user_keys(mats, N1=bad)
    assert_names(exc, "N1")


def test_n1_with_a_zero_row_is_named(mats: dict[str, np.ndarray]) -> None:
    pi1 = np.array([[1.0], [0.0], [0.0]])
    n1 = np.array(
        [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    )  # in ker(Pi1_left) but row 0 carries no noise
    with pytest.raises(InvalidArgumentError, match="zero row") as exc:
        _user_keys(mats, Pi1=pi1, Pi1_left=None, N1=n1)
    assert_names(exc, "N1")
    # the default N1 (a basis of the kernel) has the same zero row: also refused
    with pytest.raises(InvalidArgumentError, match="zero row") as exc:
        _user_keys(mats, Pi1=pi1, Pi1_left=None, N1=None)
    assert_names(exc, "N1")


def test_rank_deficient_n1_is_named(mats: dict[str, np.ndarray]) -> None:
    pi1 = np.array([[1.0], [1.0], [0.0]])
    n1 = np.array([[1.0, 2.0], [-1.0, -2.0], [1.0, 2.0]])  # in the kernel, no zero row, rank 1
    with pytest.raises(InvalidArgumentError, match="full column rank") as exc:
        _user_keys(mats, Pi1=pi1, Pi1_left=None, N1=n1)
    assert_names(exc, "N1")


def test_keys_made_for_other_dimensions_are_named(mats: dict[str, np.ndarray]) -> None:
    keys = _user_keys(mats)
    with pytest.raises(InvalidArgumentError, match="were made for") as exc:
        immerse(lambda x, y: x, lambda x, y: x[:1], 3, N_INPUT, N_OUTPUT, keys=keys, rng=0)
    assert_names(exc, "keys")


# ============================================================== key files


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Keys, bytes]:
    keys = make().keys
    path = save_keys(keys, tmp_path_factory.mktemp("keys") / "k.keys")
    return keys, path.read_bytes()


def _write_private(path: Path, blob: bytes) -> Path:
    """Write ``blob`` with mode 0600 (so only the content can be the reason for a refusal)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(blob)
    os.chmod(path, 0o600)
    return path


@pytest.mark.files
def test_saved_key_file_round_trips_with_owner_only_mode(
    saved: tuple[Keys, bytes], tmp_path: Path
) -> None:
    keys, _ = saved
    path = save_keys(keys, tmp_path / "k.keys")
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_keys(path).fingerprint == keys.fingerprint


@FAST
@given(length=st.data())
def test_truncated_key_file_is_refused(
    saved: tuple[Keys, bytes], tmp_path: Path, length: st.DataObject
) -> None:
    _, blob = saved
    n = length.draw(st.integers(0, len(blob) - 1))
    path = _write_private(tmp_path / "truncated.keys", blob[:n])
    with pytest.raises(KeyFileError) as exc:
        load_keys(path)
    message = str(exc.value)
    assert message.startswith("path: ") and "truncated.keys" in message
    assert "integrity check" in message or "not an immersion key file" in message


@pytest.mark.files
@FAST
@given(data=st.data())
def test_key_file_modified_by_one_byte_is_refused(
    saved: tuple[Keys, bytes], tmp_path: Path, data: st.DataObject
) -> None:
    _, blob = saved
    position = data.draw(st.integers(0, len(blob) - 1))
    flip = data.draw(st.integers(1, 255))
    changed = bytearray(blob)
    changed[position] ^= flip
    path = _write_private(tmp_path / "modified.keys", bytes(changed))
    with pytest.raises(KeyFileError) as exc:
        load_keys(path)
    message = str(exc.value)
    assert "modified.keys" in message
    assert "integrity check" in message or "not an immersion key file" in message


@pytest.mark.parametrize(
    "content",
    [b"", b"hello\n", b"IMMERSION-KEYS-0\n", b"\x93NUMPY" + bytes(100), b"PK\x03\x04" + bytes(60)],
)
def test_file_that_is_not_a_key_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = _write_private(tmp_path / "other.bin", content)
    with pytest.raises(KeyFileError, match="not an immersion key file"):
        load_keys(path)


@pytest.mark.files
def test_file_with_a_valid_checksum_but_foreign_payload_is_refused(tmp_path: Path) -> None:
    for payload in (b"garbage", _npz(other=np.zeros(3))):
        blob = store.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        path = _write_private(tmp_path / "foreign.keys", blob)
        with pytest.raises(KeyFileError, match="malformed"):
            load_keys(path)


def _npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_file_with_non_object_metadata_is_refused(tmp_path: Path) -> None:
    payload = _npz(__meta__=np.frombuffer(json.dumps([1, 2]).encode(), dtype=np.uint8))
    blob = store.MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    path = _write_private(tmp_path / "weird.keys", blob)
    with pytest.raises(KeyFileError, match="malformed"):
        load_keys(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_file_readable_by_others_is_refused(
    saved: tuple[Keys, bytes], tmp_path: Path, mode: int
) -> None:
    keys, blob = saved
    path = _write_private(tmp_path / "shared.keys", blob)
    assert load_keys(path).fingerprint == keys.fingerprint  # intact and private: loads
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match="chmod 600") as exc:
        load_keys(path)
    assert "readable by other users" in str(exc.value)


def test_missing_key_file_is_a_key_file_error(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read") as exc:
        load_keys(tmp_path / "absent.keys")
    assert "absent.keys" in str(exc.value)
    assert isinstance(exc.value, ImmersionError)


def test_save_keys_refuses_to_overwrite(saved: tuple[Keys, bytes], tmp_path: Path) -> None:
    keys, _ = saved
    path = save_keys(keys, tmp_path / "k.keys")
    before = path.read_bytes()
    other = Keys.draw(n_state=N_STATE, n_input=N_INPUT, n_output=N_OUTPUT, rng=1)
    with pytest.raises(KeyFileError, match="overwrite=True") as exc:
        save_keys(other, path)
    assert "exists" in str(exc.value)
    assert path.read_bytes() == before
    save_keys(other, path, overwrite=True)
    assert load_keys(path).fingerprint == other.fingerprint != keys.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.keys"]


def test_save_keys_into_a_missing_folder_fails_and_leaves_nothing(
    saved: tuple[Keys, bytes], tmp_path: Path
) -> None:
    keys, _ = saved
    with pytest.raises(KeyFileError, match="does not exist"):
        save_keys(keys, tmp_path / "missing" / "k.keys")
    assert list(tmp_path.rglob("*")) == []


def test_save_keys_failing_mid_write_leaves_no_temporary_file(
    saved: tuple[Keys, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, _ = saved
    path = save_keys(keys, tmp_path / "k.keys")
    before = path.read_bytes()

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", disk_full)
    other = Keys.draw(n_state=N_STATE, n_input=N_INPUT, n_output=N_OUTPUT, rng=1)
    with pytest.raises(OSError, match="No space left"):
        save_keys(other, tmp_path / "new.keys")
    with pytest.raises(OSError, match="No space left"):
        save_keys(other, path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.keys"]  # no .keys-*.tmp, no new.keys
    assert path.read_bytes() == before  # the old file is intact


# ============================================================== tolerance / PrecisionError


def _suggestion(**kwargs: Any) -> PrecisionError:
    with pytest.raises(PrecisionError) as exc:
        make(**kwargs)
    return exc.value


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    noise=st.sampled_from(["laplace", "gaussian"]),
    ratio=st.sampled_from([1.0, 100.0, 0.1]),
)
def test_tiny_epsilons_raise_precision_error_with_a_feasible_suggestion(
    seed: int, noise: str, ratio: float
) -> None:
    err = _suggestion(epsilon_input=1e-12, epsilon_output=1e-12 * ratio, noise=noise, rng=seed)
    eps_in, eps_out = err.smallest_feasible_epsilon_input, err.smallest_feasible_epsilon_output
    message = str(err)
    assert message.startswith("tolerance: ")
    assert "smallest feasible" in message
    assert f"epsilon_input={eps_in:.3g}" in message and f"epsilon_output={eps_out:.3g}" in message
    assert math.isfinite(eps_in) and math.isfinite(eps_out) and eps_in > 1e-12
    assert eps_out / eps_in == pytest.approx(ratio)  # same ratio as requested
    assert not isinstance(err, InvalidArgumentError) and isinstance(err, ValueError)

    imm = make(
        epsilon_input=eps_in, epsilon_output=eps_out, noise=noise, rng=seed
    )  # the suggestion works
    report = imm.report()
    assert report.decode_error_estimate <= 1e-6
    assert report.epsilon_input <= eps_in * (1 + 1e-9)
    # and it is (close to) the smallest: the suggestion keeps a 2x margin, so a quarter is refused
    # again
    with pytest.raises(PrecisionError):
        make(epsilon_input=eps_in / 4, epsilon_output=eps_out / 4, noise=noise, rng=seed)


def test_tolerance_none_disables_the_precision_check() -> None:
    imm = make(epsilon_input=1e-12, epsilon_output=1e-12, tolerance=None)
    assert imm.report().decode_error_estimate > 1e-6


def test_user_keys_with_too_much_noise_raise_precision_error(mats: dict[str, np.ndarray]) -> None:
    keys = Keys.from_matrices(**{k: v for k, v in mats.items()}, noise_scale=1e12)
    with pytest.raises(PrecisionError, match="tolerance") as exc:
        make(keys=keys)
    assert math.isnan(exc.value.smallest_feasible_epsilon_input)


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        ("float64", 1e-6),
        ("float32", 1e-6),
        ("float32", 1e-7),
    ],
)
def test_suggested_epsilons_work_for_every_dtype(dtype: str, tolerance: float) -> None:
    err = _suggestion(epsilon_input=1e-12, epsilon_output=1e-12, dtype=dtype, tolerance=tolerance)
    eps_in, eps_out = err.smallest_feasible_epsilon_input, err.smallest_feasible_epsilon_output
    if not (
        math.isfinite(eps_in) and math.isfinite(eps_out)
    ):  # honest "nothing is feasible" answer
        assert "no epsilon" in str(err).lower() or "not feasible" in str(err).lower()
        return
    imm = make(epsilon_input=eps_in, epsilon_output=eps_out, dtype=dtype, tolerance=tolerance)
    assert imm.report().decode_error_estimate <= tolerance


def test_suggested_epsilons_work_for_a_fresh_key_draw() -> None:
    failures = []
    for seed in range(6):
        err = _suggestion(epsilon_input=1e-12, epsilon_output=1e-12, rng=seed)
        try:
            make(
                epsilon_input=err.smallest_feasible_epsilon_input,
                epsilon_output=err.smallest_feasible_epsilon_output,
                rng=seed + 100,
            )
        except PrecisionError:
            failures.append(seed)
    assert failures == []
