"""Example plugin: an LQR + Kalman controller and the "wrap your controller" demo command.

Public API: :func:`build` and :class:`LqrKalman` (:mod:`.lqr_kalman`), and
:func:`run_controller_demo` (:mod:`.demo`), imported on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from immersion.lazy import lazy_attributes
from immersion.plugins.hookspecs import AlgorithmSpec, CommandSpec, hookimpl

if TYPE_CHECKING:
    from .demo import run_controller_demo
    from .lqr_kalman import LqrKalman, build

__all__ = ["LqrKalman", "build", "run_controller_demo"]

__getattr__ = lazy_attributes(
    __name__, {"LqrKalman": ".lqr_kalman", "build": ".lqr_kalman", "run_controller_demo": ".demo"}
)


@hookimpl
def immersion_register_algorithms() -> list[AlgorithmSpec]:
    from . import lqr_kalman

    return [
        AlgorithmSpec(
            "lqr-kalman",
            lqr_kalman.build,
            "LQR state feedback on a Kalman estimate of a mass-spring-damper",
        )
    ]


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    import click
    from immersion.cli.params import FiniteFloatRange

    @click.command("controller")
    @click.option(
        "--steps", type=click.IntRange(1), default=400, show_default=True, help="Control steps."
    )
    @click.option(
        "--epsilon-input",
        type=FiniteFloatRange(min=0, min_open=True),
        default=1e-3,
        show_default=True,
    )
    @click.option(
        "--epsilon-output",
        type=FiniteFloatRange(min=0, min_open=True),
        default=1e-3,
        show_default=True,
    )
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option(
        "--plot",
        "plot_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Write PNG plots into this folder.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    def controller(
        steps: int,
        epsilon_input: float,
        epsilon_output: float,
        seed: int,
        plot_dir: Path | None,
        as_json: bool,
    ) -> None:
        """Wrap an LQR + Kalman controller with immerse(f, g); plain and immersed side by side."""
        from .demo import print_summary, run_controller_demo

        result: Any = run_controller_demo(
            steps=steps,
            epsilon_input=epsilon_input,
            epsilon_output=epsilon_output,
            seed=seed,
            plot_dir=plot_dir,
        )
        print_summary(result, as_json=as_json)

    return [CommandSpec("controller", controller, parent="demo")]
