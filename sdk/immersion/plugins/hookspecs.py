# mypy: disable-error-code="empty-body"
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
    """An array backend.

    Parameters
    ----------
    name:
        The registered name (``make_backend(name)``).
    factory:
        ``factory(dtype=..., device=...)`` returns an ``ArrayBackend``.
    description:
        One line for ``immersion plugins``.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class AlgorithmSpec:
    """A dynamical algorithm ready to immerse.

    Parameters
    ----------
    name:
        The registered name.
    build:
        ``build(**params)`` returns an object with ``f``, ``g``, ``n_state``, ``n_input``,
        ``n_output`` and ``initial_state``.
    description:
        One line for ``immersion plugins``.
    defaults:
        Suggested ``params`` for ``build`` (a record for listings; the registry does not pass
        them: ``build`` keeps its own defaults).
    """

    name: str
    build: Callable[..., Any]
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FlowerHooks:
    """How a federated scheme meets Flower (flwr's Message API).

    Parameters
    ----------
    strategy:
        A strategy wrapper for a user's own ServerApp: ``strategy(user_strategy, **options)``
        returns a Flower ``Strategy`` that delegates to ``user_strategy`` (the pattern of
        Flower's ``DifferentialPrivacyClientSideFixedClipping``).
    mod:
        The matching client mod for the user's ClientApp, ``mod(msg, context, call_next)``
        (the pattern of Flower's ``fixedclipping_mod``).
    server, client:
        For schemes with their own rounds: the SDK runner's ServerApp work
        ``server(grid, cfg, plan=, progress=)`` and ClientApp ``client(msg, context)`` (used by
        ``immersion fl run --engine flower`` and the deployment app).
    """

    strategy: Callable[..., Any] | None = None
    mod: Callable[..., Any] | None = None
    server: Callable[..., Any] | None = None
    client: Callable[..., Any] | None = None


@dataclass(frozen=True, kw_only=True)
class SchemeSpec:
    """A federated scheme. Exactly one of ``factory`` and ``runner`` is given.

    Parameters
    ----------
    name:
        The registered name (``immersion fl run --scheme``).
    description:
        One line for ``immersion plugins``.
    options:
        The scheme's option class (a frozen dataclass deriving from
        ``immersion_fl.config.SchemeOptions`` that validates itself).
    factory:
        ``factory(options, context)`` returns an ``immersion_fl.scheme.Scheme`` (the
        weight-averaging contract: setup, broadcast, client upload, aggregate, server update).
    runner:
        For a scheme whose rounds do not fit that contract (MP-DP's key agreement and dropout
        recovery): ``runner(cfg, engine=, progress=, faults=, task=)`` runs the whole federated
        run and returns a result with ``summary()``. With its noise off it must reproduce its
        plain reference round by round (conformance test in ``tests/test_fl.py``).
    flower:
        How the scheme meets Flower (:class:`FlowerHooks`).
    """

    name: str
    description: str = ""
    options: type
    factory: Callable[..., Any] | None = None
    runner: Callable[..., Any] | None = None
    flower: FlowerHooks = field(default_factory=FlowerHooks)

    def __post_init__(self) -> None:
        if (self.factory is None) == (self.runner is None):
            from ..errors import PluginError

            raise PluginError(f"scheme {self.name!r}: give exactly one of factory and runner")


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer of federated clients and target optimizers.

    Parameters
    ----------
    name:
        The registered name (``immersion fl run --optimizer``).
    factory:
        ``factory(lr)`` returns an ``(init, update)`` gradient transformation
        (``immersion_fl.optimizers.GradientTransformation``, Optax style).
    description:
        One line for ``immersion plugins``.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class CommandSpec:
    """A CLI command a plugin contributes.

    Parameters
    ----------
    name:
        The command's name on the command line.
    command:
        The ``click.Command`` (or group).
    parent:
        The group it is mounted under (``""``: the top level, ``"bench"``: ``immersion bench``).
    """

    name: str
    command: Any
    parent: str = ""


@dataclass(frozen=True)
class AttackSpec:
    """An attack for ``immersion audit``.

    Parameters
    ----------
    name:
        The registered name (``immersion audit --attack``).
    schemes:
        The schemes it attacks.
    run:
        ``run(quick=..., seed=...)`` returns a list of :class:`immersion.audit.runner.AttackResult`
        (one per scheme and setting, mitigations included).
    description:
        One line: what it shows and which mitigations it measures.
    """

    name: str
    schemes: tuple[str, ...]
    run: Callable[..., Any]
    description: str = ""


@hookspec
def immersion_register_backends() -> list[BackendSpec]:
    """Return the array backends this plugin provides. Called once when the registry is built."""


@hookspec
def immersion_register_algorithms() -> list[AlgorithmSpec]:
    """Return the algorithms (controllers, optimizers) this plugin provides. Called once."""


@hookspec
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    """The federated schemes this plugin provides (``immersion fl run --scheme``). Called once."""


@hookspec
def immersion_register_optimizers() -> list[OptimizerSpec]:
    """The optimizers this plugin provides (``immersion fl run --optimizer``). Called once."""


@hookspec
def immersion_register_commands() -> list[CommandSpec]:
    """Return CLI commands (demos, benchmarks, tools) this plugin adds. Called once, by the CLI."""


@hookspec
def immersion_register_attacks() -> list[AttackSpec]:
    """Return the attacks this plugin adds to ``immersion audit``. Called once, by the audit."""
