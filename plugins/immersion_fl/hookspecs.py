# mypy: disable-error-code="empty-body"
"""Hook specifications of federated learning: schemes and optimizers (pluggy, project
``immersion``).

Added to the registry by :func:`immersion_fl.immersion_add_hookspecs` when the plugin is
registered; other plugins (MP-DP, SA-DP, SIML) implement them with the core's ``hookimpl``.
:mod:`immersion_fl.registry` reads what they registered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from immersion.plugins.hookspecs import hookspec


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
            from immersion.errors import PluginError

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
        (``immersion_fl.runtime.optimizers.GradientTransformation``, Optax style).
    description:
        One line for ``immersion plugins``.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""


@hookspec
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    """The federated schemes this plugin provides (``immersion fl run --scheme``). Called once."""


@hookspec
def immersion_register_optimizers() -> list[OptimizerSpec]:
    """The optimizers this plugin provides (``immersion fl run --optimizer``). Called once."""
