"""Secure aggregation as a source of differential privacy (seed 001), and how to top it up.

Registers the federated schemes ``sgd-dp``, ``gsgd-dp`` and ``gd-dp`` (``immersion fl run``) and
the command ``immersion dp secagg`` (the accountant of Theorems 2 and 4).
"""

from __future__ import annotations

from immersion.hookspecs import CommandSpec, SchemeSpec, hookimpl


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import dp_group

    return [CommandSpec("dp", dp_group, parent="")]


@hookimpl
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    from .engine import run_secagg
    from .options import DpSgdOptions

    return [
        SchemeSpec(
            name="sgd-dp",
            description="SGD + IID sampling + isotropic noise (seed 001)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
        SchemeSpec(
            name="gsgd-dp",
            description="Gaussian sampling + WF-NA noise (seed 001 Theorem 4)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
        SchemeSpec(
            name="gd-dp",
            description="full gradient + isotropic noise (seed 001)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
    ]
