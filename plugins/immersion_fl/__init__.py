"""Federated learning by immersion: SIFL M1/M2 (seed 000) and random-matrix SIFL (seed 003).

Public API: :func:`run` (a user's torch module and data, :mod:`.api`), and for a Flower app
of the user's own, :class:`SiflStrategy` and :func:`sifl_mod` (:mod:`.flower.native`).

Layout: the contract a scheme builds on at the top (:mod:`.hookspecs`, :mod:`.registry`,
:mod:`.config`, :mod:`.scheme`); the SDK's runner in :mod:`.runtime`; one module per scheme in
:mod:`.schemes`; the Flower adapters in :mod:`.flower`; the commands in :mod:`.cli`.

Registers the schemes ``fedavg``, ``sifl-m1``, ``sifl-m2``, ``sifl-rm``, the optimizers ``sgd``,
``momentum``, ``adam``, the commands ``immersion fl run``, ``immersion bench sifl`` and
``immersion keys flower`` (TLS certificates and SuperNode keys, :mod:`.flower.tls`), and the
audit's attacks ``shared-noise-difference``, ``client-decodes`` and ``m2-scalar-leak``
(:mod:`.attacks`). Registering imports neither torch nor Flower.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import pluggy
from immersion.plugins.hookspecs import AttackSpec, CommandSpec, hookimpl

from .hookspecs import FlowerHooks, OptimizerSpec, SchemeSpec

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp.typing import ClientAppCallable
    from flwr.serverapp.strategy import Strategy

    from .flower.native import SiflStrategy

__all__ = [
    "run",
    "FederatedResult",
    "SiflStrategy",
    "sifl_mod",
    "EveryClientFailedError",
    "SecureAggregationError",
]


def __getattr__(name: str) -> Any:
    """The public API, imported on first use (the plugin registers without importing torch)."""
    if name in ("run", "FederatedResult"):
        from . import api

        return getattr(api, name)
    if name in ("SiflStrategy", "sifl_mod"):
        from .flower import native as flower_native

        return getattr(flower_native, name)
    if name == "EveryClientFailedError":
        from .runtime import federation

        return federation.EveryClientFailedError
    if name == "SecureAggregationError":
        from .runtime import secure

        return secure.SecureAggregationError
    raise AttributeError(f"module 'immersion_fl' has no attribute {name!r}")


@hookimpl
def immersion_add_hookspecs(manager: pluggy.PluginManager) -> None:
    """Federated schemes and optimizers are hooks of this plugin (:mod:`.hookspecs`)."""
    from . import hookspecs

    manager.add_hookspecs(hookspecs)


@hookimpl
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    from . import schemes
    from .config import NoOptions

    def sifl(name: str) -> FlowerHooks:
        # one wrapper per scheme: the registered name is the scheme the wrapper runs (the mod is
        # the same for all three: it reads the scheme's client kit from the server's messages)
        return FlowerHooks(strategy=partial(_sifl_strategy, scheme=name), mod=_sifl_mod)

    return [
        SchemeSpec(
            name="fedavg",
            description="plain federated averaging (reference)",
            options=NoOptions,
            factory=schemes.fedavg_scheme,
        ),
        SchemeSpec(
            name="sifl-m1",
            description="SIFL M1: server coding (seed 000 Algorithm 1)",
            options=schemes.SiflOptions,
            factory=schemes.sifl_m1_scheme,
            flower=sifl("sifl-m1"),
        ),
        SchemeSpec(
            name="sifl-m2",
            description="SIFL M2: server and aggregator coding (Algorithm 2)",
            options=schemes.SiflOptions,
            factory=schemes.sifl_m2_scheme,
            flower=sifl("sifl-m2"),
        ),
        SchemeSpec(
            name="sifl-rm",
            description="random-matrix SIFL (seed 003)",
            options=schemes.SiflOptions,
            factory=schemes.sifl_rm_scheme,
            flower=sifl("sifl-rm"),
        ),
    ]


def _sifl_strategy(strategy: Strategy, *, scheme: str, **options: Any) -> SiflStrategy:
    from .flower.native import SiflStrategy

    return SiflStrategy(strategy, scheme, **options)


def _sifl_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    from .flower.native import sifl_mod

    return sifl_mod(msg, context, call_next)


@hookimpl
def immersion_register_optimizers() -> list[OptimizerSpec]:
    from .runtime import optimizers

    return [
        OptimizerSpec("sgd", optimizers.sgd, "w <- w - lr g"),
        OptimizerSpec("momentum", optimizers.momentum, "heavy ball, beta 0.9"),
        OptimizerSpec("adam", optimizers.adam, "Adam, Keras defaults"),
    ]


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli.bench import bench_sifl
    from .cli.keys import keys_flower
    from .cli.run import fl_group

    return [
        CommandSpec("fl", fl_group, parent=""),
        CommandSpec("sifl", bench_sifl, parent="bench"),
        CommandSpec("flower", keys_flower, parent="keys"),
    ]


@hookimpl
def immersion_register_attacks() -> list[AttackSpec]:
    from . import attacks

    return [
        AttackSpec(
            "shared-noise-difference",
            attacks.DIFFERENCE_SCHEMES,
            attacks.run_shared_noise_difference,
            "the round noise is shared: the difference of two uploads is noise-free (mitigations: "
            "client-noise, secure-aggregation)",
        ),
        AttackSpec(
            "client-decodes",
            attacks.DIFFERENCE_SCHEMES,
            attacks.run_client_decodes,
            "every client's kit decodes the global model every round",
        ),
        AttackSpec(
            "m2-scalar-leak",
            ("sifl-m2",),
            attacks.run_m2_scalar_leak,
            "the M2 server recovers w up to a scalar from the p columns of w_bar",
        ),
    ]
