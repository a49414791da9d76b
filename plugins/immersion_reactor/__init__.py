"""Reactor plugin: the two-stage chemical reactor and its adaptive controller (seed 002, SI-NCS).

Registers the sampled controller as the algorithm ``reactor-controller`` and the command
``immersion demo reactor``.
"""

from __future__ import annotations

from typing import Any

from immersion.plugins.hookspecs import AlgorithmSpec, CommandSpec, hookimpl

from .model import ReactorController, ReactorParameters
from .simulation import ReactorDivergenceError, ReactorRun, run_reactor, summary

__all__ = [
    "ReactorController",
    "ReactorParameters",
    "ReactorRun",
    "ReactorDivergenceError",
    "run_reactor",
    "summary",
]


def _build(*, dt: float = 0.01) -> Any:
    return ReactorController(dt=float(dt))


@hookimpl
def immersion_register_algorithms() -> list[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            "reactor-controller",
            _build,
            "adaptive output-feedback controller of the two-stage reactor (seed 002 eqs. 49-50), "
            "sampled with period dt",
            defaults={"dt": 0.01},
        )
    ]


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import reactor_command

    return [CommandSpec("reactor", reactor_command, parent="demo")]
