"""Privacy versus precision: measured decode error against epsilon, float64 and float32.

Run:  .venv/bin/python benchmarks/precision_tradeoff.py [--plot out/]   (prints one JSON object)

For each epsilon the same 6-state nonlinear system runs 200 steps plainly and immersed; the
measured max abs error of decoded outputs is printed beside the library's probe-point estimate
(not a bound; seed002 notes section 5: epsilon x error is roughly constant, ~1e-14 in float64).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from immersion import immerse
from immersion.testing import random_contractive_system, run_side_by_side

EPSILONS = (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10, 1e-12)


def measure(dtype: str) -> list[dict[str, float]]:
    f, g = random_contractive_system(6, 2, 2, seed=1)
    rows = []
    for eps in EPSILONS:
        backend = "numpy" if dtype == "float64" else "torch"
        if backend == "torch":
            import torch

            f_run, g_run = _torch_wrap(f), _torch_wrap(g)
            to = torch.float32
        else:
            f_run, g_run, to = f, g, None
        imm = immerse(
            f_run,
            g_run,
            n_state=6,
            n_input=2,
            n_output=2,
            extra_input=3,
            extra_output=3,
            epsilon_input=eps,
            epsilon_output=eps,
            backend=backend,
            dtype=dtype,
            tolerance=None,
            rng=7,
        )
        inputs = np.random.default_rng(0).standard_normal((200, 2))
        if to is None:
            run = run_side_by_side(imm, f, g, x0=np.zeros(6), inputs=inputs)
            err = run.max_output_error
        else:
            err = _run_torch(imm, f, g, inputs, to)
        rows.append(
            {
                "epsilon": eps,
                "dtype": dtype,
                "max_abs_output_error": err,
                "decode_error_estimate": imm.report().decode_error_estimate,
            }
        )
    return rows


def _torch_wrap(fn):
    import torch

    def wrapped(x, y):
        return torch.as_tensor(fn(x.double().numpy(), y.double().numpy()), dtype=x.dtype)

    return wrapped


def _run_torch(imm, f, g, inputs, dtype) -> float:
    import torch

    x = np.zeros(6)
    xt = imm.encode_state(torch.zeros(6, dtype=dtype))
    worst = 0.0
    for y in inputs:
        yt = imm.encode_input(torch.as_tensor(y, dtype=dtype))
        u = imm.decode_output(imm.target.output(xt, yt), yt).double().numpy()
        worst = max(worst, float(np.abs(u - g(x, y)).max()))
        x, xt = f(x, y), imm.target.step(xt, yt)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    rows = measure("float64")
    try:
        rows += measure("float32")
    except ImportError:
        pass
    out = {"benchmark": "precision_tradeoff", "rows": rows}
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        args.plot.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for dtype, color in (("float64", "tab:blue"), ("float32", "tab:red")):
            sel = [r for r in rows if r["dtype"] == dtype]
            if sel:
                ax.loglog(
                    [r["epsilon"] for r in sel],
                    [r["max_abs_output_error"] for r in sel],
                    "o-",
                    color=color,
                    label=f"{dtype} measured",
                )
                ax.loglog(
                    [r["epsilon"] for r in sel],
                    [r["decode_error_estimate"] for r in sel],
                    "--",
                    color=color,
                    label=f"{dtype} estimate (not a bound)",
                )
        ax.invert_xaxis()
        ax.set_xlabel("per-element epsilon (smaller = more private)")
        ax.set_ylabel("max abs decode error")
        ax.set_title("Privacy versus precision (6 states, 200 steps)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = args.plot / "precision_tradeoff.png"
        fig.savefig(path, dpi=110)
        out["plot"] = str(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
