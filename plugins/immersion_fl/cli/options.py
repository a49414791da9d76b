"""The options of ``immersion fl run``, each defined once: the shared ones (what every run takes:
the common fields of :class:`~immersion_fl.config.RunConfig` and how the run is driven) as
:func:`shared` decorators, and the schemes' own flags generated from the fields their option
classes declare with :func:`~immersion_fl.config.option` (:func:`scheme_options`).

A flag that several option classes declare (``--noise``, ``--delta``, ``--epsilon``) becomes one
click option: its choices are the union, its bounds the widest, its help each class's meaning
prefixed with the schemes that take it; where the classes' defaults differ, the flag defaults to
None and each scheme keeps its own default (``fl run`` leaves unset flags out). A flag declared
with two types, or a switch with two defaults, is refused (:class:`~immersion.errors.PluginError`,
naming it).
"""

from __future__ import annotations

import dataclasses
import threading
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import click
from immersion.cli.params import SEED, FiniteFloatRange
from immersion.errors import PluginError

from ..config import Flag, SchemeOptions, options_class_of
from ..hookspecs import SchemeSpec


def _hidden(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected comma-separated layer sizes, e.g. 200,200", param_hint="--hidden"
        ) from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r}: expected positive layer sizes", param_hint="--hidden")
    return sizes


def _model_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from immersion.imports import is_import_path

    if value in ("linear", "mlp", "cnn", "cnn2") or is_import_path(value):
        return value
    raise click.BadParameter(
        f"{value!r}: expected linear, mlp, cnn, cnn2 or package.module:function",
        param_hint="--model",
    )


_DIR = click.Path(file_okay=False, path_type=Path)

#: Name -> (parameter declarations, keyword arguments) of every shared option.
SHARED: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "scheme": (("--scheme",), {"default": "sifl-m1", "show_default": True}),
    "optimizer": (("--optimizer",), {"default": "sgd", "show_default": True}),
    "model": (
        ("--model",),
        {
            "default": "mlp",
            "show_default": True,
            "callback": _model_name,
            "help": "linear, mlp, cnn, cnn2, or your own as package.module:function returning a "
            "float64 nn.Module.",
        },
    ),
    "hidden": (
        ("--hidden",),
        {
            "default": "200,200",
            "show_default": True,
            "callback": _hidden,
            "help": "MLP hidden layer sizes.",
        },
    ),
    "clients": (("--clients",), {"type": click.IntRange(1), "default": 10, "show_default": True}),
    "rounds": (("--rounds",), {"type": click.IntRange(1), "default": 5, "show_default": True}),
    "local_epochs": (
        ("--local-epochs",),
        {"type": click.IntRange(1), "default": 1, "show_default": True},
    ),
    "batch_size": (
        ("--batch-size",),
        {"type": click.IntRange(1), "default": 32, "show_default": True},
    ),
    "lr": (
        ("--lr",),
        {"type": FiniteFloatRange(min=0, min_open=True), "default": 0.05, "show_default": True},
    ),
    "dataset": (
        ("--dataset",),
        {
            "default": "digits",
            "show_default": True,
            "help": "digits, digits28, mnist:PATH, fashion:PATH, or your own as "
            "package.module:function returning (X, Y) or (X, Y, X_test, Y_test).",
        },
    ),
    "split": (
        ("--split",),
        {"type": click.Choice(["iid", "dirichlet"]), "default": "iid", "show_default": True},
    ),
    "alpha": (
        ("--alpha",),
        {
            "type": FiniteFloatRange(min=0, min_open=True),
            "default": 0.5,
            "show_default": True,
            "help": "Dirichlet concentration for --split dirichlet.",
        },
    ),
    "seed": (("--seed",), {"type": SEED, "default": 0, "show_default": True}),
    "compare_plain": (
        ("--compare-plain/--no-compare-plain",),
        {
            "default": True,
            "show_default": True,
            "help": "Run plain FedAvg in lockstep with the same batches.",
        },
    ),
    "client_timeout": (
        ("--client-timeout",),
        {
            "type": FiniteFloatRange(min=0, min_open=True, max=threading.TIMEOUT_MAX),
            "default": None,
            "help": "Seconds a client may take before it is left out of the round.",
        },
    ),
    "engine": (
        ("--engine",),
        {
            "type": click.Choice(["local", "flower"]),
            "default": "local",
            "show_default": True,
            "help": "local: clients in this process; flower: Flower ClientApps on Flower's "
            "simulation runtime.",
        },
    ),
    "reference_drift": (
        ("--reference-drift/--no-reference-drift",),
        {
            "default": True,
            "show_default": True,
            "help": "Also run FedAvg summing its uploads in reverse order: the float64 drift any "
            "two FedAvg runs show, next to the scheme's (with --compare-plain).",
        },
    ),
    "inject": (
        ("--inject-fault", "inject"),
        {
            "multiple": True,
            "metavar": "CLIENT:ROUND:KIND",
            "help": "Make a client fail on purpose (raise, timeout, malformed, wrong-shape; "
            "no-recovery: a survivor does not reveal its seeds, mpdp and --secure-aggregation).",
        },
    ),
    "checkpoint": (
        ("--checkpoint", "checkpoint"),
        {
            "type": _DIR,
            "default": None,
            "help": "Save server state and keys here after every round (owner-only files).",
        },
    ),
    "resume": (
        ("--resume",),
        {"is_flag": True, "help": "Continue the run saved in --checkpoint."},
    ),
    "plot_dir": (("--plot", "plot_dir"), {"type": _DIR, "default": None}),
    "as_json": (("--json", "as_json"), {"is_flag": True, "help": "Print one JSON object."}),
}

#: The shared options of ``immersion fl run`` that are common fields of RunConfig, in help order.
RUN_FIELDS = (
    "scheme",
    "optimizer",
    "model",
    "hidden",
    "clients",
    "rounds",
    "local_epochs",
    "batch_size",
    "lr",
    "dataset",
    "split",
    "alpha",
    "seed",
    "compare_plain",
    "client_timeout",
)
#: The shared options that drive the run (not part of its configuration), after the schemes'.
RUN_CONTROLS = (
    "engine",
    "reference_drift",
    "inject",
    "checkpoint",
    "resume",
    "plot_dir",
    "as_json",
)


def shared_option(name: str, **overrides: Any) -> click.Option:
    """The shared option ``name`` of :data:`SHARED`, with ``overrides`` of its keyword arguments.

    Parameters
    ----------
    name:
        A key of :data:`SHARED`.
    **overrides:
        Keyword arguments of :class:`click.Option` that replace the shared ones (``default=3``).
    """
    decls, kwargs = SHARED[name]
    return click.Option(decls, **{**kwargs, **overrides})


def shared(name: str, **overrides: Any) -> Callable[[Any], Any]:
    """:func:`shared_option` as a decorator of a click command function (like ``click.option``).

    Parameters
    ----------
    name:
        A key of :data:`SHARED`.
    **overrides:
        As in :func:`shared_option`.
    """
    decls, kwargs = SHARED[name]
    return click.option(*decls, **{**kwargs, **overrides})


@dataclass
class _SchemeFlag:
    """One flag of ``immersion fl run`` as the option classes that take it declare it."""

    name: str
    kind: type
    default: Any
    choices: list[str] = field(default_factory=list)
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    #: help text -> the schemes whose option class gives it
    helps: dict[str, list[str]] = field(default_factory=dict)

    def add(self, scheme: str, flag: Flag, kind: type, default: Any) -> None:
        """Merge another option class's declaration (read for ``scheme``)."""
        if kind is not self.kind:
            raise PluginError(
                f"scheme {scheme!r}: flag --{self.name} is a {kind.__name__} here and a "
                f"{self.kind.__name__} for {sorted(s for v in self.helps.values() for s in v)}"
            )
        if not self.helps:  # the first declaration sets the bounds
            self.low, self.high, self.open_low = flag.low, flag.high, flag.open_low
        if default != self.default and kind is bool:
            raise PluginError(
                f"scheme {scheme!r}: switch --{self.name} defaults to {default} here and to "
                f"{self.default} for {sorted(s for v in self.helps.values() for s in v)}"
            )
        if default != self.default:
            self.default = None  # each scheme keeps its own default
        self.choices += [c for c in flag.choices or () if c not in self.choices]
        self.low = None if None in (self.low, flag.low) else min(self.low, flag.low)
        self.high = None if None in (self.high, flag.high) else max(self.high, flag.high)
        self.open_low = self.open_low and flag.open_low
        self.helps.setdefault(flag.help, []).append(scheme)

    def click_option(self) -> click.Option:
        """The click option of the merged declarations."""
        help_text = " ".join(f"{', '.join(sorted(s))}: {h}" for h, s in self.helps.items())
        dashed = self.name.replace("_", "-")
        if self.kind is bool:
            decls = [f"--{dashed}/--no-{dashed}" if self.default else f"--{dashed}", self.name]
            flag_kwargs: dict[str, Any] = {} if self.default else {"is_flag": True}
            return click.Option(
                decls,
                default=bool(self.default),
                show_default=bool(self.default),
                help=help_text,
                **flag_kwargs,
            )
        return click.Option(
            [f"--{dashed}", self.name],
            type=self._click_type(),
            default=self.default,
            show_default=self.default is not None,
            help=help_text,
        )

    def _click_type(self) -> click.ParamType:
        if self.choices:
            return click.Choice(self.choices)
        if self.kind is int:
            return click.IntRange(self.low, self.high)
        if self.kind is float:
            return FiniteFloatRange(self.low, self.high, min_open=self.open_low)
        return click.STRING


def _field_kind(owner: type[SchemeOptions], f: dataclasses.Field[Any]) -> type:
    """``int``, ``float``, ``str`` or ``bool``: the field's type, None left out of a union."""
    hint = typing.get_type_hints(owner)[f.name]
    kinds = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
    if len(kinds) != 1 or kinds[0] not in (int, float, str, bool):
        raise PluginError(
            f"{owner.__name__}.{f.name}: a flag needs an int, float, str or bool field, "
            f"not {hint!r}"
        )
    return kinds[0]


def scheme_options(specs: Iterable[SchemeSpec]) -> list[click.Option]:
    """The click options of every flag the schemes' option classes declare, in order of first
    declaration (one option per flag name, merged across schemes).

    Parameters
    ----------
    specs:
        The registered schemes (:attr:`immersion_fl.registry.FlRegistry.fl_schemes`).
    """
    flags: dict[str, _SchemeFlag] = {}
    for spec in specs:
        owner = options_class_of(spec)
        for f, flag in owner.cli_flags():
            kind = _field_kind(owner, f)
            default = f.default if flag.cli_default is None else flag.cli_default
            if f.name in SHARED:
                raise PluginError(f"{owner.__name__}.{f.name}: --{f.name} is a shared option")
            flags.setdefault(f.name, _SchemeFlag(f.name, kind, default)).add(
                spec.name, flag, kind, default
            )
    return [merged.click_option() for merged in flags.values()]
