"""``immersion bench control``: one controller, per-sample time under every coding, side by side.

Rows (same LQG controller, same closed loop, one process; each loop timed ``repeats`` times in
turn and the fastest kept):

* ``plain``: the float controller (two small matrix-vector products per sample);
* ``immerse``: the float affine immersion (encode, ``target.output``, ``target.step``, decode);
* ``lwe``: this package at table parameters, ``q = 2^64`` and a wide modulus (``lwe-wide``),
  plant side (encrypt, decrypt) and cloud side (``output``, ``step``) timed apart;
* ``eclib`` (if installed, extra ``bench-control``): ECLib's Regev scheme (public-key LWE, Python
  integers), the controller state re-encrypted by the plant every sample, at small dimensions;
  ``lwe-same-dimension``: ours at the same dimension (no security claim) for the ratio.
"""

from __future__ import annotations

import math
import platform
import time
from typing import Any, Callable

import numpy as np

from . import encrypt_controller
from .examples import ControlLoop, lqg_loop, simulate_float

#: ECLib's Regev parameters: plaintext modulus 2^32, q = 2^64, sigma 3.2 (its example's values),
#: and the encoding step delta (products carry delta^2 = 2^-20).
ECLIB_T, ECLIB_Q, ECLIB_SIGMA, ECLIB_DELTA = 2**32, 2**64, 3.2, 2.0**-10


def _relative(us: np.ndarray, ref: np.ndarray) -> float | None:
    """``max |u - u_float| / max |u_float|`` (None while the float controls are all zero)."""
    scale = float(np.abs(ref).max())
    return float(np.abs(us - ref).max()) / scale if scale > 0 else None


def _closed_loop(
    loop: ControlLoop, steps: int, controller: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Run the plant with ``controller(y) -> u``; return the controls."""
    A, B, C = loop.plant
    w, v = loop.disturbance(steps)
    x = loop.x0.copy()
    us = np.empty((steps, B.shape[1]))
    for k in range(steps):
        u = controller(C @ x + v[k])
        x = A @ x + B @ u + w[k]
        us[k] = u
    return us


class _TimedLwe:
    """The LWE loop as a controller ``y -> u``, timing the plant's and the cloud's work apart."""

    def __init__(self, imm: Any) -> None:
        self.imm, self.xt = imm, imm.encode_state()
        self.plant = self.cloud = 0.0
        self.up = self.down = 0  # bytes of the last encoded input and output

    def __call__(self, y: np.ndarray) -> np.ndarray:
        imm, clock = self.imm, time.perf_counter
        t0 = clock()
        yt = imm.encode_input(y)
        t1 = clock()
        ut = imm.target.output(self.xt, yt)
        self.xt = imm.target.step(self.xt, yt)
        t2 = clock()
        u = imm.decode_output(ut, yt)
        self.plant += (t1 - t0) + (clock() - t2)
        self.cloud += t2 - t1
        self.up, self.down = yt.nbytes, ut.nbytes
        return u


def _lwe_row(
    loop: ControlLoop, steps: int, repeats: int, plant_cpu: float, **options: Any
) -> dict[str, Any]:
    """Wall time of the plant's and the cloud's parts (timed apart), CPU time of the loop minus
    ``plant_cpu`` (the plant simulation's), precision, twin identity and sizes."""
    imm = encrypt_controller(
        loop.controller, input_range=loop.input_range, output_range=loop.output_range, **options
    )
    best_plant = best_cloud = best_cpu = math.inf
    us = np.zeros(0)
    for _ in range(repeats):
        timed = _TimedLwe(imm)
        cpu = time.process_time()
        us = _closed_loop(loop, steps, timed)
        best_cpu = min(best_cpu, (time.process_time() - cpu) / steps - plant_cpu)
        best_plant = min(best_plant, timed.plant / steps)
        best_cloud = min(best_cloud, timed.cloud / steps)
    ref = simulate_float(loop, steps)[1]
    r = imm.report()
    return {
        "plant_s": best_plant,
        "cloud_s": best_cloud,
        "per_sample_s": best_plant + best_cloud,
        "per_sample_cpu_s": best_cpu,
        "dimension": r.parameters.dimension,
        "modulus_bits": r.parameters.modulus_bits,
        "security_bits": r.parameters.security_bits,
        "max_rel_u_error_vs_float": _relative(us, ref),
        "bit_identical_to_twin": bool(np.array_equal(us, _twin_run(imm, loop, steps))),
        "uplink_bytes": r.uplink_bytes,
        "downlink_bytes": r.downlink_bytes,
        "frac_bits": [r.frac_input, r.frac_output, r.frac_gain],
        "headroom_bits": r.headroom_bits,
        "prg": r.prg,
    }


def _twin_run(imm: Any, loop: ControlLoop, steps: int) -> np.ndarray:
    twin = imm.fixed_point_twin()
    return _closed_loop(loop, steps, twin.output)


def _time_loop(
    loop: ControlLoop, steps: int, repeats: int, make: Callable[[], Any]
) -> tuple[float, float]:
    """Best wall and best CPU seconds per sample of the closed loop with ``make()``'s controller."""
    wall = cpu = math.inf
    for _ in range(repeats):
        controller = make()
        start, start_cpu = time.perf_counter(), time.process_time()
        _closed_loop(loop, steps, controller)
        wall = min(wall, (time.perf_counter() - start) / steps)
        cpu = min(cpu, (time.process_time() - start_cpu) / steps)
    return wall, cpu


def _plant_only(loop: ControlLoop, steps: int, repeats: int) -> tuple[float, float]:
    """The plant simulation alone (subtracted from whole-loop timings)."""
    return _time_loop(loop, steps, repeats, lambda: lambda y: np.zeros(loop.plant[1].shape[1]))


def _plain(loop: ControlLoop) -> Callable[[np.ndarray], np.ndarray]:
    F, G, H, J = loop.controller
    state = {"x": np.zeros(F.shape[0])}

    def controller(y: np.ndarray) -> np.ndarray:
        u = H @ state["x"] + J @ y
        state["x"] = F @ state["x"] + G @ y
        return u

    return controller


def _immersed(loop: ControlLoop) -> Callable[[np.ndarray], np.ndarray]:
    from ..coding import immerse

    F, G, H, J = loop.controller
    imm = immerse(
        lambda x, y: F @ x + G @ y, lambda x, y: H @ x + J @ y,
        F.shape[0], G.shape[1], H.shape[0], rng=0,
    )  # fmt: skip
    state = {"xt": imm.encode_state(np.zeros(F.shape[0]))}

    def controller(y: np.ndarray) -> np.ndarray:
        yt = imm.encode_input(y)
        u = imm.decode_output(imm.target.output(state["xt"], yt), yt)
        state["xt"] = imm.target.step(state["xt"], yt)
        return np.asarray(u)

    return controller


def _eclib_row(loop: ControlLoop, dimension: int, steps: int) -> dict[str, Any]:
    # ECLib's CPU time includes the plant simulation (a few us against its milliseconds)
    """ECLib's Regev: the plant encrypts ``[x_c; y]``, the cloud multiplies by the encoded
    ``[[F, G], [H, J]]``, the plant decrypts ``[x_c+; u]`` (state re-encrypted every sample)."""
    from eclib import regev

    F, G, H, J = loop.controller
    n_x = F.shape[0]
    start = time.perf_counter()
    params, pk, sk = regev.keygen(dimension, ECLIB_T, ECLIB_Q, ECLIB_SIGMA)
    keygen_s = time.perf_counter() - start
    encoded = regev.encode(params, np.block([[F, G], [H, J]]), ECLIB_DELTA)
    state = {"x": np.zeros(n_x)}
    plant = cloud = 0.0

    def controller(y: np.ndarray) -> np.ndarray:
        nonlocal plant, cloud
        t0 = time.perf_counter()
        ct = regev.enc(params, pk, np.concatenate([state["x"], y]), ECLIB_DELTA)
        t1 = time.perf_counter()
        out = regev.int_mult(params, encoded, ct)
        t2 = time.perf_counter()
        v = np.asarray(regev.dec(params, sk, out, ECLIB_DELTA**2), dtype=np.float64)
        plant += (t1 - t0) + (time.perf_counter() - t2)
        cloud += t2 - t1
        state["x"] = v[:n_x]
        return v[n_x:]

    start_cpu = time.process_time()
    us = _closed_loop(loop, steps, controller)
    cpu = (time.process_time() - start_cpu) / steps
    ref = simulate_float(loop, steps)[1]
    return {
        "dimension": dimension,
        "samples": steps,
        "keygen_s": keygen_s,
        "plant_s": plant / steps,
        "cloud_s": cloud / steps,
        "per_sample_s": (plant + cloud) / steps,
        "per_sample_cpu_s": cpu,
        "max_rel_u_error_vs_float": _relative(us, ref),
    }


def _hidden_row(loop: ControlLoop, samples: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Gains encrypted too (BFV through TenSEAL): per-sample wall and CPU time, twin identity."""
    if samples <= 0:
        return {"skipped": "hidden_samples = 0"}
    try:
        from .hidden import encrypt_controller_and_gains

        say(f"lwe with hidden gains (BFV, N = 8192), {samples} samples")
        start = time.perf_counter()
        imm = encrypt_controller_and_gains(
            loop.controller, input_range=loop.input_range, output_range=loop.output_range
        )
    except ImportError as exc:
        return {"skipped": str(exc)}
    keygen = time.perf_counter() - start
    timed = _TimedLwe(imm)
    start_cpu = time.process_time()
    us = _closed_loop(loop, samples, timed)
    cpu = (time.process_time() - start_cpu) / samples
    ref = simulate_float(loop, samples)[1]
    return {
        "plant_s": timed.plant / samples,
        "cloud_s": timed.cloud / samples,
        "per_sample_s": (timed.plant + timed.cloud) / samples,
        "per_sample_cpu_s": cpu,
        "samples": samples,
        "keygen_s": keygen,
        "plain_modulus_bits": imm.plain_modulus.bit_length(),
        "max_rel_u_error_vs_float": _relative(us, ref),
        "bit_identical_to_twin": bool(np.array_equal(us, _twin_run(imm, loop, samples))),
        "uplink_bytes": timed.up,
        "downlink_bytes": timed.down,
    }


def eclib_available() -> bool:
    try:
        import eclib.regev  # noqa: F401
    except ImportError:
        return False
    return True


def bench_control(
    *,
    n_state: int = 2,
    steps: int = 2000,
    repeats: int = 3,
    wide_modulus_bits: int = 104,
    eclib_dimensions: tuple[int, ...] = (10, 64, 128),
    eclib_budget_s: float = 10.0,
    hidden_samples: int = 20,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Per-sample time of one LQG controller under each coding (see module docstring); ratios.

    ``eclib_budget_s`` bounds the samples ECLib runs at each dimension (at least 2);
    ``hidden_samples`` is the length of the hidden-gains loop (0 skips it).
    """
    say = progress or (lambda message: None)
    loop = lqg_loop(n_state)
    plant_wall, plant_cpu = _plant_only(loop, steps, repeats)
    say("plain and float immersion")
    rows: dict[str, Any] = {}
    for name, make in (("plain", lambda: _plain(loop)), ("immerse", lambda: _immersed(loop))):
        wall, cpu = _time_loop(loop, steps, repeats, make)
        rows[name] = {"per_sample_s": wall - plant_wall, "per_sample_cpu_s": cpu - plant_cpu}
    say("lwe, q = 2^64, 128-bit table parameters")
    rows["lwe"] = _lwe_row(loop, steps, repeats, plant_cpu, rng=0)
    say(f"lwe, q = 2^{wide_modulus_bits}")
    rows["lwe-wide"] = _lwe_row(
        loop, steps, repeats, plant_cpu, rng=0, modulus_bits=wide_modulus_bits
    )
    rows["lwe-hidden-gains"] = _hidden_row(loop, hidden_samples, say)
    for row in rows.values():
        if "per_sample_cpu_s" in row:
            plain_cpu = rows["plain"]["per_sample_cpu_s"]
            row["cpu_ratio_to_plain"] = row["per_sample_cpu_s"] / plain_cpu
    comparisons, note = [], None
    if eclib_available():
        for n in eclib_dimensions:
            say(f"eclib regev at n = {n}")
            probe = _eclib_row(loop, n, 1)
            samples = int(max(2, min(steps, eclib_budget_s / max(probe["per_sample_s"], 1e-9))))
            ecl = _eclib_row(loop, n, samples)
            ours = _lwe_row(
                loop, min(steps, 500), repeats, plant_cpu, rng=0, security_bits=None,
                dimension=max(n, 2),
            )  # fmt: skip
            comparisons.append(
                {
                    "dimension": n,
                    "eclib": ecl,
                    "lwe_same_dimension": ours,
                    "ratio_eclib_over_lwe": ecl["per_sample_s"] / ours["per_sample_s"],
                    "cpu_ratio_eclib_over_lwe": ecl["per_sample_cpu_s"] / ours["per_sample_cpu_s"],
                }
            )
    else:
        note = "eclib not installed (pip install 'immersion-coding[bench-control]'): rows skipped"
    return {
        "benchmark": "control",
        "controller": f"LQG, {loop.controller[0].shape[0]} states, 1 measurement, 1 control",
        "steps": steps,
        "repeats": repeats,
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "rows": rows,
        "eclib": comparisons,
        "note": note,
    }
