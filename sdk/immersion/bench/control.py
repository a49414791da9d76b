"""``immersion bench control``: an encrypted controller per sample, who does what, side by side.

One run, one process, the same controller (CDSL's four-tank: 4 states, 2 measurements, 2
controls) and closed loop:

* ``plain``: the float controller (two matrix-vector products per sample);
* ``lwe``: :func:`immersion.lwe.encrypt_controller` at 128 bits and the requested precision,
  timed in three parts: **plant offline** (encryptions of zero computed ahead, counted per
  sample), **plant online** (encrypt ``y`` and the last ``u``; decrypt, check the tag, round) and
  **cloud** (the ``W + 1`` ciphertext products, the window shift), with bytes each way;
* ``frontier``: the proven precision and the time per sample for each requested precision, at
  ``N = 4096`` and ``N = 8192`` (whichever the request needs);
* ``orders``: the plant's and the cloud's time for 2-, 4-, 6- and 8-state controllers (the plant's
  work must not depend on the order);
* ``eclib`` (extra ``bench-control``): ECLib's GSW-LWE controller (gains GSW-encrypted, signals
  LWE-encrypted, the state re-encrypted by the plant every sample) at the largest dimension that
  runs within the budget; no security claim at such dimensions.
"""

from __future__ import annotations

import math
import platform
import time
from typing import Any, Callable

import numpy as np

from ..lwe import encrypt_controller
from ..lwe.controller import history_matrices
from ..lwe.convert import history_form, linear_controller
from ..lwe.examples import ControlLoop, controller_of_order, four_tank_loop, simulate_float

#: Encryptions of zero the plant computes ahead at a time (its offline part).
BATCH = 32
#: Precisions of the frontier (relative to output_range).
FRONTIER = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7)


def _timed_loop(loop: ControlLoop, ctrl: Any, steps: int) -> dict[str, Any]:
    """The encrypted closed loop: offline, online and cloud seconds per sample, and checks."""
    A, B, C = loop.plant
    w, v = loop.disturbance(steps)
    clock = time.perf_counter
    offline = online = cloud = 0.0
    x, xt = loop.x0.copy(), ctrl.encode_state()
    us, vs = np.empty((steps, B.shape[1])), []
    twin, us_twin, x_twin = ctrl.fixed_point_twin(), np.empty_like(us), loop.x0.copy()
    up = down = 0
    for k in range(steps):
        if k % BATCH == 0:  # the plant's offline part: encryptions of zero, a batch ahead
            start = clock()
            ctrl.precompute(min(BATCH, steps - k))
            offline += clock() - start
        y = C @ x + v[k]
        t0 = clock()
        yt = ctrl.encode_input(y)
        t1 = clock()
        ut = ctrl.target.output(xt, yt)
        xt = ctrl.target.step(xt, yt)
        t2 = clock()
        u = ctrl.decode_output(ut, yt)
        online += (t1 - t0) + (clock() - t2)
        cloud += t2 - t1
        up, down = yt.nbytes, ut.nbytes
        vs.append(np.concatenate([y, us[k - 1] if k else np.zeros(B.shape[1])]))
        x = A @ x + B @ u + w[k]
        us[k] = u
        us_twin[k] = twin.output(C @ x_twin + v[k])
        x_twin = A @ x_twin + B @ us_twin[k] + w[k]
    phis = history_matrices(history_form(linear_controller(loop.controller)))
    step_error = max(
        float(np.abs(us[k] - sum(p @ vs[k - j] for j, p in enumerate(phis) if k >= j)).max())
        for k in range(steps)
    )
    d = ctrl.design
    return {
        "plant_offline_s": offline / steps,
        "plant_online_s": online / steps,
        "cloud_s": cloud / steps,
        "total_s": (offline + online + cloud) / steps,
        "bytes_up": up,
        "bytes_down": down,
        "degree": d.degree,
        "modulus_bits": round(math.log2(d.modulus), 1),
        "plaintext_modulus_bits": round(math.log2(d.plaintext_modulus), 1),
        "security_bits": d.security_bits,
        "window": d.window,
        "precision_proven": d.precision,
        "noise_margin_bits": round(d.noise_margin_bits, 2),
        "one_step_error_measured": step_error / max(d.output_range),
        "closed_loop_error_vs_float": float(
            np.abs(us - simulate_float(loop, steps)[1]).max() / max(d.output_range)
        ),
        "bit_identical_to_twin": bool(np.array_equal(us, us_twin)),
        "integrity_check": "on (2 secret check rows)",
    }


def _plain(loop: ControlLoop, steps: int) -> float:
    F, G, H, J = loop.controller
    A, B, C = loop.plant
    x, xc = loop.x0.copy(), np.zeros(F.shape[0])
    w, v = loop.disturbance(steps)
    spent = 0.0
    for k in range(steps):
        y = C @ x + v[k]
        t0 = time.perf_counter()
        u = H @ xc + J @ y
        xc = F @ xc + G @ y
        spent += time.perf_counter() - t0
        x = A @ x + B @ u + w[k]
    return spent / steps


def _order_row(n_state: int, steps: int) -> dict[str, Any]:
    """Open loop (y uniform in its range) of a stable ``n_state``-state SISO controller."""
    ctrl = encrypt_controller(controller_of_order(n_state), input_range=1, output_range=50, rng=0)
    clock = time.perf_counter
    offline = online = cloud = 0.0
    xt = ctrl.encode_state()
    for k, y in enumerate(np.random.default_rng(n_state).uniform(-1, 1, steps)):
        if k % BATCH == 0:
            start = clock()
            ctrl.precompute(min(BATCH, steps - k))
            offline += clock() - start
        t0 = clock()
        yt = ctrl.encode_input([y])
        t1 = clock()
        ut, xt = ctrl.target.advance(xt, yt)
        t2 = clock()
        ctrl.decode_output(ut, yt)
        online += (t1 - t0) + (clock() - t2)
        cloud += t2 - t1
    return {
        "n_state": n_state,
        "window": ctrl.design.window,
        "plant_s": (offline + online) / steps,
        "cloud_s": cloud / steps,
        "bytes_up": ctrl.design.bytes_up,
        "bytes_down": ctrl.design.bytes_down,
    }


def eclib_available() -> bool:
    try:
        _eclib_gsw_lwe()
    except ImportError:
        return False
    return True


def _eclib_gsw_lwe() -> Any:
    """ECLib's ``gsw_lwe`` module (its 1.5 release imports ``regev``/``gsw`` as top-level names,
    so its own folder goes on ``sys.path`` first)."""
    import os
    import sys

    import eclib

    folder = os.path.dirname(eclib.__file__)
    if folder not in sys.path:
        sys.path.append(folder)
    from eclib import gsw_lwe

    return gsw_lwe


def _eclib_row(loop: ControlLoop, dimension: int, steps: int) -> dict[str, Any]:
    """ECLib's GSW-LWE: ``[[F, G], [H, J]]`` GSW-encrypted (cloud), ``[x_c; y]`` LWE-encrypted
    by the plant each sample, the plant decrypts ``[x_c+; u]`` and re-encrypts the state."""
    g = _eclib_gsw_lwe()
    F, G, H, J = loop.controller
    A, B, C = loop.plant
    n_x = F.shape[0]
    delta = 2.0**-10
    start = time.perf_counter()
    params, pk, sk = g.keygen(dimension, 2**32, 2**64, 3.2)
    gains = g.enc_gsw(params, pk, np.block([[F, G], [H, J]]), delta)
    setup_s = time.perf_counter() - start
    w, v = loop.disturbance(steps)
    x, xc = loop.x0.copy(), np.zeros(n_x)
    plant = cloud = 0.0
    us = np.empty((steps, B.shape[1]))
    for k in range(steps):
        y = C @ x + v[k]
        t0 = time.perf_counter()
        ct = g.enc(params, pk, np.concatenate([xc, y]), delta)
        t1 = time.perf_counter()
        out = g.mult(params, gains, ct)
        t2 = time.perf_counter()
        vec = np.asarray(g.dec(params, sk, out, delta**2), dtype=np.float64)
        plant += (t1 - t0) + (time.perf_counter() - t2)
        cloud += t2 - t1
        xc, u = vec[:n_x], vec[n_x:]
        x = A @ x + B @ u + w[k]
        us[k] = u
    ref = simulate_float(loop, steps)[1]
    return {
        "dimension": dimension,
        "samples": steps,
        "setup_s": setup_s,
        "plant_s": plant / steps,
        "cloud_s": cloud / steps,
        "total_s": (plant + cloud) / steps,
        "closed_loop_error_vs_float": float(np.abs(us - ref).max() / loop.output_range),
        "security": "none claimed (dimension far below the HE standard's 1024+)",
    }


def bench_control(
    *,
    steps: int = 1000,
    precision: float = 1e-4,
    frontier_steps: int = 200,
    order_steps: int = 200,
    eclib_dimensions: tuple[int, ...] = (2, 4, 8, 16, 32),
    eclib_budget_s: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The rows of the module docstring, with ratios (see there)."""
    say = progress or (lambda message: None)
    loop = four_tank_loop()
    say("plain controller")
    plain = _plain(loop, steps)
    say(f"encrypted, precision {precision:g}, {steps} samples")
    main = _timed_loop(
        loop,
        encrypt_controller(
            loop.controller,
            input_range=loop.input_range,
            output_range=loop.output_range,
            precision=precision,
            rng=0,
        ),
        steps,
    )
    frontier = []
    for request in FRONTIER:
        say(f"frontier: precision {request:g}")
        try:
            ctrl = encrypt_controller(
                loop.controller,
                input_range=loop.input_range,
                output_range=loop.output_range,
                precision=request,
                rng=0,
            )
        except ValueError as exc:
            frontier.append({"requested": request, "refused": str(exc)})
            continue
        row = _timed_loop(loop, ctrl, frontier_steps)
        frontier.append({"requested": request, **row})
    orders = []
    for n in (2, 4, 6, 8):
        say(f"order sweep: {n} states")
        orders.append(_order_row(n, order_steps))
    plants = [r["plant_s"] for r in orders]
    comparisons: list[dict[str, Any]] = []
    note = None
    if eclib_available():
        spent = 0.0
        for n in eclib_dimensions:
            if spent > eclib_budget_s:
                break
            say(f"ECLib GSW-LWE at n = {n}")
            start = time.perf_counter()
            probe = _eclib_row(loop, n, 2)
            samples = int(max(2, min(20, (eclib_budget_s - spent) / 4 / probe["total_s"])))
            row = _eclib_row(loop, n, samples) if samples > 2 else probe
            spent += time.perf_counter() - start
            comparisons.append(row)
    else:
        note = "eclib not installed (pip install 'immersion-coding[bench-control]'): rows skipped"
    largest = comparisons[-1] if comparisons else None
    return {
        "benchmark": "control",
        "controller": "CDSL four-tank observer controller: 4 states, 2 measurements, 2 controls",
        "steps": steps,
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "plain_s": plain,
        "lwe": main,
        "ratio_lwe_total_over_plain": main["total_s"] / plain,
        "frontier": frontier,
        "orders": orders,
        "order_plant_time_max_over_min": max(plants) / min(plants),
        "eclib_gsw_lwe": comparisons,
        "ratio_eclib_largest_over_lwe": largest["total_s"] / main["total_s"] if largest else None,
        "note": note,
    }
