"""The seed 002 networked-control case study: a two-stage chemical reactor with delayed recycle,
controlled by an adaptive output-feedback controller that runs in the cloud on encoded data.

    .venv/bin/python control_demos/reactor.py [--steps 2000] [--dt 0.01] [--plot out/reactor]

Same as ``immersion demo reactor``; this script shows the few public calls behind it. Add
``--remote`` to the CLI form to run the controller in a separate ``immersion serve`` process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from immersion_reactor import ReactorParameters, run_reactor, summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=2000, help="controller samples (2000 = 20 s at dt 0.01)"
    )
    parser.add_argument(
        "--dt", type=float, default=0.01, help="sampling period of the controller [s]"
    )
    parser.add_argument(
        "--epsilon", type=float, default=1e-3, help="per-element epsilon of y~ and u~"
    )
    parser.add_argument("--plot", type=Path, default=None, help="folder for the PNGs of Figs. 8-12")
    args = parser.parse_args()

    run = run_reactor(
        steps=args.steps,
        dt=args.dt,
        epsilon_input=args.epsilon,
        epsilon_output=args.epsilon,
        params=ReactorParameters(),
    )  # the paper's parameters; override any field
    result = summary(run)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "max_abs_u",
                    "drift_max_abs_u",
                    "decode_error_bound",
                    "decode_bound_holds",
                    "final_state_norm_plain",
                    "final_state_norm_immersed",
                    "epsilon_input",
                    "step_time_ratio",
                )
            },
            indent=2,
        )
    )
    if args.plot:
        from immersion_reactor.plots import write_plots

        for path in write_plots(run, args.plot):
            print(f"plot: {path}")


if __name__ == "__main__":
    main()
