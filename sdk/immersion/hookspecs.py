"""Hook specifications of the ``immersion`` plugin system (pluggy).

Every hook is called once, when the registry is built (never inside per-step loops), and
returns a list of registrations that the registry collects from all plugins; none stops at
the first result. Plugins are found through the ``immersion`` entry-point group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pluggy

PROJECT = "immersion"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(frozen=True)
class BackendSpec:
    """An array backend: ``factory(dtype=..., device=...)`` returns an ``ArrayBackend``."""

    name: str
    factory: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class AlgorithmSpec:
    """A dynamical algorithm ready to immerse: ``build(**params)`` returns an object with
    ``f``, ``g``, ``n_state``, ``n_input``, ``n_output`` and ``initial_state``."""

    name: str
    build: Callable[..., Any]
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchemeSpec:
    """A federated scheme: ``factory(**options)`` returns an object with the scheme interface of
    ``immersion_fl.schemes.FedAvg`` (setup, broadcast, client_upload, aggregate, server_update, ...).

    A scheme whose rounds do not fit that interface (MP-DP's key agreement and dropout recovery)
    gives a ``runner(cfg, engine=..., progress=..., faults=...)`` that runs the whole federated
    run and returns a result with ``summary()``; ``immersion fl run`` then calls it instead. With
    ``noise="off"`` such a scheme must reproduce its plain reference round by round (conformance
    test in ``tests/test_fl.py``)."""

    name: str
    factory: Callable[..., Any]
    description: str = ""
    runner: Callable[..., Any] | None = None
    flower_module: str = (
        ""  # module with serve(grid, cfg, plan=, progress=) and client_train(msg, context)
    )


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer as an ``(init, update)`` pair: ``factory(lr)`` returns it (Optax style)."""

    name: str
    factory: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """A CLI command group contributed by a plugin (a ``click.Command``), mounted under ``parent``."""

    name: str
    command: Any
    parent: str = ""


@dataclass(frozen=True)
class AttackSpec:
    """An attack for ``immersion audit``: ``run(quick=..., seed=...)`` returns a list of
    :class:`immersion.audit.AttackResult` (one per scheme and setting, mitigations included)."""

    name: str
    schemes: tuple[str, ...]
    run: Callable[..., Any]
    description: str = ""


@hookspec
def immersion_register_backends() -> list[BackendSpec]:
    """Return the array backends this plugin provides. Called once when the registry is built."""
    raise NotImplementedError


@hookspec
def immersion_register_algorithms() -> list[AlgorithmSpec]:
    """Return the algorithms (controllers, optimizers) this plugin provides. Called once."""
    raise NotImplementedError


@hookspec
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    """Return the federated schemes this plugin provides (``immersion fl run --scheme``). Called once."""
    raise NotImplementedError


@hookspec
def immersion_register_optimizers() -> list[OptimizerSpec]:
    """Return the optimizers this plugin provides (``immersion fl run --optimizer``). Called once."""
    raise NotImplementedError


@hookspec
def immersion_register_commands() -> list[CommandSpec]:
    """Return CLI commands (demos, benchmarks, tools) this plugin adds. Called once, by the CLI."""
    raise NotImplementedError


@hookspec
def immersion_register_attacks() -> list[AttackSpec]:
    """Return the attacks this plugin adds to ``immersion audit``. Called once, by the audit."""
    raise NotImplementedError
