"""The federated schemes and optimizers the plugins registered (:mod:`immersion_fl.hookspecs`).

Read from the core's process-wide registry (:func:`immersion.plugins.manager.registry`) once,
at set-up time; a scheme or optimizer name that no plugin registered is a named error.
"""

from __future__ import annotations

from functools import lru_cache

from immersion.errors import InvalidArgumentError
from immersion.plugins.manager import Registry, registry

from .hookspecs import OptimizerSpec, SchemeSpec


class FlRegistry:
    """Schemes and optimizers by name, collected from every plugin.

    Parameters
    ----------
    core:
        The core registry whose plugin manager holds the registrations.
    """

    def __init__(self, core: Registry) -> None:
        self.fl_schemes: dict[str, SchemeSpec] = core.collect(
            "immersion_register_fl_schemes", "federated scheme"
        )
        self.optimizers: dict[str, OptimizerSpec] = core.collect(
            "immersion_register_optimizers", "optimizer"
        )

    def fl_scheme(self, name: str) -> SchemeSpec:
        """The registered scheme ``name``.

        Parameters
        ----------
        name:
            As given to ``immersion fl run --scheme``.
        """
        if name not in self.fl_schemes:
            raise InvalidArgumentError(
                "scheme", f"unknown scheme {name!r}; registered: {sorted(self.fl_schemes)}"
            )
        return self.fl_schemes[name]

    def optimizer(self, name: str) -> OptimizerSpec:
        """The registered optimizer ``name``.

        Parameters
        ----------
        name:
            As given to ``immersion fl run --optimizer``.
        """
        if name not in self.optimizers:
            raise InvalidArgumentError(
                "optimizer", f"unknown optimizer {name!r}; registered: {sorted(self.optimizers)}"
            )
        return self.optimizers[name]


@lru_cache(maxsize=1)
def fl_registry() -> FlRegistry:
    """The process-wide :class:`FlRegistry`, read from :func:`registry` on first use."""
    return FlRegistry(registry())
