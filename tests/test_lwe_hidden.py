"""Hidden gains (BFV through TenSEAL): bit-identical to the twin, no secret key in the cloud."""

from __future__ import annotations

import pickle

import pytest
from immersion import InvalidArgumentError, OptionalDependencyError
from immersion.lwe import encrypt_controller_and_gains
from immersion.lwe.examples import lqg_loop
from immersion.lwe.hidden import batching_prime

ts = pytest.importorskip("tenseal", reason="hidden gains need tenseal (extra 'baselines')")
pytestmark = pytest.mark.slow  # BFV keys with Galois keys at N = 8192: seconds on 2 cores


@pytest.fixture(scope="module")
def hidden():
    loop = lqg_loop(2)
    return loop, encrypt_controller_and_gains(
        loop.controller, input_range=loop.input_range, output_range=loop.output_range
    )


def test_hidden_gains_loop_is_bit_identical_to_the_twin(hidden):
    loop, imm = hidden
    A, B, C = loop.plant
    w, v = loop.disturbance(12)
    twin = imm.fixed_point_twin()
    x, xt = loop.x0.copy(), imm.encode_state()
    for k in range(12):
        y = C @ x + v[k]
        yt = imm.encode_input(y)
        ut, xt = imm.target.advance(xt, yt)
        u = imm.decode_output(ut, yt)
        assert u[0] == twin.output(y)[0]
        x = A @ x + B @ u + w[k]
    assert imm.plain_modulus % (2 * 8192) == 1
    assert imm.plain_modulus > 2 * imm.design.acc_bound


def test_cloud_holds_no_secret_key_and_no_plain_gains(hidden):
    _, imm = hidden
    cloud = pickle.loads(pickle.dumps(imm.target))
    cloud._load()
    assert not cloud._context.is_private()
    with pytest.raises(ValueError):  # a public context cannot decrypt the gains it holds
        cloud._rows[0].decrypt()
    blob = pickle.dumps(imm.target)
    for c in imm.design.matrix[0]:
        if abs(c) > 2**20:  # the integer gains do not appear in clear (8-byte little endian)
            assert int(c).to_bytes(8, "little", signed=True) not in blob
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(imm)


def test_hidden_gains_refusals(monkeypatch, hidden):
    _, imm = hidden
    with pytest.raises(InvalidArgumentError, match="decode_output"):
        imm.encode_state()
        imm.encode_input([0.1])
        imm.encode_input([0.1])
    import immersion.lwe.hidden as hidden_module

    def missing():
        raise OptionalDependencyError("tenseal", "baselines", "encrypt_controller_and_gains")

    monkeypatch.setattr(hidden_module, "_tenseal", missing)
    with pytest.raises(OptionalDependencyError, match="baselines"):
        encrypt_controller_and_gains(lqg_loop(2).controller, input_range=1, output_range=1)


def test_batching_prime():
    for bits in (20, 40, 59):
        t = batching_prime(bits)
        assert t.bit_length() == bits and t % 16384 == 1
        assert all(t % p for p in range(2, 2000))
