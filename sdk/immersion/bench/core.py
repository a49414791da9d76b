"""Side-by-side timings in one process, reported as ratios; not run by the test suite.

``bench_core``: encode + target + decode against plain ``f, g`` (``benchmarks/bench_core.py``,
``immersion bench core``). ``bench_codec``: the modular codec against the float codec on flat
vectors of 10^5-10^6 entries (``benchmarks/bench_codec.py``, ``immersion bench codec``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

import numpy as np

from ..coding.factory import Immersion, immerse

#: (n_state, keys) settings: small and medium dense, 1000 both ways, and 100,000 with block keys.
#: A key structure of :func:`~immersion.immerse` (``keys=``).
KeyKind = Literal["auto", "dense", "block"]

DEFAULT_SIZES: tuple[tuple[int, KeyKind], ...] = (
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
) -> tuple[float, float, np.ndarray, Any, dict[str, float] | None]:
    """Best-of-``repeats`` per-step times of the plain and the immersed loop, alternating, then
    the block-key transforms' profile of the immersed loop (:func:`transform_profile`)."""
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
    x_end, xt_end = state["x"], state["xt"]  # both loops ran the same number of steps
    profile = transform_profile(imm, immersed, steps, repeats)
    return t_plain, t_imm, x_end, xt_end, profile


def _timed_transforms(imm: Immersion) -> tuple[list[Any], dict[str, float]]:
    """The block-key transforms ``imm`` and its target apply, each wrapped to count its calls,
    its seconds and the bytes it must move at least (its key arrays, one vector in, one out).

    Returns the transforms (call :func:`_untimed` on them afterwards) and the running totals.
    """
    from ..keys import StructuredCode

    totals = {"calls": 0.0, "seconds": 0.0, "bytes": 0.0}
    codes = (imm.keys.input_code, imm.keys.state_code, imm.keys.output_code)
    transforms = [c.transform(imm.backend) for c in codes if isinstance(c, StructuredCode)]
    for t in {id(t): t for t in transforms}.values():
        for name in ("forward", "adjoint"):
            method = getattr(t, name)

            def timed(v: Any, method: Any = method, t: Any = t) -> Any:
                start = time.perf_counter()
                out = method(v)
                totals["seconds"] += time.perf_counter() - start
                totals["calls"] += 1
                totals["bytes"] += t.key_nbytes + 2 * v.nbytes
                return out

            setattr(t, name, timed)
    return transforms, totals


def _untimed(transforms: list[Any]) -> None:
    for t in transforms:
        for name in ("forward", "adjoint"):
            t.__dict__.pop(name, None)


def _stream_seconds(nbytes: int, repeats: int) -> tuple[float, float]:
    """Best-of-``repeats`` times to copy ``nbytes`` (read once, write once) and to read them once
    (a BLAS dot of the array with itself): two memory-bandwidth floors for the same bytes."""
    src = np.ones(max(1, nbytes // 8))
    dst = np.empty_like(src)
    copy = read = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        copy = min(copy, time.perf_counter() - start)
        start = time.perf_counter()
        src @ src
        read = min(read, time.perf_counter() - start)
    return float(copy), float(read)


def transform_profile(
    imm: Immersion, step: Callable[[], None], steps: int, repeats: int
) -> dict[str, float] | None:
    """The structured transforms' share of one immersed step, beside a memory-bandwidth floor.

    ``step`` runs one immersed sample; its block-key transforms (``Q v`` and ``Q^T x``) are timed
    call by call for ``steps`` samples (best of ``repeats``). The floors are the times numpy takes
    to copy, and to read once (a dot product), the bytes those transforms must read per step
    (their key arrays plus one vector in and one out): ``transform_over_copy`` and
    ``transform_over_read`` say how far the transforms are from streaming their keys once from
    memory. None for dense keys (no structured transform).
    """
    transforms, totals = _timed_transforms(imm)
    if not transforms:
        return None
    best: dict[str, float] | None = None
    try:
        for _ in range(repeats):
            totals.update(calls=0.0, seconds=0.0, bytes=0.0)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            elapsed = time.perf_counter() - start
            if best is None or totals["seconds"] < best["seconds"]:
                best = dict(totals, elapsed=elapsed)
    finally:
        _untimed(transforms)
    assert best is not None
    per_step_bytes = int(best["bytes"] / steps)
    copy_s, read_s = _stream_seconds(per_step_bytes, 5)
    transform_s = best["seconds"] / steps
    return {
        "transforms_per_step": best["calls"] / steps,
        "transform_bytes_per_step": per_step_bytes,
        "transform_s_per_step": transform_s,
        "transform_share": best["seconds"] / best["elapsed"],
        "copy_s_same_bytes": copy_s,
        "read_s_same_bytes": read_s,
        "read_gb_per_s": per_step_bytes / read_s / 1e9,
        "transform_over_copy": transform_s / copy_s,
        "transform_over_read": transform_s / read_s,
    }


def bench_core(
    *,
    sizes: tuple[tuple[int, KeyKind], ...] = DEFAULT_SIZES,
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
            imm = immerse(f, g, n_state=n, n_input=n, n_output=n, keys=kind, rng=seed)
            build_s = time.perf_counter() - t_build
            x = rng.standard_normal(n) * 0.1
            y = rng.standard_normal(n) * 0.1
            loop_steps = max(5, steps if n <= 1000 else steps // 10)
            t_plain, t_imm, x_end, xt_end, profile = _time_pair(
                imm, f, g, x, y, loop_steps, repeats
            )
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
                    "decode_error_estimate": imm.report().decode_error_estimate,
                    "transforms": profile,
                }
            )
    return {"benchmark": "core", "steps": steps, "repeats": repeats, "results": rows}


#: Flat vector sizes of ``bench_codec``: the 199,210-parameter MLP, the 1,199,882-entry CNN state.
CODEC_SIZES: tuple[int, ...] = (199_210, 1_199_882)


def _codec_pair(n: int, extra: int, seed: int) -> tuple[Callable[[], Any], Callable[[], Any], dict]:
    """One round trip (encode with fresh noise, then decode) of the float and the modular codec."""
    from ..backends import make_backend
    from ..integer import decode_fixed, encode_fixed, quantise, uniform_noise
    from ..keys import draw_code, draw_modular_code

    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n)
    be = make_backend("numpy")
    t0 = time.perf_counter()
    fcode = draw_code(n, extra, kind="block", rng=seed)
    t1 = time.perf_counter()
    mcode = draw_modular_code(n, extra, kind="block", rng=seed)
    t2 = time.perf_counter()
    f_enc, f_dec, noise = fcode.noisy_encoder(be), fcode.decoder(be), be.noise_stream(rng)
    m_enc, m_dec = mcode.noisy_encoder(), mcode.decoder()
    bits = 32

    def float_trip() -> Any:
        return f_dec(f_enc(w, noise.laplace((extra,), 0.0, 1e3)))

    def modular_trip() -> Any:
        q = encode_fixed(w, bits, name="w")
        return decode_fixed(m_dec(m_enc(q, uniform_noise(rng, extra))), bits)

    info = {
        "float_key_bytes": fcode.nbytes,
        "modular_key_bytes": mcode.nbytes,
        "float_key_draw_s": t1 - t0,
        "modular_key_draw_s": t2 - t1,
        "float_max_abs_decode_error": float(np.abs(float_trip() - w).max()),
        "modular_decode_equals_fixed_point": bool(
            np.array_equal(modular_trip(), quantise(w, bits))
        ),
        "fraction_bits": bits,
    }
    return float_trip, modular_trip, info


def bench_codec(
    *,
    sizes: tuple[int, ...] = CODEC_SIZES,
    extra: int = 2,
    repeats: int = 7,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Encode + decode of one flat vector: the modular codec beside the float codec, same process.

    Block keys with each arithmetic's default block size (float 32, modular 16); ``extra`` noise
    entries; fresh noise every round trip (Laplace for float, uniform modulo 2^64 for modular,
    with fixed-point conversion at ``fraction_bits=32`` included). Each timing averages
    ``max(1, 2e6 // n)`` round trips; the two codecs alternate ``repeats`` times and the minimum
    of each is kept; the figure of merit is the ratio modular / float (goal: at most 1.5).
    """
    rows = []
    for n in sizes:
        if progress:
            progress(f"codec n={n:,}")
        float_trip, modular_trip, info = _codec_pair(n, extra, seed)
        trips = max(1, 2_000_000 // n)  # about 0.1 s per timing, so one preemption shows less
        t_float, t_mod = np.inf, np.inf
        for _ in range(repeats):
            t_float = min(t_float, _time_loop(float_trip, trips))
            t_mod = min(t_mod, _time_loop(modular_trip, trips))
        rows.append(
            {
                "n": n,
                "extra": extra,
                "float_round_trip_s": t_float,
                "modular_round_trip_s": t_mod,
                "modular_over_float": t_mod / t_float,
                **info,
            }
        )
    return {"benchmark": "codec", "repeats": repeats, "results": rows}
