"""Secure aggregation as a source of differential privacy (seed 001), and how to top it up.

Registers the command ``immersion dp secagg`` (the accountant of Theorems 2 and 4).
"""
from __future__ import annotations

from immersion.hookspecs import CommandSpec, hookimpl


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import dp_group

    return [CommandSpec("dp", dp_group, parent="")]
