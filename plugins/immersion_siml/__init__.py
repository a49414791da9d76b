"""SIML: a privacy-preserving training service by immersion (seed 002 section VI-A, eqs. 39-45).

The user encodes a dataset once; the service trains with the target optimizer (eq. 44) and
returns an encoded model only the key holder decodes (eq. 45). Registers ``immersion siml``
(run, encode, serve, decode) and ``immersion bench siml``.
"""

from __future__ import annotations

from immersion.hookspecs import AttackSpec, CommandSpec, hookimpl


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import bench_siml_cmd, siml_group

    return [
        CommandSpec("siml", siml_group, parent=""),
        CommandSpec("siml", bench_siml_cmd, parent="bench"),
    ]


@hookimpl
def immersion_register_attacks() -> list[AttackSpec]:
    from .attacks import run_service_decodes

    return [
        AttackSpec(
            "service-decodes",
            ("siml",),
            run_service_decodes,
            "the SIML service (or any holder of the job file) decodes data and model",
        )
    ]
