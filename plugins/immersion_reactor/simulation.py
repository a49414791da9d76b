"""Closed loops of the reactor: plain and immersed side by side in one process (seed 002 VI-B)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
from immersion import (
    Immersion,
    ImmersionError,
    InvalidArgumentError,
    NonFiniteError,
    PrivacyReport,
    immerse,
)
from immersion.privacy.bounds import exact_decode_output_errors, exact_decode_state_errors

from .model import ReactorController, ReactorParameters

#: A state norm above this (or NaN/inf) counts as divergence.
DIVERGENCE_LIMIT = 1e6


class ReactorDivergenceError(ImmersionError):
    """The closed loop left every reasonable bound (usually: sampling period too large)."""


class Cloud(Protocol):
    """What the user side needs from the cloud: the target's ``advance`` (local or remote)."""

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[Any, Any]: ...


class ReactorPlant:
    """Eqs. 47-48 integrated by forward Euler with ``substeps`` per control sample.

    The delayed ``x1(t - d(t))`` is interpolated linearly on the stored trajectory; before
    ``t = 0`` the history is the constant initial value.
    """

    def __init__(
        self, params: ReactorParameters, *, dt: float, substeps: int, samples: int
    ) -> None:
        self.params, self.h = params, dt / substeps
        self.substeps = substeps
        self.x = np.array(params.initial_state, dtype=float)
        self.x1_history = np.empty(samples * substeps + 1)
        self.x1_history[0] = self.x[0]
        self.i = 0

    @property
    def t(self) -> float:
        return self.i * self.h

    def measure(self) -> np.ndarray:
        """The measurement ``y = x1``."""
        return self.x[:1].copy()

    def _x1_at(self, s: float) -> float:
        if s <= 0.0:
            return float(self.x1_history[0])
        pos = s / self.h
        lo = min(int(pos), self.i)
        hi = min(lo + 1, self.i)
        w = pos - lo
        return float((1.0 - w) * self.x1_history[lo] + w * self.x1_history[hi])

    def advance(self, u: float) -> None:
        """Hold ``u`` for one control period."""
        for _ in range(self.substeps):
            t = self.t
            x1_delayed = self._x1_at(t - self.params.delay(t))
            self.x = self.x + self.h * self.params.rhs(t, self.x, x1_delayed, u)
            self.i += 1
            self.x1_history[self.i] = self.x[0]
        norm = float(np.linalg.norm(self.x))
        if not math.isfinite(norm) or norm > DIVERGENCE_LIMIT:
            raise ReactorDivergenceError(
                f"dt: the closed loop diverged at t = {self.t:.3g} s (state norm {norm:.3g}) "
                f"with sampling period {self.h * self.substeps:g} s; use a smaller --dt "
                "(the notes check 0.001 to 0.1)"
            )


@dataclass
class ReactorRun:
    """Trajectories and timings of one side-by-side run (arrays indexed by control sample).

    Parameters
    ----------
    t : np.ndarray
        Sample times in seconds.
    y_plain, y_immersed : np.ndarray
        Measurements of the plain and the immersed closed loop.
    y_encoded : np.ndarray
        Encoded measurements, shape ``(samples, n~_y)``: what the cloud sees.
    u_plain, u_decoded : np.ndarray
        The plain controller's input and the decoded input of the immersed loop.
    u_encoded : np.ndarray
        Encoded inputs as the cloud returned them.
    x_plain, x_immersed : np.ndarray
        Plant states, shape ``(samples + 1, 2)``.
    controller_state_error : np.ndarray
        Max abs difference of the decoded and the plain controller state, per sample (drift: the
        cloud's rounding, amplified by ``f`` and carried by the state; no bound is claimed).
    u_decode_bound, u_decode_error : np.ndarray
        Per sample: the largest element of the rigorous bound of the output decode's rounding
        (``Immersion.decode_output_with_bound``) and of its exact error (rational arithmetic).
    state_decode_bound, state_decode_error : np.ndarray
        The same for the decode of the controller state.
    decode_within_bound : np.ndarray
        Per sample (bool): every element of both decodes' exact errors within its own bound.
    step_s_plain : np.ndarray
        Controller time per sample (plain).
    step_s_immersed : np.ndarray
        Encode + cloud + decode time per sample.
    round_trip_s : np.ndarray
        Time of the cloud call alone (remote: the network round trip).
    report : PrivacyReport or None
        The immersion's privacy and precision report.
    keys : str
        ``repr`` of the keys (shapes and fingerprint, no secrets).
    extras : dict
        Further figures a caller may attach (empty by default).
    """

    t: np.ndarray
    y_plain: np.ndarray
    y_immersed: np.ndarray
    y_encoded: np.ndarray
    u_plain: np.ndarray
    u_decoded: np.ndarray
    u_encoded: np.ndarray
    x_plain: np.ndarray
    x_immersed: np.ndarray
    controller_state_error: np.ndarray
    u_decode_bound: np.ndarray
    u_decode_error: np.ndarray
    state_decode_bound: np.ndarray
    state_decode_error: np.ndarray
    decode_within_bound: np.ndarray
    step_s_plain: np.ndarray
    step_s_immersed: np.ndarray
    round_trip_s: np.ndarray
    report: PrivacyReport | None = None
    keys: str = ""
    extras: dict[str, Any] = field(default_factory=dict)


def _diverged(t: float, who: str) -> ReactorDivergenceError:
    return ReactorDivergenceError(
        f"dt: {who} produced non-finite values at t = {t:.3g} s; use a smaller --dt "
        "(the notes check 0.001 to 0.1)"
    )


def run_reactor(
    *,
    steps: int = 2000,
    dt: float = 0.01,
    substeps: int = 10,
    epsilon_input: float = 1e-3,
    epsilon_output: float = 1e-3,
    seed: int = 0,
    params: ReactorParameters | None = None,
    cloud_factory: Callable[[Immersion], Cloud] | None = None,
) -> ReactorRun:
    """Run the plain and the immersed closed loop from the paper's initial state.

    Parameters
    ----------
    steps : int
        Control samples.
    dt : float
        Sampling period of the controller in seconds.
    substeps : int
        Forward-Euler sub-steps of the plant per sample.
    epsilon_input, epsilon_output : float
        Per-element epsilon of the encoded measurement and of the encoded input (seed 002
        Theorem 1).
    seed : int
        Seed of the keys and of the encoding noise.
    params : ReactorParameters, optional
        Plant parameters; the paper's by default.
    cloud_factory : callable, optional
        ``cloud_factory(imm)`` returns the cloud side; by default the local ``imm.target``. The
        remote mode passes a factory that ships the target to an ``immersion serve`` process.

    Returns
    -------
    ReactorRun
        Both loops' trajectories and timings, the report and the keys' ``repr``.

    Examples
    --------
    >>> run = run_reactor(steps=20)
    >>> float(abs(run.u_plain - run.u_decoded).max()) < 1e-6
    True
    """
    params = params or ReactorParameters()
    ctrl = ReactorController(dt=dt)
    imm = immerse(
        ctrl.f,
        ctrl.g,
        n_state=3,
        n_input=1,
        n_output=1,
        extra_state=1,
        extra_input=2,
        extra_output=2,
        epsilon_input=epsilon_input,
        epsilon_output=epsilon_output,
        rng=seed,
        probe=(ctrl.initial_state, np.array([params.initial_state[0]])),
    )
    cloud: Cloud = imm.target if cloud_factory is None else cloud_factory(imm)
    plants = [ReactorPlant(params, dt=dt, substeps=substeps, samples=steps) for _ in range(2)]
    xc, xc_enc = ctrl.initial_state.copy(), imm.encode_state(ctrl.initial_state)
    rec: dict[str, list[Any]] = {
        k: []
        for k in ("y_p", "y_i", "y_e", "u_p", "u_d", "u_e", "xerr", "tp", "ti", "rt", "ub", "ue")
        + ("xb", "xe", "ok")
    }
    x_plain, x_imm = [plants[0].x.copy()], [plants[1].x.copy()]
    clock = time.perf_counter
    for _ in range(steps):
        y_p, y_i = plants[0].measure(), plants[1].measure()
        t0 = clock()
        u_p = ctrl.g(xc, y_p)
        xc = ctrl.f(xc, y_p)
        t1 = clock()
        y_enc = imm.encode_input(y_i)  # user
        t2 = clock()
        try:
            u_enc, xc_enc = cloud.advance(xc_enc, y_enc)  # cloud: encoded data only
        except NonFiniteError:
            raise _diverged(plants[1].t, "the immersed controller") from None
        t3 = clock()
        u_i = imm.decode_output(u_enc, y_enc)  # user
        t4 = clock()
        if not (math.isfinite(float(u_p[0])) and np.isfinite(xc).all()):
            raise _diverged(plants[0].t, "the plain controller")
        plants[0].advance(float(u_p[0]))
        plants[1].advance(float(u_i[0]))
        x_plain.append(plants[0].x.copy())
        x_imm.append(plants[1].x.copy())
        for key, value in (
            ("y_p", y_p[0]),
            ("y_i", y_i[0]),
            ("y_e", np.asarray(y_enc)),
            ("u_p", u_p[0]),
            ("u_d", u_i[0]),
            ("u_e", np.asarray(u_enc)),
            ("tp", t1 - t0),
            ("ti", t4 - t1),
            ("rt", t3 - t2),
        ):
            rec[key].append(value)
        # audit of every decode (outside the timings): its bound and its exact error
        bounded = imm.decode_output_with_bound(u_enc, y_enc)
        u_err = exact_decode_output_errors(imm.keys, u_enc, y_enc, u_i)
        rec["ub"].append(float(np.max(bounded.error_bound)))
        rec["ue"].append(float(u_err.max()))
        state = imm.decode_state_with_bound(xc_enc)
        x_err = exact_decode_state_errors(imm.keys, xc_enc, state.value)
        rec["xb"].append(float(np.max(state.error_bound)))
        rec["xe"].append(float(x_err.max()))
        rec["ok"].append(
            bool((u_err <= bounded.error_bound).all() and (x_err <= state.error_bound).all())
        )
        rec["xerr"].append(float(np.abs(state.value - xc).max()))
    return ReactorRun(
        t=np.arange(steps) * dt,
        y_plain=np.array(rec["y_p"]),
        y_immersed=np.array(rec["y_i"]),
        y_encoded=np.array(rec["y_e"]),
        u_plain=np.array(rec["u_p"]),
        u_decoded=np.array(rec["u_d"]),
        u_encoded=np.array(rec["u_e"]),
        x_plain=np.array(x_plain),
        x_immersed=np.array(x_imm),
        controller_state_error=np.array(rec["xerr"]),
        u_decode_bound=np.array(rec["ub"]),
        u_decode_error=np.array(rec["ue"]),
        state_decode_bound=np.array(rec["xb"]),
        state_decode_error=np.array(rec["xe"]),
        decode_within_bound=np.array(rec["ok"], dtype=bool),
        step_s_plain=np.array(rec["tp"]),
        step_s_immersed=np.array(rec["ti"]),
        round_trip_s=np.array(rec["rt"]),
        report=imm.report(),
        keys=repr(imm.keys),
    )


#: Why ``decode_error_estimate`` may exceed ``decode_error_bound`` (they measure different
#: things), printed with them.
DECODE_ERROR_NOTE = (
    "decode_error_estimate models the error of a whole step (the input's encoding, the cloud's "
    "rounding through f and g amplified by input_gain, then the decode) at the probe point; "
    "decode_error_bound bounds only the user's decode of the vectors the cloud returned (Pi3_left "
    "(u~ - Pi4 y~) in floating point against exact arithmetic), so the estimate is usually the "
    "larger: no contradiction. The drift_* figures are what the closed loop accumulated"
)


def summary(run: ReactorRun, *, remote: bool = False) -> dict[str, Any]:
    """The JSON figures of ``immersion demo reactor``.

    Parameters
    ----------
    run : ReactorRun
        A run of :func:`run_reactor`.
    remote : bool
        Whether the cloud was remote: adds the round-trip time's median and 99th percentile.

    Returns
    -------
    dict
        Two kinds of error, named apart. ``drift_*``: how far the decoded closed loop wandered
        from its plain twin over the run (``drift_max_abs_u``, ``drift_max_rel_u``,
        ``drift_max_abs_plant_state``, ``drift_max_abs_controller_state``; the cloud's
        rounding amplified by ``f``, ``g`` and carried by the state: measured, no bound
        claimed). ``decode_*`` and ``max_abs_decode_error``: the rounding of each single decode,
        exact (rational arithmetic), against ``decode_error_bound`` (the largest rigorous
        per-decode bound), ``decode_bound_holds`` (every element of every decode within its own
        bound) and, per decode, largest error over largest bound
        (``decode_error_over_bound_median`` / ``_max`` over the run). Also the report's epsilons and
        its probe-point ``decode_error_estimate`` (an estimate of the per-step error, not a
        bound), and the time per step of both loops and their ratio.
    """
    if run.report is None:
        raise InvalidArgumentError("run", "has no privacy report (not made by run_reactor)")
    u_scale = max(1.0, float(np.abs(run.u_plain).max()))
    ratios = np.concatenate(
        [run.u_decode_error / run.u_decode_bound, run.state_decode_error / run.state_decode_bound]
    )
    out = {
        "steps": int(run.t.size),
        "dt": float(run.t[1] - run.t[0]) if run.t.size > 1 else None,
        "max_abs_u": float(np.abs(run.u_plain).max()),
        "final_state_norm_plain": float(np.linalg.norm(run.x_plain[-1])),
        "final_state_norm_immersed": float(np.linalg.norm(run.x_immersed[-1])),
        "epsilon_input": run.report.epsilon_input,
        "epsilon_output": run.report.epsilon_output,
        "epsilon_input_proven": run.report.epsilon_input_proven,
        "epsilon_note": run.report.epsilon_note(),
        # drift of the decoded closed loop against its plain twin over the run (not bounded)
        "drift_max_abs_u": float(np.abs(run.u_plain - run.u_decoded).max()),
        "drift_max_rel_u": float(np.abs(run.u_plain - run.u_decoded).max()) / u_scale,
        "drift_max_abs_plant_state": float(np.abs(run.x_plain - run.x_immersed).max()),
        "drift_max_abs_controller_state": float(run.controller_state_error.max()),
        # rounding of each single decode: exact error against its rigorous bound
        "decode_error_estimate": run.report.decode_error_estimate,
        "decode_error_bound": float(max(run.u_decode_bound.max(), run.state_decode_bound.max())),
        "max_abs_decode_error": float(max(run.u_decode_error.max(), run.state_decode_error.max())),
        "decode_bound_holds": bool(run.decode_within_bound.all()),
        "decode_error_over_bound_median": float(np.median(ratios)),
        "decode_error_over_bound_max": float(ratios.max()),
        "decode_error_note": DECODE_ERROR_NOTE,
        "step_time_ratio": float(np.median(run.step_s_immersed) / np.median(run.step_s_plain)),
        "step_time_ratio_mean": float(run.step_s_immersed.sum() / run.step_s_plain.sum()),
        "plain_step_us_median": float(np.median(run.step_s_plain) * 1e6),
        "immersed_step_us_median": float(np.median(run.step_s_immersed) * 1e6),
        "keys": run.keys,
        "remote": remote,
    }
    if remote:
        out["round_trip_us_median"] = float(np.median(run.round_trip_s) * 1e6)
        out["round_trip_us_p99"] = float(np.percentile(run.round_trip_s, 99) * 1e6)
    return out
