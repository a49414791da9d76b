"""Plugin registry: built-in and third-party plugins, all found through entry points.

Built-ins are registered the same way as third-party plugins (entry points in pyproject.toml),
then ``check_pending()``; a duplicate name raises unless ``force=True``.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pluggy

from ..errors import InvalidArgumentError, PluginError
from . import hookspecs
from .hookspecs import AlgorithmSpec, AttackSpec, BackendSpec, CommandSpec

if TYPE_CHECKING:
    from ..backends import ArrayBackend

#: Modules registered when the package's entry points are not visible (e.g. PYTHONPATH use).
BUILTIN_PLUGINS = ("immersion.plugins.builtin",)


class Registry:
    """What the plugins registered: backends, algorithms and CLI commands, by name (and, through
    :meth:`collect`, what plugins register with hooks of their own)."""

    def __init__(self, manager: pluggy.PluginManager, *, force: bool = False) -> None:
        self.manager = manager
        self.backends: dict[str, BackendSpec] = self._collect(
            manager.hook.immersion_register_backends(), "backend", force
        )
        self.algorithms: dict[str, AlgorithmSpec] = self._collect(
            manager.hook.immersion_register_algorithms(), "algorithm", force
        )
        self._force = force

    @staticmethod
    def _collect(results: list[list[Any]], kind: str, force: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for batch in results:
            for spec in batch:
                if spec.name in out and not force:
                    raise PluginError(
                        f"two plugins register the {kind} {spec.name!r}; rename one or pass "
                        "force=True"
                    )
                out[spec.name] = spec
        return out

    def collect(self, hook: str, kind: str) -> dict[str, Any]:
        """The registrations of any registration hook, by name, a plugin's own hooks included
        (``immersion_fl`` reads its schemes this way); empty if no plugin defines ``hook``.

        Parameters
        ----------
        hook:
            The hook's name, e.g. ``"immersion_register_fl_schemes"``.
        kind:
            What is registered, for the error on a duplicate name.
        """
        caller = getattr(self.manager.hook, hook, None)
        return {} if caller is None else self._collect(caller(), kind, self._force)

    def plugin_hooks(self) -> list[str]:
        """Registration hooks (``immersion_register_*``) that plugins define beyond the core's."""
        return sorted(
            name
            for name in vars(self.manager.hook)
            if name.startswith("immersion_register_") and not hasattr(hookspecs, name)
        )

    def commands(self) -> list[CommandSpec]:
        """CLI commands from every plugin (collected on demand: only the CLI needs them)."""
        return [spec for batch in self.manager.hook.immersion_register_commands() for spec in batch]

    def attacks(self) -> dict[str, AttackSpec]:
        """Attacks from every plugin, by name (collected on demand: only the audit needs them)."""
        return self._collect(self.manager.hook.immersion_register_attacks(), "attack", self._force)

    def make_backend(self, name: str, *, dtype: str | None, device: str | None) -> ArrayBackend:
        if name not in self.backends:
            raise InvalidArgumentError(
                "backend", f"unknown backend {name!r}; registered: {sorted(self.backends)}"
            )
        return self.backends[name].factory(dtype=dtype, device=device)

    def algorithm(self, name: str) -> AlgorithmSpec:
        if name not in self.algorithms:
            raise InvalidArgumentError(
                "algorithm", f"unknown algorithm {name!r}; registered: {sorted(self.algorithms)}"
            )
        return self.algorithms[name]

    def plugin_names(self) -> list[str]:
        return sorted(name for name, _ in self.manager.list_name_plugin())


def build_registry(
    *, extra_plugins: tuple[Any, ...] = (), force: bool = False, entry_points: bool = True
) -> Registry:
    """A fresh registry: entry-point plugins (and built-ins), plus ``extra_plugins``."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    manager.hook.immersion_add_hookspecs.call_historic(kwargs={"manager": manager})
    if entry_points:
        manager.load_setuptools_entrypoints(hookspecs.PROJECT)
    for module_name in BUILTIN_PLUGINS:
        if manager.get_plugin(module_name) is None:
            module = importlib.import_module(module_name)
            if not manager.is_registered(module):
                manager.register(module, name=module_name)
    for plugin in extra_plugins:
        manager.register(plugin)
    manager.check_pending()
    return Registry(manager, force=force)


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The process-wide registry, built on first use (set-up time, never per step)."""
    return build_registry()
