"""Federated learning by immersion: SIFL M1/M2 (seed 000) and random-matrix SIFL (seed 003).

Registers ``immersion fl run`` and ``immersion bench sifl``. Work in progress: the in-process
engine and the four schemes are done; the Flower engine, fault handling and checkpoints are not.
"""
from __future__ import annotations

from immersion.hookspecs import CommandSpec, hookimpl


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import bench_sifl, fl_group

    return [CommandSpec("fl", fl_group, parent=""), CommandSpec("sifl", bench_sifl, parent="bench")]
