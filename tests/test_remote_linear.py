"""A linear controller served without a plugin: the built-in target kinds ``linear`` (float
immersion) and ``linear-modular``, beside ``lwe``, over loopback.

* Decode-exact against the plain closed loop, round by round (plant, controller, plant ...).
* The set-up carries only what the cloud may hold: no key, no left inverse of the float coding,
  no gains in the float coding (only the encoded target matrices).
* An arbitrary ``f``, ``g`` still needs a registered algorithm, and the errors say how.
* ``immersion serve``'s start-up line counts listed clients and admins apart.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from immersion import InvalidArgumentError, immerse, immerse_system
from immersion.remote.kinds import TARGET_KINDS, kind_of

zmq = pytest.importorskip("zmq")
control = pytest.importorskip("control")

from immersion.remote.client import RemoteTarget  # noqa: E402
from immersion.remote.server import Service  # noqa: E402

# a discrete LQG-like controller of a 2-state plant (y -> u), and the plant
PLANT_A = np.array([[1.0, 0.1], [0.0, 0.95]])
PLANT_B = np.array([[0.005], [0.1]])
PLANT_C = np.array([[1.0, 0.0]])
CONTROLLER = control.ss([[0.7, 0.05], [-0.3, 0.8]], [[0.3], [0.4]], [[-1.5, -0.8]], [[0.0]], dt=0.1)
CODINGS = {
    "linear": ({}, 1e-9),
    "linear-modular": ({"arithmetic": "modular"}, 1e-6),  # the fixed-point grid, 2^-32
    "lwe": ({"coding": "lwe", "input_range": 2.0, "output_range": 5.0}, 1e-3),
}


def _quiet(line: str) -> None:
    """A log sink that drops the lines."""


def _loop(imm, cloud, steps: int = 40):
    """The closed loop through ``cloud`` beside the plain one: the largest |u - u_plain| per
    round."""
    A, B, C, D = (np.asarray(getattr(CONTROLLER, m), dtype=float) for m in "ABCD")
    x_plant = np.array([1.0, -0.5])
    x_plain, x_ctrl = x_plant.copy(), np.zeros(2)
    xt = imm.encode_state() if hasattr(imm, "design") else imm.encode_state(np.zeros(2))
    errors = []
    for _ in range(steps):
        y = PLANT_C @ x_plant
        yt = imm.encode_input(y)
        ut, xt = cloud.advance(xt, yt)
        u = imm.decode_output(ut, yt)
        y_plain = PLANT_C @ x_plain
        u_plain = C @ x_ctrl + D @ y_plain
        x_ctrl = A @ x_ctrl + B @ y_plain
        errors.append(float(np.abs(u - u_plain).max()))
        x_plant = PLANT_A @ x_plant + PLANT_B @ u
        x_plain = PLANT_A @ x_plain + PLANT_B @ u_plain
    return errors


@pytest.mark.parametrize("kind", sorted(CODINGS))
def test_a_linear_controller_is_served_without_a_plugin(kind):
    options, tolerance = CODINGS[kind]
    imm = immerse_system(CONTROLLER, **options)
    assert kind_of(imm).name == kind and not TARGET_KINDS[kind].needs_algorithm
    with Service("tcp://127.0.0.1:*", log=_quiet) as service:
        with RemoteTarget(service.address, imm) as cloud:
            assert cloud.kind == kind
            remote = _loop(imm, cloud)
    local = _loop(imm, imm.target)
    assert max(remote) < tolerance, remote
    if kind == "linear-modular":  # the same integers as the in-process target, bit for bit
        assert remote == local
    else:
        np.testing.assert_allclose(remote, local, atol=tolerance)


@pytest.mark.parametrize("kind", ["linear", "linear-modular"])
def test_the_setup_carries_no_secret(kind):
    imm = immerse_system(CONTROLLER, **CODINGS[kind][0])
    arrays = TARGET_KINDS[kind].public_arrays(imm)
    assert set(arrays) == TARGET_KINDS[kind].array_names
    shipped = [np.asarray(a) for a in arrays.values()]
    held_back = {"N1": imm.keys.N1, "Pi3_left": imm.keys.Pi3_left}
    if kind == "linear":  # only the products travel: no key, no left inverse, no gain
        held_back.update(
            Pi1_left=imm.keys.Pi1_left,
            Pi2=imm.keys.Pi2,
            Pi2_left=imm.keys.Pi2_left,
            Pi3=imm.keys.Pi3,
            A=np.asarray(CONTROLLER.A, dtype=float),
            B=np.asarray(CONTROLLER.B, dtype=float),
        )
    for name, secret in held_back.items():
        for arr in shipped:
            assert not (arr.shape == secret.shape and np.array_equal(arr, secret)), name
    # nor anywhere inside the set-up's bytes
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    for secret in held_back.values():
        assert np.ascontiguousarray(secret).tobytes() not in buffer.getvalue()


def test_an_arbitrary_f_g_needs_a_registered_algorithm_and_the_errors_say_how():
    imm = immerse(
        lambda x, y: np.tanh(x) + y, lambda x, y: x, 1, 1, 1, keys="dense", tolerance=None
    )
    assert kind_of(imm).name == "immersion"
    with Service("tcp://127.0.0.1:*", log=_quiet) as service:
        with pytest.raises(InvalidArgumentError, match="registered .* plugin.*immerse_system"):
            RemoteTarget(service.address, imm)
        with pytest.raises(Exception, match="unknown algorithm 'my-lqg'.*No code travels.*plugin"):
            RemoteTarget(service.address, imm, algorithm="my-lqg")


def test_naming_an_algorithm_keeps_the_registered_route():
    imm = immerse_system(CONTROLLER)
    assert kind_of(imm, algorithm="lqr-kalman").name == "immersion"


def test_serve_counts_clients_and_admins_apart(tmp_path):
    from immersion.remote.curve import new_curve_keys

    _, server_secret = new_curve_keys(tmp_path / "server", "server")
    new_curve_keys(tmp_path / "clients", "plant-1")
    new_curve_keys(tmp_path / "admins", "admin")
    lines: list[str] = []
    with Service(
        "tcp://127.0.0.1:*",
        server_key=server_secret,
        clients=tmp_path / "clients",
        admins=tmp_path / "admins",
        log=lines.append,
    ):
        pass
    listening = next(line for line in lines if "listening" in line)
    assert "clients=1" in listening and "admins=1" in listening, listening
