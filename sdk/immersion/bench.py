"""Side-by-side timing of encode + target + decode against plain ``f, g`` (ratios, one process).

Used by ``benchmarks/bench_core.py`` and ``immersion bench core``; not run by the test suite.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .coding import Immersion, immerse

#: (n_state, keys) settings: small and medium dense, 1000 both ways, and 100,000 with block keys.
DEFAULT_SIZES: tuple[tuple[int, str], ...] = (
    (3, "dense"),
    (100, "dense"),
    (1000, "dense"),
    (1000, "block"),
    (100_000, "block"),
)


def _algorithms(
    n: int, rng: np.random.Generator
) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """Two workloads: element-wise nonlinear (O(n)) and, up to n = 1000, dense linear (O(n^2))."""
    algos: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "elementwise": (lambda x, y: 0.9 * np.tanh(x) + 0.1 * y, lambda x, y: x - y)
    }
    if n <= 1000:
        a = rng.standard_normal((n, n)) * (0.9 / np.sqrt(n))
        algos["dense-linear"] = (lambda x, y: a @ x + y, lambda x, y: a @ x - y)
    return algos


def _time_loop(step: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def _time_pair(
    imm: Immersion,
    f: Callable[..., Any],
    g: Callable[..., Any],
    x: np.ndarray,
    y: np.ndarray,
    steps: int,
    repeats: int,
) -> tuple[float, float, np.ndarray, Any]:
    """Best-of-``repeats`` per-step times of the plain and the immersed loop, alternating."""
    state = {"x": x, "xt": imm.encode_state(x)}

    def plain() -> None:
        g(state["x"], y)
        state["x"] = f(state["x"], y)

    def immersed() -> None:
        yt = imm.encode_input(y)
        imm.decode_output(imm.target.output(state["xt"], yt), yt)
        state["xt"] = imm.target.step(state["xt"], yt)

    t_plain, t_imm = np.inf, np.inf
    for _ in range(repeats):
        t_plain = min(t_plain, _time_loop(plain, steps))
        t_imm = min(t_imm, _time_loop(immersed, steps))
    return t_plain, t_imm, state["x"], state["xt"]


def bench_core(
    *,
    sizes: tuple[tuple[int, str], ...] = DEFAULT_SIZES,
    steps: int = 200,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per-step time of plain ``f, g`` and of the immersed loop (encode, output, step, decode).

    Each configuration is timed ``repeats`` times, plain and immersed alternating, and the
    minimum of each is kept; the figure of merit is the ratio immersed / plain.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for n, kind in sizes:
        for name, (f, g) in _algorithms(n, rng).items():
            if progress:
                progress(f"n_state={n} keys={kind} workload={name}")
            t_build = time.perf_counter()
            imm = immerse(f, g, n_state=n, n_input=n, n_output=n, keys=kind, rng=seed)  # type: ignore[arg-type]
            build_s = time.perf_counter() - t_build
            x = rng.standard_normal(n) * 0.1
            y = rng.standard_normal(n) * 0.1
            loop_steps = max(5, steps if n <= 1000 else steps // 10)
            t_plain, t_imm, x_end, xt_end = _time_pair(imm, f, g, x, y, loop_steps, repeats)
            err = float(np.abs(imm.decode_state(xt_end) - x_end).max())
            rows.append(
                {
                    "n_state": n,
                    "keys": kind,
                    "workload": name,
                    "plain_step_s": t_plain,
                    "immersed_step_s": t_imm,
                    "step_time_ratio": t_imm / t_plain,
                    "key_build_s": build_s,
                    "key_bytes": imm.keys.nbytes,
                    "max_abs_state_error": err,
                    "decode_error_bound": imm.report().decode_error_bound,
                }
            )
    return {"benchmark": "core", "steps": steps, "repeats": repeats, "results": rows}
