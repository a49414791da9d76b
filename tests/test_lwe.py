"""LWE coding (RLWE, gains encrypted): conversion, exactness against the fixed-point twin, the
proven bounds, tampering clouds, refusals, the remote service."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from immersion import InvalidArgumentError
from immersion.lwe import (
    CiphertextIntegrityError,
    ControllerTarget,
    WrapAroundError,
    encrypt_controller,
    history_form,
    linear_controller,
)
from immersion.lwe.controller import history_matrices
from immersion.lwe.examples import controller_of_order, four_tank_loop, lqg_loop, pi_loop


def _random_controller(rng, n, ny, nu, radius=0.95):
    F = rng.standard_normal((n, n))
    F *= radius / max(abs(np.linalg.eigvals(F)))
    return (
        F,
        rng.standard_normal((n, ny)),
        rng.standard_normal((nu, n)),
        rng.standard_normal((nu, ny)),
    )


def _state_space(system, ys, x0):
    F, G, H, J = system
    x, out = np.array(x0, dtype=float), []
    for y in ys:
        out.append(H @ x + J @ y)
        x = F @ x + G @ y
    return np.array(out)


def _history(h, ys, us, x0):
    """The history form evaluated directly (the controller's own u fed back)."""
    out = []
    for k, y in enumerate(ys):
        u = h.theta_y[0] @ y
        for i in range(1, h.window + 1):
            if k - i >= 0:
                u = u + h.theta_y[i] @ ys[k - i] + h.theta_u[i - 1] @ us[k - i]
        if k < h.window:
            u = u + h.initial[k] @ x0
        out.append(u)
    return np.array(out)


@pytest.mark.parametrize(
    "n, ny, nu", [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 2, 2), (3, 2, 1), (5, 1, 3)]
)
def test_history_form_equals_the_state_space_controller(n, ny, nu):
    rng = np.random.default_rng(n * 100 + ny * 10 + nu)
    system = _random_controller(rng, n, ny, nu)
    h = history_form(linear_controller(system))
    ys, x0 = rng.standard_normal((80, ny)), rng.standard_normal(n)
    us = _state_space(system, ys, x0)
    assert h.window == n and h.residual < 1e-9
    np.testing.assert_allclose(_history(h, ys, us, x0), us, rtol=0, atol=1e-9 * np.abs(us).max())


@pytest.mark.parametrize(
    "system, window",
    [((np.eye(2), 0.1 * np.eye(2), np.eye(2), np.eye(2)), 2),  # two integrators: F not cyclic
     ((np.diag([0.5, 0.9, 0.3]), np.ones((3, 1)), [[1.0, 0.0, 1.0]], [[0.0]]), 2),  # unobservable
     (([[0.0]], [[0.0]], [[0.0]], [[3.0]]), 0)],  # static gain
)  # fmt: skip
def test_history_form_special_cases(system, window):
    h = history_form(linear_controller(system))
    rng = np.random.default_rng(0)
    ys = rng.standard_normal((40, h.n_input))
    x0 = rng.standard_normal(np.shape(system[0])[0])
    us = _state_space(tuple(np.asarray(m, float) for m in system), ys, x0)
    assert h.window == window
    np.testing.assert_allclose(_history(h, ys, us, x0), us, atol=1e-12)


def test_pi_becomes_velocity_form():
    h = history_form(
        linear_controller(pi_loop().controller)
    )  # u_k = u_(k-1) + Kp e_k + (Ki h - Kp) e_(k-1)
    assert h.window == 1 and h.theta_u[0, 0, 0] == pytest.approx(1.0, abs=1e-15)
    assert h.theta_y[0, 0, 0] == -2.0 and h.theta_y[1, 0, 0] == pytest.approx(2.0 - 0.2)


def _closed_loop(loop, ctrl, steps, *, cloud=None):
    """The encrypted closed loop beside the twin's (same disturbances), and the inputs applied."""
    A, B, C = loop.plant
    cloud = cloud or ctrl.target
    w, v = loop.disturbance(steps)
    twin = ctrl.fixed_point_twin()
    x, xt, x_twin = loop.x0.copy(), ctrl.encode_state(), loop.x0.copy()
    us, us_twin, vs = [], [], []
    for k in range(steps):
        y = C @ x + v[k]
        yt = ctrl.encode_input(y)
        ut, xt = cloud.advance(xt, yt)
        u = ctrl.decode_output(ut, yt)
        vs.append(np.concatenate([y, us[-1] if us else np.zeros(B.shape[1])]))
        x = A @ x + B @ u + w[k]
        us.append(u)
        y_twin = C @ x_twin + v[k]
        us_twin.append(twin.output(y_twin))
        x_twin = A @ x_twin + B @ us_twin[-1] + w[k]
    return np.array(us), np.array(us_twin), np.array(vs)


def _encrypt(loop, **options):
    options.setdefault("rng", 0)
    return encrypt_controller(
        loop.controller, input_range=loop.input_range, output_range=loop.output_range, **options
    )


@pytest.fixture(scope="module")
def four_tank():
    loop = four_tank_loop()
    return loop, _encrypt(loop)


@pytest.mark.parametrize(
    "loop", [lqg_loop(2), lqg_loop(4), pi_loop(), four_tank_loop()], ids=lambda loop: loop.name
)
def test_decoded_u_is_bit_identical_to_the_fixed_point_twin(loop):
    ctrl = _encrypt(loop)
    us, us_twin, _ = _closed_loop(loop, ctrl, 150)
    assert np.array_equal(us, us_twin)  # every sample, every bit


@pytest.mark.parametrize("loop", [lqg_loop(3), four_tank_loop()], ids=lambda loop: loop.name)
def test_one_step_error_is_within_the_proven_bound(loop):
    """From the same past (the inputs the encrypted loop applied), the float history form and
    the decoded u differ by at most the design's proven one-step bound, output by output."""
    ctrl = _encrypt(loop)
    us, _, vs = _closed_loop(loop, ctrl, 200)
    phis = history_matrices(history_form(linear_controller(loop.controller)))
    bound = np.array(ctrl.design.step_error_bound)
    worst = np.zeros_like(bound)
    for k in range(len(us)):
        u_float = sum(p @ vs[k - j] for j, p in enumerate(phis) if k - j >= 0)
        worst = np.maximum(worst, np.abs(us[k] - u_float))
    assert (worst <= bound).all() and (worst > 0).any()
    assert ctrl.design.precision == pytest.approx((bound / ctrl.design.output_range).max())


def test_precision_picks_the_ring_and_refuses_what_cannot_be_reached():
    loop = four_tank_loop()
    fast = _encrypt(loop)
    assert fast.design.degree == 4096 and fast.design.security_bits == 128
    assert fast.design.noise_margin_bits > 0 and fast.design.message_bound < (
        fast.design.plaintext_modulus // 2
    )
    finer = _encrypt(loop, precision=fast.design.precision / 100)
    assert finer.design.degree == 8192 and finer.design.precision <= fast.design.precision / 100
    with pytest.raises(InvalidArgumentError, match="smallest proven one-step error") as err:
        _encrypt(loop, precision=1e-15)
    assert err.value.argument == "precision" and "N = 8192" in str(err.value)
    for bad in (0, 1.5, "1e-4", True):
        with pytest.raises(InvalidArgumentError, match="precision"):
            _encrypt(loop, precision=bad)


@pytest.mark.parametrize(
    "level, degrees", [(128, (4096, 109)), (192, (8192, 152)), (256, (8192, 118))]
)
def test_the_modulus_is_within_the_he_standard_table(level, degrees):
    ctrl = _encrypt(pi_loop(), security_bits=level)
    degree, max_bits = degrees
    d = ctrl.design
    assert d.degree == degree and np.log2(float(d.modulus)) <= max_bits
    assert d.security_bits == level


def test_plant_work_and_bytes_do_not_grow_with_the_controller():
    """2-, 4-, 6- and 8-state controllers (one input, one output): the same ciphertext sizes up
    and down; only the cloud's window grows."""
    sizes, windows = set(), []
    for n in (2, 4, 6, 8):
        ctrl = encrypt_controller(controller_of_order(n), input_range=1, output_range=50, rng=0)
        xt = ctrl.encode_state()
        yt = ctrl.encode_input([0.1])
        ut = ctrl.target.output(xt, yt)
        ctrl.decode_output(ut, yt)
        sizes.add((yt.nbytes, ut.nbytes, ctrl.design.bytes_up, ctrl.design.bytes_down))
        windows.append(ctrl.design.window)
    assert len(sizes) == 1 and windows == [2, 4, 6, 8]


@pytest.mark.slow
def test_no_growth_of_noise_or_scale_over_100000_steps():
    """A small ring (no security claim) so that 100,000 samples run in seconds: the decoded u is
    the twin's at every sample (a noise overflow would break it; nothing is re-scaled)."""
    loop = pi_loop()
    ctrl = _encrypt(loop, security_bits=None, degree=16, n_primes=4)
    us, us_twin, _ = _closed_loop(loop, ctrl, 100_000)
    assert np.array_equal(us, us_twin)


# ---------------------------------------------------------------- tampering clouds
class _Tamper:
    """A cloud that computes honestly, then alters its reply with ``alter(reply, k)``."""

    def __init__(self, target, alter):
        self.target, self.alter, self.k, self.replies = target, alter, 0, []

    def output(self, xt, yt):
        reply = self.target.output(xt, yt)
        self.replies.append(reply.copy())
        out = self.alter(reply.copy(), self.k, self.replies)
        self.k += 1
        return out

    def step(self, xt, yt):
        return self.target.step(xt, yt)


def _fresh():
    """A new handle: a detection retires the key of the one it happens to."""
    return _encrypt(four_tank_loop(), rng=11)


def _detected(ctrl, alter, *, at=3, steps=6):
    """Run ``steps`` samples with the reply altered at sample ``at``: True if decode refused.
    ``ctrl`` is used once (a detection retires it); pass ``_fresh()``."""
    loop = four_tank_loop()
    A, B, C = loop.plant
    cloud = _Tamper(ctrl.target, lambda r, k, rs: alter(r, k, rs) if k == at else r)
    x, xt = loop.x0.copy(), ctrl.encode_state()
    for _ in range(steps):
        yt = ctrl.encode_input(C @ x)
        try:
            u = ctrl.decode_output(cloud.output(xt, yt), yt)
        except CiphertextIntegrityError:
            return True
        xt = cloud.step(xt, yt)
        x = A @ x + B @ u
    return False


def test_an_honest_cloud_passes_the_check(four_tank):
    ctrl = _fresh()
    assert not _detected(ctrl, lambda r, k, rs: r)


def _residue_offset(ctrl, reply, index, delta):
    q = ctrl.design.primes[index % len(ctrl.design.primes)]
    reply[index] = np.uint32((int(reply[index]) + delta) % q)
    return reply


@pytest.mark.parametrize("row", [0, 1, 2, 3])  # two controller rows, two check rows
@pytest.mark.parametrize("delta", [1, 7, 2**20])
def test_an_offset_on_any_row_is_detected(four_tank, row, delta):
    ctrl = _fresh()
    L = len(ctrl.design.primes)
    assert _detected(ctrl, lambda r, k, rs: _residue_offset(ctrl, r, row * L, delta))


def test_single_bit_flips_of_the_reply_are_detected(four_tank):
    ctrl = _fresh()
    rng = np.random.default_rng(7)
    size = ctrl.target.n_output_encoded
    positions = zip(rng.integers(0, size, 24), rng.integers(0, 25, 24), strict=True)
    for index, bit in positions:
        alter = lambda r, k, rs, i=int(index), b=int(bit): _flip(r, i, b)  # noqa: E731
        assert _detected(_fresh(), alter), (index, bit)


def _flip(reply, index, bit):
    reply[index] ^= np.uint32(1 << bit)
    return reply


def test_replayed_stale_scaled_and_mixed_replies_are_detected(four_tank):
    ctrl = _fresh()
    design = ctrl.design
    q = np.array(design.primes, dtype=np.uint64)

    def scaled(r, k, rs):  # every residue times 2: u and the tags scale together
        L, rows = len(q), design.rows
        words = r.astype(np.uint64)
        words[: rows * L] = (words[: rows * L].reshape(rows, L) * 2 % q).reshape(-1)
        body = words[rows * L :].reshape(2, L, -1)
        words[rows * L :] = (body * 2 % q[None, :, None]).reshape(-1)
        return words.astype(np.uint32)

    def mixed(r, k, rs):  # the sum of this reply and the previous one
        L, rows = len(q), design.rows
        a, b = r.astype(np.uint64), rs[-2].astype(np.uint64)
        head = ((a[: rows * L] + b[: rows * L]).reshape(rows, L) % q).reshape(-1)
        body = ((a[rows * L :] + b[rows * L :]).reshape(2, L, -1) % q[None, :, None]).reshape(-1)
        return np.concatenate([head, body]).astype(np.uint32)

    for alter in (lambda r, k, rs: rs[0], lambda r, k, rs: rs[-2], scaled, mixed):
        assert _detected(_fresh(), alter)


def test_a_reply_of_another_session_is_detected(four_tank):
    loop, ctrl = four_tank_loop(), _fresh()
    other = _encrypt(loop, rng=1)
    C = loop.plant[2]
    xo = other.encode_state()
    foreign = other.target.output(xo, other.encode_input(C @ loop.x0))
    assert _detected(ctrl, lambda r, k, rs: foreign.copy(), at=0)


def test_the_cloud_injecting_a_fake_measurement_is_detected(four_tank):
    """The cloud adds the encrypted coefficients times a plaintext of its choice (what a fake
    y would contribute): the kappa terms of the check rows catch it."""
    ctrl = _fresh()
    target, design = ctrl.target, ctrl.design
    ring = target.ring

    def inject(r, k, rs):
        fake = np.zeros(design.degree, dtype=np.int64)
        fake[0] = 12345  # a fake y_0 slot
        p = ring.ntt(fake)
        L, rows = len(design.primes), design.rows
        words = r.astype(np.uint64)
        # (b_theta + a_theta s) p: adds p b_theta to c0 and p a_theta to c1
        c0_add = ring.read(ring.mul(target.theta_b[1], p), ring.readers(design.read_positions))
        words[: rows * L] = ((words[: rows * L].reshape(rows, L) + c0_add) % ring.q[:, 0]).reshape(
            -1
        )
        c1 = words[rows * L : rows * L + L * design.degree].reshape(L, -1)
        words[rows * L : rows * L + L * design.degree] = ring.add(
            c1, ring.mul(target.theta_a[1], p)
        ).reshape(-1)
        return words.astype(np.uint32)

    assert _detected(ctrl, inject)


def test_after_a_detection_the_run_is_stopped(four_tank):
    loop, ctrl = four_tank_loop(), _fresh()
    C = loop.plant[2]
    xt = ctrl.encode_state()
    yt = ctrl.encode_input(C @ loop.x0)
    bad = ctrl.target.output(xt, yt)
    bad[-1] ^= np.uint32(1)
    with pytest.raises(CiphertextIntegrityError):
        ctrl.decode_output(bad, yt)
    with pytest.raises(CiphertextIntegrityError, match="stopped"):
        ctrl.decode_output(ctrl.target.output(xt, yt), yt)
    with pytest.raises(CiphertextIntegrityError, match="fresh keys"):
        ctrl.encode_state()  # the key is retired: no second attempt for a tampering cloud


# ---------------------------------------------------------------- what the cloud holds
def test_target_pickles_without_any_secret_and_rebuilds_from_public_arrays(four_tank):
    loop, ctrl = four_tank
    blob = pickle.dumps(ctrl.target)
    assert ctrl._key.s.tobytes()[:64] not in blob
    clone = ControllerTarget.from_public_arrays(ctrl.target.public_arrays())
    xt = ctrl.encode_state()
    yt = ctrl.encode_input(loop.plant[2] @ loop.x0)
    assert np.array_equal(clone.output(xt, yt), ctrl.target.output(xt, yt))
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(ctrl)
    arrays = ctrl.target.public_arrays()
    assert {a.dtype.kind for a in arrays.values()} <= {"u", "i"}
    with pytest.raises(InvalidArgumentError, match="setup"):
        ControllerTarget.from_public_arrays({**arrays, "theta_b": arrays["theta_b"][:-1]})
    with pytest.raises(InvalidArgumentError, match="setup"):
        ControllerTarget.from_public_arrays({**arrays, "prg": np.frombuffer(b"rot13", np.uint8)})


def test_nonlinear_and_unconvertible_systems_are_refused():
    with pytest.raises(InvalidArgumentError, match="coding='immersion'"):
        encrypt_controller(lambda x, y: x, input_range=1, output_range=1)
    control = pytest.importorskip("control")
    nonlinear = control.NonlinearIOSystem(
        lambda t, x, u, p: -x + u, lambda t, x, u, p: x, states=1, inputs=1, outputs=1, dt=True
    )
    with pytest.raises(InvalidArgumentError, match="linear time-invariant.*coding='immersion'"):
        encrypt_controller(nonlinear, input_range=1, output_range=1)
    continuous = control.ss([[-1.0]], [[1.0]], [[1.0]], [[0.0]])
    with pytest.raises(InvalidArgumentError, match="continuous-time.*c2d"):
        encrypt_controller(continuous, input_range=1, output_range=1)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        encrypt_controller(([[np.nan]], [[1]], [[1]], [[0]]), input_range=1, output_range=1)
    with pytest.raises(InvalidArgumentError, match="B"):
        encrypt_controller(([[1.0]], [[1, 2]], [[1]], [[0]]), input_range=1, output_range=1)
    # a pair whose deadbeat form is too ill-conditioned to be exact is refused, not run wrongly
    F = np.diag([0.999, 0.9991, 0.9992, 0.9993, 0.9994, 0.9995])
    with pytest.raises(InvalidArgumentError, match="cannot be converted"):
        encrypt_controller(
            (F, np.ones((6, 1)), np.ones((1, 6)), [[0.0]]), input_range=1, output_range=1
        )


def test_python_control_statespace_equals_arrays():
    control = pytest.importorskip("control")
    loop = lqg_loop(2)
    sys = control.ss(*loop.controller, dt=0.05)
    a, b = (
        _encrypt(loop, rng=4),
        encrypt_controller(
            sys, input_range=loop.input_range, output_range=loop.output_range, rng=4
        ),
    )
    assert np.array_equal(a.target.theta_b, b.target.theta_b)


def test_loop_order_ranges_and_options_are_checked():
    ctrl = encrypt_controller(pi_loop().controller, input_range=3, output_range=6, rng=0)
    with pytest.raises(InvalidArgumentError, match="encode_state"):
        ctrl.encode_input([0.1])
    xt = ctrl.encode_state()
    yt = ctrl.encode_input([0.1])
    ut = ctrl.target.output(xt, yt)
    with pytest.raises(CiphertextIntegrityError):
        ctrl.decode_output(ut, ctrl.encode_input([0.2]))  # the reply to an earlier input
    ctrl = encrypt_controller(pi_loop().controller, input_range=3, output_range=6, rng=0)
    xt = ctrl.encode_state()
    yt = ctrl.encode_input([0.1])
    ctrl.decode_output(ctrl.target.output(xt, yt), yt)
    with pytest.raises(InvalidArgumentError, match="encoded_input"):
        ctrl.decode_output(ctrl.target.output(xt, yt), yt)  # one decode per sample
    with pytest.raises(WrapAroundError, match="input_range"):
        ctrl.encode_input([3.5])
    with pytest.raises(InvalidArgumentError, match="encoded_input"):
        ctrl.target.output(xt, yt[:-1])
    with pytest.raises(InvalidArgumentError, match="x0"):
        ctrl.encode_state(np.ones(1))
    with pytest.raises(InvalidArgumentError, match="secure"):
        encrypt_controller(pi_loop().controller, input_range=3, output_range=6, secure="yes")
    with pytest.raises(InvalidArgumentError, match="either rng or secure"):
        encrypt_controller(pi_loop().controller, input_range=3, output_range=6, rng=1, secure=True)
    with pytest.raises(InvalidArgumentError, match="input_range.*required"):
        encrypt_controller(pi_loop().controller, output_range=6)


def test_keys_come_from_os_entropy_by_default():
    a = encrypt_controller(pi_loop().controller, input_range=3, output_range=6)
    b = encrypt_controller(pi_loop().controller, input_range=3, output_range=6)
    c = encrypt_controller(pi_loop().controller, input_range=3, output_range=6, rng=2)
    d = encrypt_controller(pi_loop().controller, input_range=3, output_range=6, rng=2)
    assert a._key.fingerprint != b._key.fingerprint and c._key.fingerprint == d._key.fingerprint
    assert "fingerprint" in repr(a._key) and "s=" not in repr(a._key)


def test_remote_lwe_loop_on_loopback(four_tank):
    """`immersion serve` runs the encrypted controller: the coefficient ciphertexts at set-up,
    one input ciphertext up and one degree-2 reply down per sample."""
    pytest.importorskip("zmq")
    from immersion.remote.client import RemoteTarget
    from immersion.remote.server import Service

    loop, _ = four_tank
    ctrl = _encrypt(loop, rng=5)
    with Service("tcp://127.0.0.1:*", log=lambda *a, **k: None) as service:
        with RemoteTarget(service.address, ctrl, timeout_s=20) as cloud:
            assert cloud.kind == "lwe"
            us, us_twin, _ = _closed_loop(loop, ctrl, 20, cloud=cloud)
    assert np.array_equal(us, us_twin)


def test_the_server_keeps_the_encrypted_history_and_a_restart_rebuilds_it(four_tank):
    """The state stays on the server (the client sends none and gets an empty array back); the
    server SIGKILLed and restarted mid-loop: the client sets up again and re-sends its last W
    inputs, and every decoded u is still the twin's."""
    pytest.importorskip("zmq")
    import signal

    from immersion.remote.client import RemoteTarget
    from immersion.remote.process import ServerProcess

    loop, _ = four_tank
    ctrl = _encrypt(loop, rng=6)
    A, B, C = loop.plant
    twin = ctrl.fixed_point_twin()
    server = ServerProcess()
    address = server.address
    try:
        with RemoteTarget(address, ctrl, timeout_s=3, attempts=40) as cloud:
            x, xt = loop.x0.copy(), ctrl.encode_state()
            for k in range(12):
                if k == 7:
                    server.kill()
                    assert server.returncode == -signal.SIGKILL
                    server = ServerProcess(address)
                y = C @ x
                yt = ctrl.encode_input(y)
                ut, xt = cloud.advance(xt, yt)
                assert xt.size == 0 and cloud.bytes_sent == (k + 1) * yt.nbytes
                u = ctrl.decode_output(ut, yt)
                assert np.array_equal(u, twin.output(y))
                x = A @ x + B @ u
            assert cloud.resumed == 1
    finally:
        server.stop()


def test_immerse_system_coding_lwe():
    """``immerse_system(sys, coding="lwe", ...)``: the same handle as ``encrypt_controller``."""
    from immersion import immerse_system

    loop = lqg_loop(2)
    ranges = {"input_range": loop.input_range, "output_range": loop.output_range}
    ctrl = immerse_system(loop.controller, coding="lwe", rng=0, **ranges)
    same = encrypt_controller(loop.controller, rng=0, **ranges)
    assert np.array_equal(ctrl.target.theta_b, same.target.theta_b)
    assert immerse_system(loop.controller, coding="lwe", hide_gains=True, rng=0, **ranges)
    with pytest.raises(InvalidArgumentError, match="accepted: input_range") as err:
        immerse_system(loop.controller, coding="lwe", epsilon_input=1e-3, **ranges)
    assert err.value.argument == "epsilon_input"
    for bad in (False, "yes"):
        with pytest.raises(InvalidArgumentError, match="always encrypts the gains"):
            immerse_system(loop.controller, coding="lwe", hide_gains=bad, **ranges)
    control = pytest.importorskip("control")
    nonlinear = control.nlsys(
        lambda t, x, u, p: 0.5 * x + u, lambda t, x, u, p: x, states=1, inputs=1, outputs=1,
        dt=True,
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="coding='immersion'") as err:
        immerse_system(nonlinear, coding="lwe", **ranges)
    assert err.value.argument == "sys"


def test_numba_and_numpy_kernels_compute_the_same_integers(monkeypatch):
    pytest.importorskip("numba")
    from immersion.lwe import kernels
    from immersion.lwe.rns import RnsRing, ntt_primes

    ring = RnsRing(64, ntt_primes(64, 3))
    q = ring.q[:, 0]
    rng = np.random.default_rng(5)

    def residues(*shape):
        return rng.integers(0, 2**25, shape).astype(np.uint64) % q[:, None]

    a, s, s2, te, b0 = (residues(3, 64) for _ in range(5))
    th_b, th_a, v_b, v_a = (residues(20, 3, 64) for _ in range(4))  # 20 terms: reduced too
    mono, readers = residues(40, 3, 64), residues(3, 3, 64).astype(np.int32)
    values = rng.integers(0, 2**25, (40, 3)).astype(np.uint64) % q  # 40 terms: sums reduced
    signed = rng.integers(-(2**40), 2**40, 64)
    scale = rng.integers(0, 2**25, 3).astype(np.uint64) % q
    window = np.stack([v_b[1:], v_a[1:]], axis=1).astype(np.uint32)
    c1, c2 = a.astype(np.uint32), b0.astype(np.uint32)
    uniform = rng.integers(0, 2**64, 1200, dtype=np.uint64)
    thresholds = np.sort(rng.integers(0, 2**64, 40, dtype=np.uint64))
    from immersion.lwe.rlwe import _CDT

    # the error law's thresholds, one below and one above each, their buckets' ends, and
    # words in the split buckets: the table shortcut and the full count must agree on all
    edges = np.concatenate([_CDT, _CDT - np.uint64(1), _CDT + np.uint64(1)])
    buckets = (_CDT >> np.uint64(48)) << np.uint64(48)
    ends = np.array([0, 2**64 - 1], dtype=np.uint64)
    edges = np.concatenate([edges, buckets, buckets + np.uint64(2**48 - 1), ends])
    edges = np.concatenate([edges, uniform]).astype(np.uint64)
    q_of = kernels.quotients
    bad = c1.copy()
    bad[1, 7] = q[1]  # a word that is not a residue

    def run():
        return [
            kernels.ntt(a.copy(), ring._psi_rev, ring._psi_rev_q, q),
            kernels.ntt_signed(signed, scale, ring._psi_rev, ring._psi_rev_q, q),
            kernels.intt(a.copy(), ring._psi_inv_rev, ring._psi_inv_rev_q, q),
            kernels.zero(a.astype(np.uint32), s.astype(np.float64), q_of(s, q), te, q),
            kernels.add_sparse(
                b0.astype(np.uint32),
                kernels.centred(mono, q),
                kernels.centred(values[:, :, None], q)[:, :, 0].astype(float),
                q,
            ),
            kernels.products(
                kernels.centred(th_b, q),
                kernels.centred(th_a, q),
                v_b[0].astype(np.uint32),
                v_a[0].astype(np.uint32),
                window,
                readers,
                q,
            ),
            *kernels.decrypt_read(c1, c2, s.astype(np.float64), s2.astype(np.float64), readers, q),
            kernels.sample_cdt(uniform, thresholds, kernels.cdt_table(thresholds)),
            kernels.sample_cdt(edges, _CDT, kernels.cdt_table(_CDT)),
            kernels.reject_uniform(uniform.view(np.uint32).reshape(3, 800), q, 64),
            kernels.decrypt_read(bad, c2, s.astype(np.float64), s2.astype(np.float64), readers, q)[
                1
            ],
        ]

    fast = run()
    monkeypatch.setenv("IMMERSION_NO_NUMBA", "1")
    kernels._numba.cache_clear()
    try:
        assert not kernels.available()
        slow = run()
    finally:
        monkeypatch.delenv("IMMERSION_NO_NUMBA")
        kernels._numba.cache_clear()
    assert fast[7] is True and fast[-1] is False  # the residue check of c1, c2
    for x, y in zip(fast, slow, strict=True):
        if isinstance(x, bool):
            assert x is y
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y)


def test_remote_lwe_bench_reports_round_trips_bytes_and_the_local_ratio():
    """`immersion bench remote --coding lwe`, short: a server child process on loopback."""
    pytest.importorskip("zmq")
    from click.testing import CliRunner
    from immersion.bench.remote import bench_remote_lwe
    from immersion.cli.main import main

    result = bench_remote_lwe(samples=12, curve=False)
    (row,) = result["rows"].values()
    assert result["benchmark"] == "remote-lwe" and row["bit_identical_to_twin"]
    assert row["bytes_sent_per_sample"] == row["design_bytes"]["up"]  # no state travels
    assert row["bytes_received_per_sample"] == row["design_bytes"]["down"]
    assert 0 < row["round_trip_us"]["p50_us"] <= row["round_trip_us"]["p99_us"]
    ratio = row["round_trip_us"]["p50_us"] / row["local_advance_us"]["p50_us"]
    assert row["p50_ratio_remote_vs_local_advance"] == pytest.approx(ratio)
    refused = CliRunner().invoke(main, ["bench", "remote", "--coding", "lwe", "--plants", "3"])
    assert refused.exit_code == 2 and "--plants" in refused.output
    refused = CliRunner().invoke(main, ["bench", "remote", "--precision", "1e-4"])
    assert refused.exit_code == 2 and "--coding lwe" in refused.output
    refused = CliRunner().invoke(main, ["bench", "remote", "--coding", "lwe", "--precision", "2"])
    assert refused.exit_code == 2 and "--precision" in refused.output
