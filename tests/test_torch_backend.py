"""torch backend (CPU here; CUDA when present) gives the numpy results to tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from immersion import immerse
from immersion.testing import random_contractive_system

torch = pytest.importorskip("torch")


def _torch_system(f_np, g_np, n_state, n_input, n_output, seed):
    """The same random system written with torch ops (same matrices)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n_state, n_state))
    a *= 0.8 / max(np.linalg.norm(a, 2), 1e-12)
    b, c, d = (
        rng.standard_normal(s)
        for s in ((n_state, n_input), (n_output, n_state), (n_output, n_input))
    )
    bias = rng.standard_normal(n_state) * 0.1
    t = {
        k: torch.as_tensor(v, dtype=torch.float64)
        for k, v in dict(a=a, b=b, c=c, d=d, bias=bias).items()
    }

    def f(x, y):
        return torch.tanh(t["a"] @ x + t["b"] @ y + t["bias"])

    def g(x, y):
        return torch.sin(t["c"] @ x) + 0.5 * t["d"] @ y + 0.1 * (t["c"] @ x) ** 2

    return f, g


@pytest.mark.parametrize("kind", ["dense", "block"])
@pytest.mark.parametrize("epsilon", [1.0, 1e-3])
def test_torch_cpu_float64_equals_numpy(kind, epsilon):
    """Same keys, same encoded inputs: encoded results agree to 1e-12 relative to their size.

    Decoded values cancel noise of size ~1/epsilon, so two correct backends that round in a
    different order differ by up to the decode error bound: 1e-12 absolute at epsilon = 1, and
    within the predicted bound (~1e-11) at the default epsilon = 1e-3.
    """
    n, ni, no, seed = 5, 2, 3, 3
    f_np, g_np = random_contractive_system(n, ni, no, seed=seed)
    f_t, g_t = _torch_system(f_np, g_np, n, ni, no, seed)
    common = dict(
        n_state=n,
        n_input=ni,
        n_output=no,
        extra_input=2,
        extra_output=2,
        keys=kind,
        block_size=3,
        rng=9,
        epsilon_input=epsilon,
        epsilon_output=epsilon,
    )
    imm_np = immerse(f_np, g_np, **common)
    imm_t = immerse(f_t, g_t, backend="torch", **common)
    assert imm_np.keys.fingerprint == imm_t.keys.fingerprint
    x, xt_np = np.full(n, 0.2), imm_np.encode_state(np.full(n, 0.2))
    xt_t = imm_t.encode_state(torch.full((n,), 0.2, dtype=torch.float64))
    inputs = np.random.default_rng(0).standard_normal((100, ni))
    decoded_tol = 1e-12 if epsilon == 1.0 else imm_np.report().decode_error_estimate
    for y in inputs:
        yt = imm_np.encode_input(y)  # the same encoded input on both backends
        yt_t = torch.as_tensor(yt)
        ut_np, ut_t = imm_np.target.output(xt_np, yt), imm_t.target.output(xt_t, yt_t)
        scale = np.abs(ut_np).max()
        np.testing.assert_allclose(ut_t.numpy(), ut_np, rtol=0, atol=1e-12 * scale)
        u_np, u_t = imm_np.decode_output(ut_np, yt), imm_t.decode_output(ut_t, yt_t)
        np.testing.assert_allclose(u_t.numpy(), u_np, rtol=0, atol=decoded_tol)
        xt_np, xt_t = imm_np.target.step(xt_np, yt), imm_t.target.step(xt_t, yt_t)
        np.testing.assert_allclose(
            imm_t.decode_state(xt_t).numpy(), imm_np.decode_state(xt_np), rtol=0, atol=decoded_tol
        )
        x = f_np(x, y)
    np.testing.assert_allclose(imm_np.decode_state(xt_np), x, atol=1e-9)


def test_torch_backend_run_is_exact_against_plain():
    f_np, g_np = random_contractive_system(4, 1, 1, seed=0)
    f_t, g_t = _torch_system(f_np, g_np, 4, 1, 1, 0)
    imm = immerse(f_t, g_t, n_state=4, n_input=1, n_output=1, backend="torch", rng=0)
    x = np.zeros(4)
    xt = imm.encode_state(torch.zeros(4, dtype=torch.float64))
    for k in range(100):
        y = np.array([np.sin(k / 3)])
        yt = imm.encode_input(torch.as_tensor(y))
        u = imm.decode_output(imm.target.output(xt, yt), yt)
        np.testing.assert_allclose(u.numpy(), g_np(x, y), atol=1e-9)
        x, xt = f_np(x, y), imm.target.step(xt, yt)


def test_float32_works_at_a_feasible_epsilon():
    f = lambda x, y: 0.5 * x + y  # noqa: E731
    g = lambda x, y: x  # noqa: E731
    imm = immerse(
        f,
        g,
        n_state=3,
        n_input=3,
        n_output=3,
        backend="torch",
        dtype="float32",
        epsilon_input=1.0,
        epsilon_output=1.0,
        tolerance=1e-2,
        rng=0,
    )
    assert imm.report().dtype == "float32"
    y = torch.tensor([0.1, -0.2, 0.3])
    yt = imm.encode_input(y)
    assert yt.dtype == torch.float32
    xt = imm.target.step(imm.encode_state(torch.zeros(3)), yt)
    err = (imm.decode_state(xt) - y).abs().max().item()
    assert err <= imm.report().decode_error_estimate


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_matches_cpu(dtype):
    f = lambda x, y: torch.tanh(0.5 * x + y)  # noqa: E731
    g = lambda x, y: x * y  # noqa: E731
    common = dict(
        n_state=2000,
        n_input=2000,
        n_output=2000,
        keys="block",
        epsilon_input=1.0,
        epsilon_output=1.0,
        tolerance=None,
        rng=0,
        dtype=dtype,
    )
    cpu = immerse(f, g, backend="torch", device="cpu", **common)
    gpu = immerse(f, g, backend="torch", device="cuda", **common)
    y = torch.linspace(-1, 1, 2000, dtype=getattr(torch, dtype))
    yt = cpu.encode_input(y)
    xt = cpu.encode_state(torch.zeros(2000, dtype=y.dtype))
    x_cpu = cpu.decode_state(cpu.target.step(xt, yt))
    x_gpu = gpu.decode_state(gpu.target.step(xt.cuda(), yt.cuda())).cpu()
    tol = 1e-9 if dtype == "float64" else 5 * cpu.report().decode_error_estimate
    assert (x_cpu - x_gpu).abs().max().item() <= tol
