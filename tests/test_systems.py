"""immerse_system: python-control controllers (and (A, B, C, D)) run immersed, decoded step by step.

The systems here are written for these tests (not taken from the SDK); the plain reference is
python-control's own evaluation (``sys.dynamics`` / ``sys.output``, ``input_output_response``).
"""

from __future__ import annotations

import pickle
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from immersion import (
    ImmersionError,
    InvalidArgumentError,
    NonFiniteError,
    OptionalDependencyError,
    immerse_system,
)

TOL = 1e-9


@pytest.fixture
def ct():
    return pytest.importorskip("control")


def _stable(rng: np.random.Generator, n: int, radius: float) -> np.ndarray:
    A = rng.standard_normal((n, n))
    return radius * A / max(abs(np.linalg.eigvals(A)))


def _close_loop(imm, controller_step, plant, x0_plant, steps, rng):
    """Run plain and immersed loops from the same noise; return the worst u and state errors.

    ``controller_step(xc, y) -> (u, xc+)`` is the plain controller; ``plant(x, u, k) -> (x+, y)``.
    The two loops have their own plant state (each fed by its own controller), as a user runs them.
    """
    n_state = imm.n_state
    xc = np.zeros(n_state)
    xt = imm.encode_state(xc)
    xp_plain = xp_imm = np.asarray(x0_plant, dtype=float)
    noise = rng.standard_normal((steps, xp_plain.size)) * 1e-2
    worst_u = worst_x = biggest_u = 0.0
    for k in range(steps):
        _, y_plain = plant(xp_plain, None, k)
        _, y_imm = plant(xp_imm, None, k)
        u_plain, xc = controller_step(xc, y_plain)
        yt = imm.encode_input(y_imm)  # user
        ut, xt = imm.target.advance(xt, yt)  # cloud
        u_imm = imm.decode_output(ut, yt)  # user
        worst_u = max(worst_u, float(np.abs(u_plain - u_imm).max()))
        worst_x = max(worst_x, float(np.abs(imm.decode_state(xt) - xc).max()))
        biggest_u = max(biggest_u, float(np.abs(u_plain).max()))
        xp_plain = plant(xp_plain, u_plain, k)[0] + noise[k]
        xp_imm = plant(xp_imm, u_imm, k)[0] + noise[k]
    return worst_u, worst_x, biggest_u


def _closed_loop_radius(plant, controller):
    """Spectral radius of plant (Ap, Bp, Cp) in feedback with controller (Ac, Bc, Cc, Dc)."""
    (Ap, Bp, Cp), (Ac, Bc, Cc, Dc) = plant, controller
    loop = np.block([[Ap + Bp @ Dc @ Cp, Bp @ Cc], [Bc @ Cp, Ac]])
    return float(max(abs(np.linalg.eigvals(loop))))


def _random_loop(rng, n, n_in, n_out):
    """Random stable MIMO controller and plant; controller gain halved until the loop is stable."""
    Ac = _stable(rng, n, 0.9)
    Bc, Cc = rng.standard_normal((n, n_in)), rng.standard_normal((n_out, n))
    Dc = rng.standard_normal((n_out, n_in))
    plant = (_stable(rng, 3, 0.8), rng.standard_normal((3, n_out)), rng.standard_normal((n_in, 3)))
    scale = 1.0
    while _closed_loop_radius(plant, (Ac, Bc, scale * Cc, scale * Dc)) > 0.97:
        scale /= 2
    return (Ac, Bc, scale * Cc, scale * Dc), plant


@pytest.mark.parametrize(("n", "n_in", "n_out"), [(1, 1, 1), (3, 2, 2), (5, 3, 2), (8, 2, 4)])
def test_random_statespace_closed_loop_equals_plain(ct, n, n_in, n_out):
    rng = np.random.default_rng(100 + n)
    (Ac, Bc, Cc, Dc), (Ap, Bp, Cp) = _random_loop(rng, n, n_in, n_out)
    ctrl = ct.ss(Ac, Bc, Cc, Dc, dt=0.05)

    def plant(x, u, k):  # n_out inputs (the controller's outputs), n_in measurements
        return (Ap @ x + (0 if u is None else Bp @ u)), Cp @ x

    def plain(xc, y):  # python-control's own evaluation of the controller
        return ctrl.output(0, xc, y), ctrl.dynamics(0, xc, y)

    imm = immerse_system(ctrl, extra_state=2, rng=rng)
    assert (imm.n_state, imm.n_input, imm.n_output) == (n, n_in, n_out)
    assert imm.target.n_state_encoded == n + 2  # options reach immerse
    worst_u, worst_x, biggest_u = _close_loop(
        imm, plain, plant, rng.standard_normal(3), 300, rng=rng
    )
    assert 1e-3 < biggest_u < 1e3  # the loop is exercised and bounded
    assert worst_u < TOL and worst_x < TOL


def _pi_update(t, x, y, p):
    error = p["reference"] - y[0]
    raw = p["kp"] * error + x[0]
    saturated = abs(raw) >= p["u_max"] and np.sign(raw) == np.sign(error)
    return np.array([x[0] + (0.0 if saturated else p["ki"] * p["Ts"] * error)])


def _pi_output(t, x, y, p):
    raw = p["kp"] * (p["reference"] - y[0]) + x[0]
    return np.array([np.clip(raw, -p["u_max"], p["u_max"])])


def _saturated_pi(ct):
    """A PI with output saturation and conditional integration (anti-windup): nonlinear, 1 state."""
    params = dict(reference=1.0, kp=1.5, ki=2.0, Ts=0.1, u_max=0.8)
    return ct.nlsys(_pi_update, _pi_output, inputs=1, outputs=1, states=1, dt=0.1, params=params)


def _first_order_plant(x, u, k):
    return 0.95 * x + (0 if u is None else 0.1 * u), x.copy()


@pytest.mark.parametrize("params", [None, {"kp": 3.0, "u_max": 0.5}])
def test_saturated_pi_with_params_closed_loop_equals_plain(ct, params):
    pi = _saturated_pi(ct)

    def plain(xc, y):
        return pi.output(0, xc, y, params), pi.dynamics(0, xc, y, params)

    imm = immerse_system(pi, params=params, rng=7)
    rng = np.random.default_rng(8)
    worst_u, worst_x, biggest_u = _close_loop(imm, plain, _first_order_plant, [0.0], 400, rng=rng)
    assert worst_u < TOL and worst_x < TOL
    u_max = 0.8 if params is None else params["u_max"]
    assert biggest_u == pytest.approx(u_max)  # the saturation is reached, so the test is nonlinear


def test_nonlinear_matches_python_controls_own_simulation(ct):
    """Open loop on a given measurement sequence: decoded outputs equal input_output_response."""
    pi = _saturated_pi(ct)
    steps = 200
    T = np.arange(steps) * 0.1
    Y = np.sin(T)[None, :] * 2.0
    reference = ct.input_output_response(pi, T, Y, X0=[0.2])
    imm = immerse_system(pi, rng=3)
    xt = imm.encode_state(np.array([0.2]))
    for k in range(steps):
        yt = imm.encode_input(Y[:, k])
        ut, xt_next = imm.target.advance(xt, yt)
        assert abs(imm.decode_state(xt)[0] - reference.states[0, k]) < TOL
        assert abs(imm.decode_output(ut, yt)[0] - reference.outputs[k]) < TOL
        xt = xt_next


def _pendulum_observer(ct):
    """Discrete pendulum observer, output = its estimate (outfcn=None): 2 states, 2 outputs."""

    def update(t, x, y, p):
        theta, omega = x
        prediction = np.array(
            [theta + p["Ts"] * omega, omega - p["Ts"] * (p["g_l"] * np.sin(theta) + p["c"] * omega)]
        )
        return prediction + np.asarray(p["gain"]) * (y[0] - theta)

    return ct.nlsys(
        update,
        None,
        inputs=1,
        states=2,
        dt=0.02,
        params=dict(Ts=0.02, g_l=9.81, c=0.2, gain=[0.5, 2.0]),
    )


def test_pendulum_observer_without_outfcn_tracks_plain(ct):
    obs = _pendulum_observer(ct)
    assert obs.noutputs == 2

    def plain(xc, y):
        return obs.output(0, xc, y), obs.dynamics(0, xc, y)

    def pendulum(x, u, k):  # the true pendulum, unforced; the observer's output drives nothing
        nxt = np.array([x[0] + 0.02 * x[1], x[1] - 0.02 * (9.81 * np.sin(x[0]) + 0.2 * x[1])])
        return nxt, x[:1].copy()

    imm = immerse_system(obs, extra_state=3, rng=11)
    worst_u, worst_x, biggest_u = _close_loop(
        imm, plain, pendulum, [1.0, 0.0], 300, rng=np.random.default_rng(12)
    )
    assert biggest_u > 0.5 and worst_u < TOL and worst_x < TOL


def test_interconnected_system_goes_through_dynamics_and_output(ct):
    first = _saturated_pi(ct)
    second = ct.nlsys(
        lambda t, x, u, p: 0.5 * x + u, lambda t, x, u, p: x - u, inputs=1, outputs=1, states=1
    )
    second = ct.nlsys(second.updfcn, second.outfcn, inputs=1, outputs=1, states=1, dt=0.1)
    chain = ct.series(first, second)
    assert type(chain).__name__ == "InterconnectedSystem"

    def plain(xc, y):
        return chain.output(0, xc, y), chain.dynamics(0, xc, y)

    imm = immerse_system(chain, rng=5)
    worst_u, worst_x, _ = _close_loop(
        imm, plain, _first_order_plant, [0.3], 200, rng=np.random.default_rng(6)
    )
    assert worst_u < TOL and worst_x < TOL


def test_time_varying_system_needs_public_time(ct):
    def update(t, x, y, p):
        return 0.8 * x + np.cos(0.3 * t) * y

    def output(t, x, y, p):
        return (1.0 + 0.5 * np.sin(t)) * x

    tv = ct.nlsys(update, output, inputs=1, outputs=1, states=1, dt=0.5)
    with pytest.raises(InvalidArgumentError, match="time='public'") as err:
        immerse_system(tv, rng=0)
    assert err.value.argument == "sys"

    imm = immerse_system(tv, time="public", rng=1)
    x, xt = np.array([1.0]), imm.encode_state(np.array([1.0]))
    for k in range(100):
        t = k * 0.5
        y = np.array([np.sin(k / 7)])
        yt = imm.encode_input(y)
        ut, xt = imm.target.advance(xt, yt, [t])
        assert abs(imm.decode_output(ut, yt)[0] - tv.output(t, x, y)[0]) < TOL
        x = tv.dynamics(t, x, y)
        assert abs(imm.decode_state(xt)[0] - x[0]) < TOL
    with pytest.raises(InvalidArgumentError) as err:
        imm.target.step(xt, yt)
    assert err.value.argument == "w"


def test_plain_matrices_closed_loop_without_python_control(monkeypatch):
    monkeypatch.setitem(sys.modules, "control", None)  # a tuple needs no python-control
    rng = np.random.default_rng(21)
    (A, B, C, D), (Ap, Bp, Cp) = _random_loop(rng, 4, 2, 1)

    def plant(x, u, k):
        return Ap @ x + (0 if u is None else Bp @ u), Cp @ x

    def plain(xc, y):
        return C @ xc + D @ y, A @ xc + B @ y

    imm = immerse_system((A, B.tolist(), C, D), rng=rng)
    worst_u, worst_x, biggest_u = _close_loop(imm, plain, plant, [1.0, -1.0, 0.5], 300, rng=rng)
    assert 1e-3 < biggest_u < 1e3 and worst_u < TOL and worst_x < TOL


@settings(max_examples=25)
@given(
    n=st.integers(1, 6),
    n_in=st.integers(1, 3),
    n_out=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_stable_matrices_decode_to_the_plain_controller(n, n_in, n_out, seed):
    """Any size and draw: 40 open-loop steps of (A, B, C, D), decoded = plain, step by step."""
    rng = np.random.default_rng(seed)
    A, B = _stable(rng, n, 0.95), rng.standard_normal((n, n_in))
    C, D = rng.standard_normal((n_out, n)), rng.standard_normal((n_out, n_in))
    imm = immerse_system((A, B, C, D), extra_state=1 + seed % 3, rng=seed)
    x = rng.standard_normal(n)
    xt = imm.encode_state(x)
    for y in rng.standard_normal((40, n_in)):
        yt = imm.encode_input(y)
        ut, xt = imm.target.advance(xt, yt)
        u = C @ x + D @ y
        assert np.abs(imm.decode_output(ut, yt) - u).max() < TOL * max(1.0, np.abs(u).max())
        x = A @ x + B @ y
        assert np.abs(imm.decode_state(xt) - x).max() < TOL * max(1.0, np.abs(x).max())


def test_statespace_on_the_torch_backend(ct):
    pytest.importorskip("torch")
    import torch

    rng = np.random.default_rng(2)
    A, B, C, D = _stable(rng, 3, 0.9), rng.standard_normal((3, 1)), rng.standard_normal((2, 3)), 0
    ctrl = ct.ss(A, B, C, D, dt=True)
    imm = immerse_system(ctrl, backend="torch", dtype="float64", rng=0)
    x, xt = np.ones(3), imm.encode_state(torch.ones(3, dtype=torch.float64))
    for k in range(50):
        y = np.array([np.cos(k)])
        yt = imm.encode_input(torch.tensor(y))
        ut, xt = imm.target.advance(xt, yt)
        assert np.abs(imm.decode_output(ut, yt).numpy() - C @ x).max() < TOL
        x = A @ x + B @ y
    assert np.abs(imm.decode_state(xt).numpy() - x).max() < TOL


@pytest.mark.gpu
def test_statespace_on_cuda_equals_the_numpy_decode(ct, device="cuda"):
    """device="cuda": keys, encodings and the cloud's products live on the GPU; every decoded
    output and the decoded state equal those of the same controller immersed with numpy."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    A, B = _stable(rng, 4, 0.9), rng.standard_normal((4, 2))
    C, D = rng.standard_normal((2, 4)), rng.standard_normal((2, 2))
    ctrl = ct.ss(A, B, C, D, dt=True)
    gpu = immerse_system(ctrl, backend="torch", dtype="float64", device=device, rng=0)
    cpu = immerse_system(ctrl, rng=0)
    xt_gpu, xt_cpu = gpu.encode_state(np.ones(4)), cpu.encode_state(np.ones(4))
    assert isinstance(xt_gpu, torch.Tensor) and xt_gpu.device.type == device
    for k in range(50):
        y = np.array([np.cos(k), np.sin(0.3 * k)])
        yt_gpu, yt_cpu = gpu.encode_input(y), cpu.encode_input(y)
        ut_gpu, xt_gpu = gpu.target.advance(xt_gpu, yt_gpu)
        ut_cpu, xt_cpu = cpu.target.advance(xt_cpu, yt_cpu)
        u_gpu = gpu.decode_output(ut_gpu, yt_gpu).cpu().numpy()
        assert np.abs(u_gpu - cpu.decode_output(ut_cpu, yt_cpu)).max() < TOL
    x_gpu = gpu.decode_state(xt_gpu).cpu().numpy()
    assert np.abs(x_gpu - cpu.decode_state(xt_cpu)).max() < TOL


def test_targets_pickle_and_keep_decoding(ct):
    pi = _saturated_pi(ct)
    for system in (pi, ct.ss([[0.5]], [[1.0]], [[2.0]], [[0.0]], dt=True)):
        imm = immerse_system(system, rng=4)
        xt, yt = imm.encode_state([0.1]), imm.encode_input([0.4])
        copy = pickle.loads(pickle.dumps(imm.target))
        assert np.allclose(copy.output(xt, yt), imm.target.output(xt, yt), rtol=0, atol=1e-12)


def test_missing_extra_names_control(ct, monkeypatch):
    ctrl = ct.ss([[0.5]], [[1.0]], [[1.0]], [[0.0]], dt=True)
    monkeypatch.setitem(sys.modules, "control", None)
    with pytest.raises(OptionalDependencyError, match=r"immersion-coding\[control\]") as err:
        immerse_system(ctrl, rng=0)
    assert isinstance(err.value, ImportError) and "'control'" in str(err.value)


def test_continuous_time_and_unspecified_timebase_are_refused(ct):
    for system in (
        ct.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]]),  # dt = 0
        ct.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]], dt=None),
        ct.nlsys(lambda t, x, u, p: -x, None, inputs=1, states=1),  # dt = 0
        ct.nlsys(lambda t, x, u, p: -x, None, inputs=1, states=1, dt=None),
    ):
        with pytest.raises(InvalidArgumentError, match="continuous-time|dt=None") as err:
            immerse_system(system, rng=0)
        assert err.value.argument == "sys"
    with pytest.raises(InvalidArgumentError, match=r"c2d"):
        immerse_system(ct.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]]), rng=0)


def test_discrete_transfer_function_is_read_as_its_state_space(ct):
    """A discrete TransferFunction runs as control.ss(tf) under both codings (and
    encrypt_controller), with the same numbers as the StateSpace."""
    from immersion.lwe import encrypt_controller

    tf = ct.tf([0.5, 0.1], [1.0, -0.6, 0.08], 0.1)
    ss = ct.ss(tf)
    a, b = immerse_system(tf, rng=0), immerse_system(ss, rng=0)
    x, y = np.array([0.3, -0.2]), np.array([0.7])
    for imm in (a, b):
        yt = imm.encode_input(y)
        u = imm.decode_output(imm.target.output(imm.encode_state(x), yt), yt)
        np.testing.assert_allclose(u, ss.C @ x + ss.D @ y, atol=TOL)
    ranges = {"input_range": 1.0, "output_range": 5.0, "rng": 0}
    lwe = immerse_system(tf, coding="lwe", **ranges)
    for other in (encrypt_controller(tf, **ranges), encrypt_controller(ss, **ranges)):
        assert np.array_equal(lwe.target.theta_b, other.target.theta_b)


def test_continuous_and_unspecified_timebases_refused_alike_by_both_entry_points(ct):
    """immerse_system (both codings) and encrypt_controller: the same named error for a
    continuous-time (dt = 0) or unspecified (dt = None) StateSpace or TransferFunction."""
    from immersion.lwe import encrypt_controller

    systems = {
        "ss dt=0": ct.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]]),
        "ss dt=None": ct.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]], dt=None),
        "tf dt=0": ct.tf([1.0], [1.0, 1.0]),
        "tf dt=None": ct.tf([1.0], [1.0, 1.0], None),
    }
    ranges = {"input_range": 1.0, "output_range": 1.0, "rng": 0}
    for label, system in systems.items():
        messages = set()
        for build in (
            lambda s: immerse_system(s, rng=0),
            lambda s: immerse_system(s, coding="lwe", **ranges),
            lambda s: encrypt_controller(s, **ranges),
        ):
            with pytest.raises(InvalidArgumentError, match=r"discretise.*control\.c2d") as err:
                build(system)
            assert err.value.argument == "sys", label
            messages.add(str(err.value))
        assert len(messages) == 1, label  # one wording everywhere
        assert ("dt=None" if "None" in label else "continuous-time (dt=0)") in messages.pop()


def test_lwe_refuses_public_time_pointing_to_the_float_coding():
    with pytest.raises(InvalidArgumentError, match="linear time-invariant") as err:
        immerse_system(GOOD, coding="lwe", time="public", input_range=1, output_range=1)
    assert err.value.argument == "time"
    assert "coding='immersion' with time='public'" in str(err.value)


GOOD = (np.eye(2) * 0.5, np.ones((2, 1)), np.ones((1, 2)), np.zeros((1, 1)))


@pytest.mark.parametrize(
    ("system", "argument", "match"),
    [
        ("controller", "sys", "expected a discrete-time control.StateSpace"),
        (3.0, "sys", "got float"),
        (np.eye(2), "sys", "got ndarray"),
        (list(GOOD), "sys", "got list"),
        (GOOD[:3], "sys", "four matrices"),
        ((GOOD[0], np.ones((3, 1)), GOOD[2], GOOD[3]), "sys", r"B has shape \(3, 1\), expected"),
        ((GOOD[0], GOOD[1], GOOD[2], np.zeros((2, 1))), "sys", r"D has shape \(2, 1\)"),
        ((np.ones(2), GOOD[1], GOOD[2], GOOD[3]), "sys", "matrix A: expected 2 dimension"),
        ((GOOD[0], GOOD[1], GOOD[2], "D"), "sys", "matrix D"),
        ((np.zeros((0, 0)), np.zeros((0, 1)), np.zeros((1, 0)), GOOD[3]), "sys", "no state"),
        ((GOOD[0], np.ones((2, 0)), GOOD[2], np.zeros((1, 0))), "sys", "at least one input"),
    ],
)
def test_bad_systems_are_refused_naming_sys(system, argument, match):
    with pytest.raises(InvalidArgumentError, match=match) as err:
        immerse_system(system, rng=0)
    assert err.value.argument == argument


def test_non_finite_matrices_are_refused(ct):
    A = GOOD[0].copy()
    A[0, 1] = np.nan
    for system in ((A, *GOOD[1:]), ct.ss(A, GOOD[1], GOOD[2], GOOD[3], dt=True)):
        with pytest.raises(NonFiniteError, match="matrix A") as err:
            immerse_system(system, rng=0)
        assert err.value.argument == "sys"


def test_python_control_objects_that_are_not_supported(ct):
    frd = ct.frd(ct.tf([1.0], [1.0, -0.5], True), [0.1, 1.0])
    with pytest.raises(InvalidArgumentError, match="TransferFunction.*got FrequencyResponseData"):
        immerse_system(frd, rng=0)
    stateless = ct.nlsys(None, lambda t, x, u, p: 2 * u, inputs=1, outputs=1, dt=True)
    with pytest.raises(InvalidArgumentError, match="nstates >= 1") as err:
        immerse_system(stateless, rng=0)
    assert err.value.argument == "sys"


@pytest.mark.parametrize(
    ("options", "argument", "match"),
    [
        ({"coding": "lwe"}, "input_range", "required"),  # tests/test_lwe.py runs coding="lwe"
        ({"coding": None}, "coding", "'immersion', 'lwe'"),
        ({"time": "varying"}, "time", "'invariant', 'public'"),
        ({"params": [1.0]}, "params", "dict"),
        ({"params": {"a": 1}}, "params", "takes no params"),
        ({"time": "public"}, "time", "time-invariant"),
        ({"n_state": 2}, "n_state", "read from sys"),
        ({"n_public": 1}, "n_public", "read from sys"),
        ({"epsilon": 1.0}, "epsilon", "accepted: extra_state"),
        ({"design": None}, "design", "dimensions are read from sys"),
        ({"epsilon_input": -1.0}, "epsilon_input", "> 0"),
        ({"backend": 3}, "backend", "backend name"),
    ],
)
def test_bad_options_are_refused_by_name(options, argument, match):
    with pytest.raises(InvalidArgumentError, match=match) as err:
        immerse_system(GOOD, rng=0, **options)
    assert err.value.argument == argument


def test_nonlinear_system_needs_the_numpy_backend(ct):
    with pytest.raises(InvalidArgumentError, match="backend='numpy'") as err:
        immerse_system(_saturated_pi(ct), backend="torch", rng=0)
    assert err.value.argument == "backend"


def test_wrong_updfcn_shape_is_named(ct):
    bad = ct.nlsys(
        lambda t, x, u, p: np.zeros(3),
        lambda t, x, u, p: x[:1],
        inputs=1,
        outputs=1,
        states=2,
        dt=True,
    )
    with pytest.raises(InvalidArgumentError, match=r"shape \(3,\), expected \(2,\)") as err:
        immerse_system(bad, rng=0)
    assert err.value.argument == "f"


_ENTRY = st.one_of(
    st.integers(0, 3).flatmap(
        lambda ndim: st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim).flatmap(
            lambda shape: st.lists(
                st.one_of(
                    st.floats(-2, 2),
                    st.sampled_from([np.nan, np.inf, -np.inf, 1e308, -1e308]),
                ),
                min_size=int(np.prod(shape)),
                max_size=int(np.prod(shape)),
            ).map(lambda values: np.array(values, dtype=np.float64).reshape(shape))
        )
    ),
    st.sampled_from([None, "A", 1.0, [[1.0, 2.0]], np.array([[1 + 1j]])]),
)


_VALUE = st.one_of(st.floats(-2, 2), st.sampled_from([np.nan, np.inf, 1e308, -1e308, 1e-308]))


@st.composite
def _consistent_shapes(draw):
    """Four matrices of matching shapes whose entries may be NaN, inf, huge or tiny."""
    n, m, p = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return [
        np.array(draw(st.lists(_VALUE, min_size=r * c, max_size=r * c))).reshape(r, c)
        for r, c in ((n, n), (n, m), (p, n), (p, m))
    ]


@settings(max_examples=60, deadline=None)
@given(entries=st.one_of(st.lists(_ENTRY, min_size=0, max_size=5), _consistent_shapes()))
def test_any_junk_tuple_is_refused_naming_sys_or_runs_finite(entries):
    """Random tuples (wrong lengths, shapes, dtypes, NaN, inf, 1e308): refused naming ``sys``, or
    accepted, and then one step either gives finite results or raises a named error."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            imm = immerse_system(tuple(entries), rng=0)
        except InvalidArgumentError as exc:
            assert exc.argument == "sys" and str(exc).startswith("sys: ")
            return
        except ImmersionError as exc:  # e.g. a PrecisionError for a huge input gain
            assert str(exc).startswith("tolerance: ")
            return
        yt = imm.encode_input(np.full(imm.n_input, 0.5))
        try:
            ut, xt = imm.target.advance(imm.encode_state(np.ones(imm.n_state)), yt)
        except InvalidArgumentError as exc:
            assert exc.argument in {"f", "g", "encoded_input", "encoded_state"}
            return
        assert np.isfinite(imm.decode_output(ut, yt)).all()
        assert np.isfinite(imm.decode_state(xt)).all()
