"""Per-sample cost of an immersed control loop against the plain controller, and of key rotation.

Run:  .venv/bin/python benchmarks/bench_control_loop.py [--baseline-ref REF] [--runs 1]
      [--repeats 15] [--samples 512] [--chunk 64] [--only loop|rotation]
(prints one JSON object; progress on stderr)

Two measurements, each interleaved in one process: the two loops run over the same recorded
samples in chunks of 64, one chunk of one then the same chunk of the other (the order swapped
every chunk), so that the load of a shared machine hits both alike.

* ``loop``: one closed-loop sample of the plain controller (``u = g(x, y)``, ``x = f(x, y)``)
  against the immersed one (``encode_input``, the cloud's ``advance``, ``decode_output``), for
  the reactor's adaptive controller (seed 002 VI-B: 3 states, 1 measurement, 1 input), a 2-state
  LQG (a mass with friction, position measured, designed with scipy's Riccati solver) and, when
  python-control is installed, the 4-state LQG of ``control_demos/python_control_lqg.py``. The
  inputs ``y`` are those of the plain closed loop with its plant (recorded once, outside the
  timings); the plain LQG step is the controller's own matrices (``C @ x + D @ y``,
  ``A @ x + B @ y``), the immersed one goes through ``immerse_system``.
* ``rotation``: the immersed loop under one key (``immerse``) against
  ``RotatingImmersion(..., rotate_keys_every=2).step`` (fresh keys every ``extra_input = 2``
  samples, the cloud moving its state to each new key), for the reactor and the 2-state LQG.
  One rotating handle runs through all repeats, so that the key periods drawn ahead in batches
  are counted in proportion (with the default 512 samples, each pass over the recording draws
  one batch of 256 periods, always in the same chunk).

Per case: for each chunk of the recording the median over repeats of its per-sample time (robust
to the chunks another process interrupts), averaged over the chunks (``*_us``, and their
quotient ``ratio``); the ratio of the total times (``ratio_of_totals``, which a single
interrupted chunk can sway) and of the fastest chunks (``ratio_of_mins``). With
``--baseline-ref`` the same measurements run on the ``sdk/`` and ``plugins/`` of that git
revision (``git archive``), in separate processes alternating with this tree, and the JSON
carries both (each figure the median over ``--runs`` processes). The load average of the machine
is printed with the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from trees import REPO, extract_tree, tree_env  # benchmarks/trees.py (the script's folder)

#: The goals of the two measurements (immersed / plain; rotating / still).
LOOP_GOAL, ROTATION_GOAL = 3.0, 2.0


# ---------------------------------------------------------------- the controllers
class _Case:
    """A controller ``x+ = f(x, y)``, ``u = g(x, y)``, its immersion and its recorded inputs."""

    def __init__(
        self,
        name: str,
        f: Callable[..., Any],
        g: Callable[..., Any],
        x0: np.ndarray,
        ys: np.ndarray,
        immerse_options: dict[str, Any],
        immersed: Any,
    ) -> None:
        self.name, self.f, self.g, self.x0, self.ys = name, f, g, x0, ys
        self.options, self.imm = immerse_options, immersed


def _reactor(samples: int) -> _Case:
    from immersion import immerse
    from immersion_reactor.model import ReactorController, ReactorParameters
    from immersion_reactor.simulation import ReactorPlant

    params, ctrl = ReactorParameters(), ReactorController(dt=0.01)
    plant = ReactorPlant(params, dt=0.01, substeps=10, samples=samples)
    x, ys = ctrl.initial_state.copy(), []
    for _ in range(samples):
        y = plant.measure()
        ys.append(y)
        u = ctrl.g(x, y)
        x = ctrl.f(x, y)
        plant.advance(float(u[0]))
    options = dict(
        n_state=3,
        n_input=1,
        n_output=1,
        extra_state=1,
        extra_input=2,
        extra_output=2,
        probe=(ctrl.initial_state, np.array([params.initial_state[0]])),
    )
    imm = immerse(ctrl.f, ctrl.g, rng=0, **options)
    return _Case("reactor", ctrl.f, ctrl.g, ctrl.initial_state.copy(), np.array(ys), options, imm)


def _lqg_from(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(A - B K - L C, L, -K, 0)``: LQR gain and Kalman gain from scipy's Riccati solver."""
    from scipy.linalg import solve_discrete_are

    n, m, p = A.shape[0], B.shape[1], C.shape[0]
    Q, R = np.diag([10.0] + [1.0] * (n - 1)), 0.1 * np.eye(m)
    P = solve_discrete_are(A, B, Q, R)
    K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
    W, V = 1e-6 * np.eye(n), 1e-4 * np.eye(p)
    S = solve_discrete_are(A.T, C.T, W, V)
    L = A @ S @ C.T @ np.linalg.inv(C @ S @ C.T + V)
    return A - B @ K - L @ C, L, -K, np.zeros((m, p))


def _lqg_case(name: str, plant: tuple[np.ndarray, ...], ctrl: Any, samples: int) -> _Case:
    """An LQG controller ``ctrl`` (a python-control system or ``(A, B, C, D)``) on ``plant``."""
    from immersion import immerse_system

    A, B, C = plant
    Ac, Bc, Cc, Dc = (np.asarray(m, dtype=float) for m in _matrices(ctrl))
    rng = np.random.default_rng(1)
    x, xc, ys = np.zeros(A.shape[0]), np.zeros(Ac.shape[0]), []
    x[0] = 1.0
    for _ in range(samples):
        y = C @ x + 1e-2 * rng.standard_normal(C.shape[0])
        ys.append(y)
        u = Cc @ xc + Dc @ y
        xc = Ac @ xc + Bc @ y
        x = A @ x + B @ u + 1e-3 * rng.standard_normal(A.shape[0])

    def f(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return Ac @ x + Bc @ y

    def g(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return Cc @ x + Dc @ y

    options = dict(extra_state=2, extra_input=2, extra_output=2)
    imm = immerse_system(ctrl, rng=0, **options)
    dims = dict(n_state=Ac.shape[0], n_input=Bc.shape[1], n_output=Cc.shape[0])
    return _Case(name, f, g, np.zeros(Ac.shape[0]), np.array(ys), {**dims, **options}, imm)


def _matrices(ctrl: Any) -> tuple[Any, ...]:
    return tuple(ctrl) if isinstance(ctrl, tuple) else (ctrl.A, ctrl.B, ctrl.C, ctrl.D)


def _lqg2(samples: int) -> _Case:
    """A mass with viscous friction (position, velocity), force input, position measured."""
    dt, friction = 0.05, 0.5
    A = np.array([[1.0, dt], [0.0, 1.0 - friction * dt]])
    B = np.array([[0.5 * dt * dt], [dt]])
    C = np.array([[1.0, 0.0]])
    return _lqg_case("lqg2", (A, B, C), _lqg_from(A, B, C), samples)


def _lqg4(samples: int) -> _Case | None:
    """The 4-state python-control LQG of control_demos/python_control_lqg.py (None without
    python-control)."""
    if importlib.util.find_spec("control") is None:
        return None
    spec = importlib.util.spec_from_file_location(
        "python_control_lqg", REPO / "control_demos" / "python_control_lqg.py"
    )
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    plant = demo.plant()
    return _lqg_case("lqg4_python_control", (plant.A, plant.B, plant.C), demo.lqg(plant), samples)


# ---------------------------------------------------------------- the loops
#: A run: continues one loop over the next recorded samples and returns the seconds it took.
Run = Callable[[np.ndarray], float]


def _plain_loop(case: _Case) -> Run:
    f, g, state = case.f, case.g, [case.x0.copy()]

    def run(ys: np.ndarray) -> float:
        x = state[0]
        start = time.perf_counter()
        for y in ys:
            g(x, y)
            x = f(x, y)
        elapsed = time.perf_counter() - start
        state[0] = x
        return elapsed

    return run


def _immersed_loop(imm: Any) -> Callable[[_Case], Run]:
    def start_loop(case: _Case) -> Run:
        encode, advance, decode = imm.encode_input, imm.target.advance, imm.decode_output
        state = [imm.encode_state(case.x0)]

        def run(ys: np.ndarray) -> float:
            xt = state[0]
            start = time.perf_counter()
            for y in ys:
                yt = encode(y)
                ut, xt = advance(xt, yt)
                decode(ut, yt)
            elapsed = time.perf_counter() - start
            state[0] = xt
            return elapsed

        return run

    return start_loop


def _rotating_loop(rot: Any) -> Callable[[_Case], Run]:
    def start_loop(case: _Case) -> Run:
        step, state = rot.step, [rot.encode_state(case.x0)]

        def run(ys: np.ndarray) -> float:
            xt = state[0]
            start = time.perf_counter()
            for y in ys:
                _, xt = step(y, xt)
            elapsed = time.perf_counter() - start
            state[0] = xt
            return elapsed

        return run

    return start_loop


def _interleaved(
    case: _Case,
    a: Callable[[_Case], Run],
    b: Callable[[_Case], Run],
    repeats: int,
    chunk: int,
) -> dict[str, Any]:
    """``a`` and ``b`` over the recorded samples, ``chunk`` samples of one then of the other.

    Each repeat runs both loops from the start of the recording, in chunks taken in turn (their
    order swapped every chunk). The figures take, for each chunk of the recording, the median
    over repeats of its per-sample time (robust to the chunks that another process interrupts),
    then the mean over the chunks (so that work done once per recording, such as a batch of key
    periods drawn ahead, counts in proportion): ``a_us``, ``b_us`` and ``ratio``. Also the ratio
    of the total times (``ratio_of_totals``) and of the fastest chunks (``ratio_of_mins``).
    """
    run_a, run_b = a(case), b(case)  # warm-up
    run_a(case.ys), run_b(case.ys)
    starts = range(0, len(case.ys), chunk)
    ta: list[list[float]] = [[] for _ in starts]
    tb: list[list[float]] = [[] for _ in starts]
    for _ in range(repeats):
        run_a, run_b = a(case), b(case)
        for j, i in enumerate(starts):
            ys = case.ys[i : i + chunk]
            if j % 2:
                tb[j].append(run_b(ys) / len(ys))
                ta[j].append(run_a(ys) / len(ys))
            else:
                ta[j].append(run_a(ys) / len(ys))
                tb[j].append(run_b(ys) / len(ys))
    a_us = statistics.fmean(statistics.median(t) for t in ta) * 1e6
    b_us = statistics.fmean(statistics.median(t) for t in tb) * 1e6
    every_a, every_b = [t for ts in ta for t in ts], [t for ts in tb for t in ts]
    return {
        "a_us": a_us,
        "b_us": b_us,
        "ratio": b_us / a_us,
        "ratio_of_totals": sum(every_b) / sum(every_a),
        "a_us_min": min(every_a) * 1e6,
        "b_us_min": min(every_b) * 1e6,
        "ratio_of_mins": min(every_b) / min(every_a),
    }


def measure(only: str | None, repeats: int, samples: int, chunk: int) -> dict[str, Any]:
    """The figures of one tree (what a child process prints)."""
    from immersion.coding.rotation import RotatingImmersion

    cases = [c for c in (_reactor(samples), _lqg2(samples), _lqg4(samples)) if c is not None]
    out: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    if only in (None, "loop"):
        loop = {}
        for case in cases:
            r = _interleaved(case, _plain_loop, _immersed_loop(case.imm), repeats, chunk)
            loop[case.name] = {
                "plain_us": r["a_us"],
                "immersed_us": r["b_us"],
                "ratio": r["ratio"],
                "plain_us_min": r["a_us_min"],
                "immersed_us_min": r["b_us_min"],
                "ratio_of_mins": r["ratio_of_mins"],
                "goal": LOOP_GOAL,
                "met": r["ratio"] <= LOOP_GOAL,
            }
        out["loop"] = loop
    if only in (None, "rotation"):
        from immersion import immerse

        rotation = {}
        for case in cases[:2]:
            still = immerse(case.f, case.g, rng=0, **case.options)
            rot = RotatingImmersion(
                case.f, case.g, rotate_keys_every=2, keys="dense", rng=0, **case.options
            )
            r = _interleaved(case, _immersed_loop(still), _rotating_loop(rot), repeats, chunk)
            rotation[case.name] = {
                "still_us": r["a_us"],
                "rotating_us": r["b_us"],
                "ratio": r["ratio"],
                "ratio_of_totals": r["ratio_of_totals"],
                "ratio_of_mins": r["ratio_of_mins"],
                "per_rotation_us": (r["b_us"] - r["a_us"]) * 2,
                "rotate_keys_every": 2,
                "goal": ROTATION_GOAL,
                "met": r["ratio"] <= ROTATION_GOAL,
            }
        out["rotation"] = rotation
    out["load_after"] = os.getloadavg()[0]
    return out


# ---------------------------------------------------------------- trees and processes
def _run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = tree_env(tree)
    command = [sys.executable, __file__, "--child", "--repeats", str(args.repeats)]
    command += ["--samples", str(args.samples), "--chunk", str(args.chunk)]
    command += ["--only", args.only] if args.only else []
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _median_of(runs: list[Any]) -> Any:
    """Each figure's median over the runs of one tree (flags: true in every run)."""
    if isinstance(runs[0], dict):
        return {k: _median_of([r[k] for r in runs]) for k in runs[0]}
    if isinstance(runs[0], bool):
        return all(runs)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline-ref", help="git revision to run beside this tree")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved repeats per process")
    parser.add_argument("--runs", type=int, default=1, help="processes per tree, alternating")
    parser.add_argument("--samples", type=int, default=512, help="closed-loop samples per repeat")
    parser.add_argument("--chunk", type=int, default=64, help="samples timed in one go")
    parser.add_argument("--only", choices=("loop", "rotation"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.only, args.repeats, args.samples, args.chunk)))
        return
    trees = {"this": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            trees = {"baseline": extract_tree(args.baseline_ref, Path(tmp)), **trees}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i in range(args.runs):
            for name, tree in trees.items():  # alternating, so load changes hit both alike
                print(f"[bench] run {i + 1}/{args.runs}: {name}", file=sys.stderr)
                runs[name].append(_run(tree, args))
    result: dict[str, Any] = {
        "benchmark": "control_loop",
        "repeats": args.repeats,
        "runs": args.runs,
        "samples": args.samples,
        "chunk": args.chunk,
        **{name: _median_of(r) for name, r in runs.items()},
    }
    if args.baseline_ref:
        result["baseline_ref"] = args.baseline_ref
    print(json.dumps(result))


if __name__ == "__main__":
    main()
