"""Many plants against one ``immersion serve``: exactness, round trips (``immersion bench remote``).

Each plant has its own keys (``immerse(..., rng=seed + index)``, dense), its own CurveZMQ key
pair and its own measurement sequence. Its encoded inputs are drawn once, so the remote loop and
the local target see the same ``y~`` and their decoded outputs can be compared sample by sample:
seed 002 eq. 17 runs twice on the same data, once in the server and once in this process.

Not run by the test suite at full size; ``tests/test_remote_service.py`` runs it with 8 plants
x 200 samples and the same assertions.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..coding.factory import Immersion, immerse


@dataclass
class Plant:
    """One plant's handle (its own keys), its encoded inputs and its controller's initial state."""

    index: int
    imm: Immersion
    encoded_inputs: np.ndarray
    initial_state: np.ndarray


def make_plants(
    count: int,
    samples: int,
    *,
    algorithm: str = "reactor-controller",
    params: dict[str, Any] | None = None,
    seed: int = 0,
) -> list[Plant]:
    """``count`` plants of a registered algorithm, each with keys ``rng=seed + index``.

    Parameters
    ----------
    count, samples:
        How many plants, and how many samples each.
    algorithm, params:
        The registered algorithm (``immersion plugins``) and its parameters.
    seed:
        Plant ``i`` draws its keys with ``rng=seed + i`` and its signal from ``[seed, i]``.

    Plant ``i`` measures ``y_k = a_i exp(-k / tau_i) sin(2 pi f_i k / 100 + phi_i)``
    (amplitude 0.1-0.5, decay over 200-400 samples, 0.2-2 cycles per 100 samples, a phase per
    measured signal): a signal of its own that dies out as a regulated plant's would. (Open
    loop, a persistent sinusoid drives the reactor controller's adaptive gain without bound:
    it diverges after about 1,500 samples.)

    Examples
    --------
    >>> plants = make_plants(2, 5, algorithm="lqr-kalman")
    >>> [p.encoded_inputs.shape for p in plants]
    [(5, 3), (5, 3)]
    """
    from ..plugins.manager import registry

    spec = registry().algorithm(algorithm)
    count, samples = v.positive_int("plants", count), v.positive_int("samples", samples)
    plants = []
    for index in range(count):
        algo = spec.build(**(params or {}))
        signal_rng = np.random.default_rng([seed, index])
        amplitude, freq = signal_rng.uniform(0.1, 0.5), signal_rng.uniform(0.2, 2.0)
        decay, phase = signal_rng.uniform(200, 400), signal_rng.uniform(0, 2 * np.pi, algo.n_input)
        k = np.arange(samples)[:, None]
        ys = amplitude * np.exp(-k / decay) * np.sin(2 * np.pi * freq * k / 100 + phase)
        imm = immerse(
            algo.f,
            algo.g,
            algo.n_state,
            algo.n_input,
            algo.n_output,
            keys="dense",
            rng=seed + index,
            probe=(algo.initial_state, ys[0]),
        )
        plants.append(Plant(index, imm, imm.encode_input(ys), np.asarray(algo.initial_state)))
    return plants


def run_plant(
    cloud: Any, plant: Plant, *, after_sample: Callable[[int], None] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Drive ``cloud.advance`` through the plant's inputs; return decoded outputs and round trips.

    Parameters
    ----------
    cloud:
        A :class:`~immersion.remote.client.RemoteTarget` or the local ``plant.imm.target``; the
        state ``x~`` returned by each call is the one sent with the next.
    plant:
        From :func:`make_plants`.
    after_sample:
        Called with ``k`` after sample ``k``.

    Returns
    -------
    (outputs, round_trips)
        Decoded outputs ``(samples, n_output)``; seconds of each ``cloud.advance``.
    """
    xt = plant.imm.encode_state(plant.initial_state)
    encoded_outputs, round_trips = [], np.empty(len(plant.encoded_inputs))
    for k, yt in enumerate(plant.encoded_inputs):
        start = time.perf_counter()
        ut, xt = cloud.advance(xt, yt)
        round_trips[k] = time.perf_counter() - start
        encoded_outputs.append(ut)
        if after_sample is not None:
            after_sample(k)
    outputs = np.array(
        [
            plant.imm.decode_output(ut, yt)
            for ut, yt in zip(encoded_outputs, plant.encoded_inputs, strict=True)
        ]
    )
    return outputs, round_trips


def relative_error(outputs: np.ndarray, reference: np.ndarray) -> float:
    """``max |outputs - reference| / max |reference|`` (0 when both are zero)."""
    scale = float(np.max(np.abs(reference)))
    diff = float(np.max(np.abs(outputs - reference)))
    return diff / scale if scale > 0 else diff


def _percentiles_us(seconds: np.ndarray) -> dict[str, float]:
    p50, p99 = np.percentile(seconds, [50, 99]) * 1e6
    return {"p50_us": float(p50), "p99_us": float(p99)}


def run_plants_concurrently(
    address: str,
    plants: list[Plant],
    *,
    algorithm: str,
    params: dict[str, Any] | None,
    keys: list[dict[str, Any]] | None = None,
    timeout_s: float = 10.0,
    attempts: int = 3,
    after_sample: Callable[[int, int], None] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], list[int], float]:
    """One thread and one :class:`RemoteTarget` per plant, started together.

    Parameters
    ----------
    address:
        The server.
    plants:
        From :func:`make_plants`.
    algorithm, params:
        What the server builds ``f``, ``g`` from.
    keys:
        One ``{"server_key", "client_key"}`` per plant (None: loopback without keys).
    timeout_s, attempts:
        As for :class:`~immersion.remote.client.RemoteTarget`.
    after_sample:
        ``after_sample(plant_index, k)``, called in the plant's thread after each sample.

    Returns
    -------
    (outputs, round_trips, resumed, wall_s)
        Per plant: decoded outputs, round trips, how many times it set its session up again;
        and the wall time from the common start to the last plant's end.
    """
    from ..remote.client import RemoteTarget

    outputs: list[Any] = [None] * len(plants)
    trips: list[Any] = [None] * len(plants)
    resumed = [0] * len(plants)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(plants) + 1)

    def work(i: int, plant: Plant) -> None:
        try:
            cloud = RemoteTarget(
                address,
                plant.imm,
                algorithm=algorithm,
                params=params,
                timeout_s=timeout_s,
                attempts=attempts,
                **(keys[i] if keys else {}),
            )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            raise
        try:
            barrier.wait()
            hook = None if after_sample is None else (lambda k: after_sample(i, k))
            outputs[i], trips[i] = run_plant(cloud, plant, after_sample=hook)
            resumed[i] = cloud.resumed
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            cloud.close()

    threads = [
        threading.Thread(target=work, args=(i, p), daemon=True) for i, p in enumerate(plants)
    ]
    for thread in threads:
        thread.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return outputs, trips, resumed, wall


def curve_key_folder(folder: Path, clients: int) -> dict[str, Any]:
    """Key files for a CurveZMQ run: a server, ``clients`` clients and an admin, in ``folder``.

    Parameters
    ----------
    folder:
        Where the ``server/``, ``clients/`` and ``admins/`` folders go.
    clients:
        How many client key pairs.

    Returns
    -------
    dict
        ``server`` (the :class:`~immersion.remote.server.Service` key options), ``server_public``,
        ``clients`` (one ``{"server_key", "client_key"}`` each) and ``admin`` (a secret file).
    """
    from ..remote.curve import new_curve_keys

    server_public, server_secret = new_curve_keys(folder / "server", "server")
    client_keys = []
    for i in range(clients):
        _, secret = new_curve_keys(folder / "clients", f"plant-{i}")
        client_keys.append({"server_key": server_public, "client_key": secret})
    _, admin_secret = new_curve_keys(folder / "admins", "admin")
    return {
        "server": {
            "server_key": server_secret,
            "clients": folder / "clients",
            "admins": folder / "admins",
        },
        "server_public": server_public,
        "clients": client_keys,
        "admin": admin_secret,
    }


def bench_remote(
    *,
    plants: int = 50,
    samples: int = 2000,
    algorithm: str = "reactor-controller",
    params: dict[str, Any] | None = None,
    workers: int = 2,
    curve: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``plants`` concurrent plants x ``samples`` against one ``immersion serve`` child process.

    In one run: the local target (in this process), one plant alone through the server, then
    all plants at once (one thread and one CurveZMQ key pair each). Reports round-trip
    percentiles, the wall time per sample, their ratios to the single plant, the server's own
    service-time percentiles (admin ``stats``), and the largest relative difference between
    any decoded output and the same plant's local target (exact algebra: expected 0).

    Parameters
    ----------
    plants, samples, algorithm, params, seed:
        As for :func:`make_plants`.
    workers:
        The server's worker threads.
    curve:
        CurveZMQ keys (one pair per plant) or the plain loopback transport.
    progress:
        Called with a line of progress.
    """
    from ..remote.client import remote_stats
    from ..remote.process import ServerProcess

    params = {"dt": 0.01} if params is None and algorithm == "reactor-controller" else params
    say = progress or (lambda message: None)
    say(f"{plants} plants x {samples} samples, keys and encoded inputs")
    fleet = make_plants(plants, samples, algorithm=algorithm, params=params, seed=seed)
    start = time.perf_counter()
    local = [run_plant(p.imm.target, p)[0] for p in fleet]
    local_s = (time.perf_counter() - start) / (plants * samples)
    with tempfile.TemporaryDirectory() as tmp:
        keys = curve_key_folder(Path(tmp), plants) if curve else None
        say(f"server: workers={workers} curve={curve}")
        server = ServerProcess(workers=workers, **(keys["server"] if keys else {}))
        try:
            address = server.address
            say("one plant alone")
            single_out, single_trips, _, single_wall = run_plants_concurrently(
                address,
                fleet[:1],
                algorithm=algorithm,
                params=params,
                keys=keys["clients"][:1] if keys else None,
            )
            say(f"{plants} plants at once")
            outs, trips, resumed, wall = run_plants_concurrently(
                address,
                fleet,
                algorithm=algorithm,
                params=params,
                keys=keys["clients"] if keys else None,
            )
            stats = (
                remote_stats(address, server_key=keys["server_public"], admin_key=keys["admin"])
                if keys
                else None
            )
        finally:
            summary = server.stop()
    all_trips = np.concatenate(trips)
    single = {**_percentiles_us(single_trips[0]), "wall_us_per_sample": single_wall / samples * 1e6}
    together = {
        **_percentiles_us(all_trips),
        "wall_us_per_sample": wall / (plants * samples) * 1e6,
        "samples_per_s": plants * samples / wall,
    }
    errors = [
        relative_error(o, ref) for o, ref in zip(outs + single_out, local + local[:1], strict=True)
    ]
    return {
        "benchmark": "remote",
        "plants": plants,
        "samples": samples,
        "algorithm": algorithm,
        "curve": curve,
        "workers": workers,
        "local_loop_us_per_sample": local_s * 1e6,
        "single_plant": single,
        "concurrent": together,
        "p50_ratio_concurrent_vs_single": together["p50_us"] / single["p50_us"],
        "p99_ratio_concurrent_vs_single": together["p99_us"] / single["p99_us"],
        "per_sample_overhead_us": together["p50_us"] - single["p50_us"],
        "wall_per_sample_ratio_concurrent_vs_single": together["wall_us_per_sample"]
        / single["wall_us_per_sample"],
        "max_rel_error_vs_local": max(errors),
        "resumed_sessions": sum(resumed),
        "server_service_us": None if stats is None else stats["latency_us"],
        "server_exit": {
            "code": server.returncode,
            "requests": None if summary is None else summary["requests"],
            "replies": None if summary is None else summary["replies"],
            "samples": None if summary is None else summary["samples"],
        },
    }


def _lwe_loop(cloud: Any, imm: Any, loop: Any, samples: int) -> dict[str, Any]:
    """One closed loop of ``loop``'s plant with ``imm`` through ``cloud.advance``: seconds of each
    advance (the round trip when ``cloud`` is remote), of each sample's encryption and decryption
    on the user's side, and the decoded ``u``."""
    A, B, C = loop.plant
    w, v_noise = loop.disturbance(samples)
    x, xt = loop.x0.copy(), imm.encode_state()
    clock = time.perf_counter
    advance, user = np.empty(samples), np.empty(samples)
    us = np.empty((samples, B.shape[1]))
    for k in range(samples):
        y = C @ x + v_noise[k]
        t0 = clock()
        yt = imm.encode_input(y)
        t1 = clock()
        ut, xt = cloud.advance(xt, yt)
        t2 = clock()
        us[k] = imm.decode_output(ut, yt)
        t3 = clock()
        advance[k], user[k] = t2 - t1, (t1 - t0) + (t3 - t2)
        x = A @ x + B @ us[k] + w[k]
    return {"advance": advance, "user": user, "u": us}


def bench_remote_lwe(
    *,
    samples: int = 2000,
    precisions: tuple[float, ...] = (1e-4,),
    workers: int = 2,
    curve: bool = True,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The encrypted four-tank loop through one ``immersion serve`` child process, beside the same
    loop with the target in this process (``immersion bench remote --coding lwe``).

    For each requested precision: the closed loop of
    :func:`immersion.lwe.examples.four_tank_loop` runs once with the local target and once
    through the server (CurveZMQ keys unless ``curve=False``; the encrypted history kept there),
    from the same disturbances. Reports the p50/p99 of ``advance`` (remote: the round trip), the
    plant's encryption plus decryption per sample, the whole loop per sample (plant simulation
    excluded), the ratios remote / local, the bytes each way per sample, and whether every
    decoded ``u`` of both runs is bit-identical to the fixed-point twin.

    Parameters
    ----------
    samples:
        Samples per loop.
    precisions:
        The ``precision=`` of each row (it picks the ring).
    workers, curve:
        The server's worker threads; CurveZMQ keys or the plain loopback transport.
    seed:
        Seed of the key (a benchmark: reproducible, not for deployment).
    progress:
        Called with a line of progress.

    Returns
    -------
    dict
        One JSON-ready object, a row per precision.
    """
    from ..lwe import encrypt_controller
    from ..lwe.examples import four_tank_loop
    from ..remote.client import RemoteTarget
    from ..remote.process import ServerProcess

    samples = v.positive_int("samples", samples)
    loop = four_tank_loop()
    say = progress or (lambda message: None)
    handles = {
        p: encrypt_controller(
            loop.controller,
            input_range=loop.input_range,
            output_range=loop.output_range,
            precision=p,
            rng=seed,
        )
        for p in precisions
    }
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        keys = curve_key_folder(Path(tmp), 1) if curve else None
        say(f"server: workers={workers} curve={curve}")
        with ServerProcess(workers=workers, **(keys["server"] if keys else {})) as server:
            for precision, imm in handles.items():
                say(f"precision {precision:g}: {samples} samples local, then remote")
                local = _lwe_loop(imm.target, imm, loop, samples)
                with RemoteTarget(
                    server.address, imm, **(keys["clients"][0] if keys else {})
                ) as cloud:
                    remote = _lwe_loop(cloud, imm, loop, samples)
                    sent, received = cloud.bytes_sent / samples, cloud.bytes_received / samples
                twin = [imm.fixed_point_twin() for _ in range(2)]
                exact = all(
                    np.array_equal(run["u"], _twin_controls(tw, loop, samples))
                    for run, tw in zip((local, remote), twin, strict=True)
                )
                rows[f"precision={precision:g}"] = _lwe_row(
                    imm, local, remote, sent, received, exact
                )
    return {
        "benchmark": "remote-lwe",
        "controller": loop.name,
        "samples": samples,
        "curve": curve,
        "workers": workers,
        "rows": rows,
    }


def _twin_controls(twin: Any, loop: Any, samples: int) -> np.ndarray:
    """The fixed-point twin's ``u`` along the same closed loop (no encryption)."""
    A, B, C = loop.plant
    w, v_noise = loop.disturbance(samples)
    x, us = loop.x0.copy(), np.empty((samples, B.shape[1]))
    for k in range(samples):
        us[k] = twin.output(C @ x + v_noise[k])
        x = A @ x + B @ us[k] + w[k]
    return us


def _lwe_row(
    imm: Any,
    local: dict[str, Any],
    remote: dict[str, Any],
    sent: float,
    received: float,
    exact: bool,
) -> dict[str, Any]:
    d = imm.design
    loops = {name: run["advance"] + run["user"] for name, run in (("l", local), ("r", remote))}
    row: dict[str, Any] = {
        "degree": d.degree,
        "modulus_bits": round(float(np.log2(float(d.modulus))), 1),
        "security_bits": d.security_bits,
        "precision_proven": d.precision,
        "round_trip_us": _percentiles_us(remote["advance"]),
        "local_advance_us": _percentiles_us(local["advance"]),
        "user_us": {
            "local": _percentiles_us(local["user"]),
            "remote": _percentiles_us(remote["user"]),
        },
        "loop_us_per_sample": {
            "local": _percentiles_us(loops["l"]),
            "remote": _percentiles_us(loops["r"]),
        },
        "bytes_sent_per_sample": sent,
        "bytes_received_per_sample": received,
        "design_bytes": {"up": d.bytes_up, "down": d.bytes_down, "state_kept_by_server": True},
        "bit_identical_to_twin": exact,
    }
    row["p50_ratio_remote_vs_local_advance"] = (
        row["round_trip_us"]["p50_us"] / row["local_advance_us"]["p50_us"]
    )
    row["p50_ratio_remote_vs_local_loop"] = (
        row["loop_us_per_sample"]["remote"]["p50_us"] / row["loop_us_per_sample"]["local"]["p50_us"]
    )
    return row
