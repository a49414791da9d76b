# mypy: disable-error-code="empty-body"
"""Hook specifications of the ``immersion`` plugin system (pluggy).

Every hook is called once, when the registry is built (never inside per-step loops), and
returns a list of registrations that the registry collects from all plugins; none stops at
the first result. Plugins are found through the ``immersion`` entry-point group. A plugin may
define hooks of its own for other plugins (:func:`immersion_add_hookspecs`): the federated
schemes and optimizers are ``immersion_fl.hookspecs``.
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
def immersion_register_commands() -> list[CommandSpec]:
    """Return CLI commands (demos, benchmarks, tools) this plugin adds. Called once, by the CLI."""


@hookspec
def immersion_register_attacks() -> list[AttackSpec]:
    """Return the attacks this plugin adds to ``immersion audit``. Called once, by the audit."""


@hookspec(historic=True)
def immersion_add_hookspecs(manager: pluggy.PluginManager) -> None:
    """Add the hook specifications a plugin defines for other plugins (``manager.add_hookspecs``).

    Called when the plugin is registered (a historic hook: plugins registered later are called
    too), before any registration hook runs; ``immersion_fl`` adds its federated schemes and
    optimizers this way, so that the core knows nothing of federated learning.

    Parameters
    ----------
    manager:
        The plugin manager of the registry being built.
    """
