"""SIML: a privacy-preserving training service by immersion (seed 002 section VI-A, eqs. 39-45).

The user encodes a dataset once; the service trains with the target optimizer (eq. 44) and
returns an encoded model only the key holder decodes (eq. 45). Registers ``immersion siml``
(run, encode, serve, decode) and ``immersion bench siml``.

Public API: :func:`train` (the user's own torch module and data, :mod:`.api`) and what it
returns, :class:`SimlTraining`; :class:`PrivacyDesign` and :class:`TrainingPlan`; for the two
parties apart, :func:`prepare_job`, :func:`save_job`, :func:`load_job`, :func:`decode_model`
(:mod:`.job`).
"""

from __future__ import annotations

from typing import Any

from immersion.plugins.hookspecs import AttackSpec, CommandSpec, hookimpl

__all__ = [
    "PrivacyDesign",
    "SimlTraining",
    "TrainingPlan",
    "decode_model",
    "load_job",
    "prepare_job",
    "save_job",
    "train",
]

_HOMES = {
    "train": "api",
    "SimlTraining": "api",
    "TrainingPlan": "dynamics",
    "PrivacyDesign": "job",
    "prepare_job": "job",
    "save_job": "job",
    "load_job": "job",
    "decode_model": "job",
}


def __getattr__(name: str) -> Any:
    """The public API, imported on first use (the plugin registers without importing torch)."""
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module 'immersion_siml' has no attribute {name!r}")


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
