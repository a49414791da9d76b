"""Federated learning by immersion: SIFL M1/M2 (seed 000) and random-matrix SIFL (seed 003).

Registers the schemes ``fedavg``, ``sifl-m1``, ``sifl-m2``, ``sifl-rm``, the optimizers ``sgd``,
``momentum``, ``adam``, and the commands ``immersion fl run`` and ``immersion bench sifl``.
"""
from __future__ import annotations

from immersion.hookspecs import CommandSpec, OptimizerSpec, SchemeSpec, hookimpl


@hookimpl
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    from . import schemes

    return [SchemeSpec("fedavg", schemes.fedavg_scheme, "plain federated averaging (reference)"),
            SchemeSpec("sifl-m1", schemes.sifl_m1_scheme, "SIFL M1: server coding (seed 000 Algorithm 1)"),
            SchemeSpec("sifl-m2", schemes.sifl_m2_scheme, "SIFL M2: server and aggregator coding (Algorithm 2)"),
            SchemeSpec("sifl-rm", schemes.sifl_rm_scheme, "random-matrix SIFL (seed 003)")]


@hookimpl
def immersion_register_optimizers() -> list[OptimizerSpec]:
    from . import optimizers

    return [OptimizerSpec("sgd", optimizers.SGD, "w <- w - lr g"),
            OptimizerSpec("momentum", optimizers.Momentum, "heavy ball, beta 0.9"),
            OptimizerSpec("adam", optimizers.Adam, "Adam, Keras defaults")]


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import bench_sifl, fl_group

    return [CommandSpec("fl", fl_group, parent=""), CommandSpec("sifl", bench_sifl, parent="bench")]
