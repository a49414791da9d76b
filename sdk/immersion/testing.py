"""Helpers for users' and plugins' tests: side-by-side runs and conformance checks."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .coding.factory import Immersion


@dataclass(frozen=True)
class SideBySide:
    """Plain and decoded trajectories of one run."""

    outputs_plain: np.ndarray
    outputs_decoded: np.ndarray
    states_plain: np.ndarray
    states_decoded: np.ndarray

    @property
    def max_output_error(self) -> float:
        return float(np.abs(self.outputs_plain - self.outputs_decoded).max())

    @property
    def max_state_error(self) -> float:
        return float(np.abs(self.states_plain - self.states_decoded).max())


def run_side_by_side(
    imm: Immersion,
    f: Callable[..., Any],
    g: Callable[..., Any],
    *,
    x0: Any,
    inputs: np.ndarray,
    public: np.ndarray | None = None,
) -> SideBySide:
    """Run the plain algorithm and the immersed one on the same inputs, step by step.

    Examples
    --------
    >>> from immersion import immerse
    >>> f, g = (lambda x, y: 0.5 * x + y), (lambda x, y: 2 * x)
    >>> imm = immerse(f, g, n_state=1, n_input=1, n_output=1, rng=0)
    >>> run = run_side_by_side(imm, f, g, x0=np.zeros(1), inputs=np.ones((10, 1)))
    >>> run.max_output_error < 1e-9
    True
    """
    to_np = imm.backend.to_numpy
    x = np.asarray(x0, dtype=np.float64)
    xt = imm.encode_state(x0)
    out_p, out_d, st_p, st_d = [], [], [], []
    for k, y in enumerate(inputs):
        args = () if public is None else (public[k],)
        yt = imm.encode_input(y)
        out_p.append(np.asarray(g(x, y, *args), dtype=np.float64).reshape(-1))
        out_d.append(to_np(imm.decode_output(imm.target.output(xt, yt, *args), yt)))
        x = np.asarray(f(x, y, *args), dtype=np.float64).reshape(-1)
        xt = imm.target.step(xt, yt, *args)
        st_p.append(x)
        st_d.append(to_np(imm.decode_state(xt)))
    return SideBySide(np.array(out_p), np.array(out_d), np.array(st_p), np.array(st_d))


def assert_close_to_plain(run: SideBySide, *, rtol: float = 1e-9) -> None:
    """Decoded outputs and states equal the plain run within ``rtol`` of each signal's scale."""
    for name, plain, decoded in (
        ("output", run.outputs_plain, run.outputs_decoded),
        ("state", run.states_plain, run.states_decoded),
    ):
        scale = max(1.0, float(np.abs(plain).max()))
        err = float(np.abs(plain - decoded).max())
        assert err <= rtol * scale, (
            f"decoded {name} differs from plain by {err:.3g} (> {rtol:g} x {scale:.3g})"
        )


def random_contractive_system(
    n_state: int, n_input: int, n_output: int, *, seed: int
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A random nonlinear system whose state stays bounded (tanh of a contraction)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n_state, n_state))
    a *= 0.8 / max(float(np.linalg.norm(a, 2)), 1e-12)
    b, c, d = (
        rng.standard_normal(s)
        for s in ((n_state, n_input), (n_output, n_state), (n_output, n_input))
    )
    bias = rng.standard_normal(n_state) * 0.1

    def f(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.tanh(a @ x + b @ y + bias)

    def g(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.sin(c @ x) + 0.5 * d @ y + 0.1 * (c @ x) ** 2

    return f, g


#: Attribute values that must never be reachable from a pickled target.
def secret_arrays(imm: Immersion) -> dict[str, np.ndarray]:
    """The arrays the cloud must not receive: ``N1`` and ``Pi3_left`` (dense views)."""
    return {"N1": imm.keys.N1, "Pi3_left": imm.keys.Pi3_left}


def assert_target_has_no_secrets(imm: Immersion) -> bytes:
    """Pickle ``imm.target`` and check that no secret array or noise generator is inside it.

    Uses cloudpickle when installed (it also serialises lambdas and local functions, as a real
    deployment would), else the standard pickle.
    """
    try:
        import cloudpickle

        blob = cloudpickle.dumps(imm.target)
    except ImportError:
        blob = pickle.dumps(imm.target)
    for name, arr in secret_arrays(imm).items():
        dtype = arr.dtype if arr.dtype.kind == "u" else np.float64  # integer keys stay integers
        for candidate in (arr, arr.T):
            raw = np.ascontiguousarray(candidate, dtype=dtype).tobytes()
            assert raw not in blob, f"the pickled target contains {name}"
    for marker in (b"Generator", b"PCG64", b"NoiseStream", b"noise_rng", b"noise_pos"):
        assert marker not in blob, f"the pickled target contains {marker!r}"
    return blob
