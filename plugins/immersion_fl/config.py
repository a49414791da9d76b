"""What defines a federated run: the common :class:`RunConfig` and each scheme's own options.

Every registered scheme names its option class in its
:class:`~immersion_fl.hookspecs.SchemeSpec` (``options=``): SIFL's
:class:`~immersion_fl.schemes.SiflOptions`, MP-DP's ``immersion_mpdp.options.MpdpOptions``, seed
001's ``immersion_secagg.options.DpSgdOptions``. Option classes are frozen dataclasses that validate
themselves; :class:`RunConfig` holds the fields every scheme shares plus one such object.

Serialised configurations (checkpoints, Flower messages, Flower run configs) are versioned:
format 2 is ``{"format": 2, "run": {...}, "options": {...}}``; format 1 (before the options were
split off) was one flat dictionary of 30 fields (29 before ``client_noise``) and is migrated by
:meth:`RunConfig.from_format1`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, TypeVar

import numpy as np
from immersion import InvalidArgumentError

if TYPE_CHECKING:
    from .hookspecs import SchemeSpec

T = TypeVar("T", bound="SchemeOptions")

#: The serialisation format written by :meth:`RunConfig.to_json`.
CONFIG_FORMAT = 2


@dataclass(frozen=True)
class Flag:
    """How a scheme option appears on ``immersion fl run``, declared once with its field (use
    :func:`option`). The flag is ``--`` and the field name with dashes; its type and default are
    the field's (a ``bool`` defaulting to True becomes ``--name/--no-name``, one defaulting to
    False a switch); ``immersion_fl.cli.options`` builds the click option and merges the flags
    that several schemes share.

    Parameters
    ----------
    help:
        What the option means for the schemes that take it (the CLI prefixes their names).
    choices:
        The accepted strings, if the option is one of a fixed set.
    low, high:
        Bounds of a number (None: unbounded), checked by the CLI before the option class
        validates the value.
    open_low:
        Whether ``low`` itself is refused.
    cli_default:
        The flag's default where it differs from the field's (``--noise auto``, read through
        :meth:`SchemeOptions.interpret_flag`); None: the field's.
    """

    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    cli_default: str | None = None


def option(default: Any, help: str, **flag: Any) -> Any:
    """A field of a :class:`SchemeOptions` subclass that is also a flag of ``immersion fl run``:
    ``p: int = option(2, "Aggregator columns of sifl-m2.", low=2)``.

    Parameters
    ----------
    default:
        The field's default.
    help:
        As :attr:`Flag.help`.
    **flag:
        The other fields of :class:`Flag` (``choices``, ``low``, ``high``, ``open_low``,
        ``cli_default``).
    """
    return dataclasses.field(default=default, metadata={"flag": Flag(help, **flag)})


@dataclass(frozen=True)
class SchemeOptions:
    """Base of every scheme's options: frozen, validated in ``__post_init__``, flag-aware.

    Subclasses declare dataclass fields; :meth:`from_flags` builds one from the CLI's flat flag
    dictionary (keeping the fields it knows; ``flag_aliases`` maps a CLI flag to a field), and
    :meth:`to_dict` / :meth:`from_dict` serialise it (unknown keys are refused, naming them).
    """

    #: CLI flag name -> field name, where they differ.
    flag_aliases: ClassVar[dict[str, str]] = {}
    #: What the CLI's ``--noise auto`` means for this scheme (None: the flag is not used).
    noise_auto: ClassVar[str | None] = None
    #: Field -> values it had as defaults before (flat files written then carry them for every
    #: scheme): such a value is not taken as set for another scheme.
    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {}

    @classmethod
    def from_flags(cls: type[T], flags: Mapping[str, Any]) -> T:
        """The options named in ``flags`` (a flat dictionary of CLI flags); others are ignored.

        Parameters
        ----------
        flags:
            Flag name -> value, e.g. the keyword arguments of ``immersion fl run``.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for flag, value in flags.items():
            name = cls.flag_aliases.get(flag, flag)
            if name in names:
                values[name] = cls.interpret_flag(name, value)
        return cls(**values)

    @classmethod
    def cli_flags(cls) -> list[tuple[dataclasses.Field[Any], Flag]]:
        """The fields declared with :func:`option`, in field order, with their :class:`Flag`."""
        return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]

    @classmethod
    def accepted_flags(cls) -> set[str]:
        """The flag names :meth:`from_flags` takes (field names and aliases)."""
        return {f.name for f in dataclasses.fields(cls)} | set(cls.flag_aliases)

    @classmethod
    def interpret_flag(cls, name: str, value: Any) -> Any:
        """Map a CLI flag value onto the field's value: ``noise="auto"`` becomes
        :attr:`noise_auto`; every other value is kept.

        Parameters
        ----------
        name:
            The field name.
        value:
            The flag's value.
        """
        if name == "noise" and value == "auto" and cls.noise_auto is not None:
            return cls.noise_auto
        return value

    def check_engine(self, engine: str) -> None:
        """Refuse an engine these options cannot run on (every engine is fine here).

        Parameters
        ----------
        engine:
            ``"local"`` or ``"flower"``.
        """

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (tuples become lists)."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls: type[T], values: Mapping[str, Any]) -> T:
        """Options from :meth:`to_dict`'s output; unknown keys raise, naming them.

        Parameters
        ----------
        values:
            Field name -> value.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise InvalidArgumentError(
                "options", f"{cls.__name__} has no {unknown}; known: {sorted(names)}"
            )
        return cls(**dict(values))


def check_switch(name: str, value: Any) -> None:
    """Refuse a noise switch other than ``"on"``/``"off"`` (MP-DP and seed 001's schemes).

    Parameters
    ----------
    name:
        The option name for the error.
    value:
        The value to check.
    """
    if value not in ("on", "off"):
        raise InvalidArgumentError(name, f"expected 'on' or 'off', got {value!r}")


def check_int(name: str, value: Any, low: int) -> None:
    """Refuse a value that is not an integer ``>= low``.

    Parameters
    ----------
    name:
        The option name for the error.
    value:
        The value to check.
    low:
        The smallest accepted value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InvalidArgumentError(name, f"expected an integer >= {low}, got {value!r}")


def check_real(
    name: str, value: Any, *, low: float, high: float = float("inf"), open_low: bool = True
) -> None:
    """Refuse a value that is not a finite real in ``(low, high)`` (``[low, high)`` if not
    ``open_low``).

    Parameters
    ----------
    name:
        The option name for the error.
    value:
        The value to check.
    low, high:
        The bounds.
    open_low:
        Whether ``low`` itself is refused.
    """
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok:
        ok = (value > low if open_low else value >= low) and value < high
    if not ok:
        bracket = "(" if open_low else "["
        raise InvalidArgumentError(
            name, f"expected a finite value in {bracket}{low:g}, {high:g}), got {value!r}"
        )


@dataclass(frozen=True)
class NoOptions(SchemeOptions):
    """A scheme without options (plain FedAvg)."""


#: The ways of splitting the data among the clients
#: (:func:`immersion_fl.runtime.data.split_clients`).
SPLITS = ("iid", "dirichlet")
#: Client timeouts must stay below this (the largest wait ``threading`` accepts, included).
TIMEOUT_LIMIT = math.nextafter(threading.TIMEOUT_MAX, math.inf)

#: The common fields (what every scheme shares), in order.
COMMON_FIELDS = (
    "scheme",
    "optimizer",
    "lr",
    "model",
    "hidden",
    "clients",
    "rounds",
    "local_epochs",
    "batch_size",
    "dataset",
    "split",
    "alpha",
    "seed",
    "compare_plain",
    "client_timeout",
)


@dataclass(frozen=True)
class RunConfig:
    """A federated run of the SDK's runner (``immersion fl run``): what every scheme shares, plus
    ``options``, the scheme's own (defaults: the scheme's option class with its defaults).

    Parameters
    ----------
    scheme:
        A registered scheme name (``immersion plugins``).
    optimizer, lr:
        The clients' local optimizer (a registered name) and its learning rate.
    model, hidden:
        The SDK model name (``linear``, ``mlp``, ``cnn``, ``cnn2``) and MLP hidden sizes.
    clients, rounds, local_epochs, batch_size:
        Federation size, rounds, local epochs per round and mini-batch size.
    dataset, split, alpha:
        Dataset name, ``iid`` or ``dirichlet`` split, and the Dirichlet concentration.
    seed:
        Seeds keys, noise, initial weights, split and batch order.
    compare_plain:
        Run the scheme's plain reference in lockstep with the same batches.
    client_timeout:
        Seconds a client may take before it is left out of a round (None: no limit).
    options:
        The scheme's own options (e.g. :class:`~immersion_fl.schemes.SiflOptions`).

    Examples
    --------
    >>> from immersion_fl.schemes import SiflOptions
    >>> cfg = RunConfig(scheme="sifl-m1", options=SiflOptions(epsilon_local=2.0))
    >>> RunConfig.from_json(cfg.to_json()) == cfg
    True
    >>> RunConfig.from_flat({"scheme": "sifl-m2", "p": 3, "graph": "complete"}).options.p
    3
    """

    scheme: str = "sifl-m1"
    optimizer: str = "sgd"
    lr: float = 0.05
    model: str = "mlp"
    hidden: tuple[int, ...] = (200, 200)
    clients: int = 10
    rounds: int = 5
    local_epochs: int = 1
    batch_size: int = 32
    dataset: str = "digits"
    split: str = "iid"
    alpha: float = 0.5
    seed: int = 0
    compare_plain: bool = True
    client_timeout: float | None = None
    options: SchemeOptions = dataclasses.field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        expected = options_class(self.scheme)
        if self.options is None:
            object.__setattr__(self, "options", expected())
        elif type(self.options) is not expected:
            raise InvalidArgumentError(
                "options",
                f"scheme {self.scheme!r} takes {expected.__name__}, "
                f"got {type(self.options).__name__}",
            )
        self._check_common()

    def _check_common(self) -> None:
        """Refuse a bad common field, naming it. ``optimizer``, ``model`` and ``dataset`` are
        names resolved where the run starts (the optimizer and model registries, import paths):
        here they need only be non-empty strings."""
        for name in ("optimizer", "model", "dataset"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidArgumentError(name, f"expected a non-empty name, got {value!r}")
        check_real("lr", self.lr, low=0.0)
        if isinstance(self.hidden, (str, bytes)) or not isinstance(self.hidden, (tuple, list)):
            raise InvalidArgumentError(
                "hidden", f"expected a sequence of layer sizes, got {self.hidden!r}"
            )
        object.__setattr__(self, "hidden", tuple(self.hidden))
        for size in self.hidden:
            check_int("hidden", size, 1)
        for name in ("clients", "rounds", "local_epochs", "batch_size"):
            check_int(name, getattr(self, name), 1)
        if self.split not in SPLITS:
            raise InvalidArgumentError("split", f"expected one of {SPLITS}, got {self.split!r}")
        check_real("alpha", self.alpha, low=0.0)
        check_int("seed", self.seed, 0)
        if not isinstance(self.compare_plain, (bool, np.bool_)):
            raise InvalidArgumentError(
                "compare_plain", f"expected True or False, got {self.compare_plain!r}"
            )
        if self.client_timeout is not None:
            check_real("client_timeout", self.client_timeout, low=0.0, high=TIMEOUT_LIMIT)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with ``changes`` (common fields or ``options``).

        Parameters
        ----------
        **changes:
            Field name -> new value.
        """
        return dataclasses.replace(self, **changes)

    def common(self) -> dict[str, Any]:
        """The common fields as JSON-ready values."""
        return {
            k: list(v) if isinstance(v, tuple) else v
            for k, v in ((name, getattr(self, name)) for name in COMMON_FIELDS)
        }

    def to_json(self) -> str:
        """The configuration as format-2 JSON (keys sorted: equal configurations, equal text)."""
        blob = {"format": CONFIG_FORMAT, "run": self.common(), "options": self.options.to_dict()}
        return json.dumps(blob, sort_keys=True)

    @classmethod
    def from_json(cls, blob: str) -> "RunConfig":
        """Read :meth:`to_json`'s output, or migrate a format-1 (flat) configuration.

        Parameters
        ----------
        blob:
            The JSON text.
        """
        raw = json.loads(blob)
        if not isinstance(raw, dict):
            raise InvalidArgumentError(
                "config", f"expected a JSON object, got {type(raw).__name__}"
            )
        if "format" not in raw:
            return cls.from_format1(raw)
        if raw["format"] != CONFIG_FORMAT:
            raise InvalidArgumentError("config", f"unknown configuration format {raw['format']!r}")
        run = dict(raw["run"])
        run["hidden"] = tuple(run.get("hidden", ()))
        return cls(**run, options=options_class(run["scheme"]).from_dict(raw["options"]))

    @classmethod
    def from_flat(cls, flags: Mapping[str, Any]) -> "RunConfig":
        """A configuration from one flat dictionary: the CLI's flags, a Flower run config, or a
        format-1 file. Common fields go to the run; the scheme's option class takes its own; a key
        that neither knows is refused, naming it.

        Parameters
        ----------
        flags:
            Field or flag name -> value (``hidden`` may be a string ``"200,200"``).
        """
        flags = dict(flags)
        run = {k: flags.pop(k) for k in COMMON_FIELDS if k in flags}
        if isinstance(run.get("hidden"), str):
            try:
                run["hidden"] = tuple(int(v) for v in run["hidden"].split(",") if v.strip())
            except ValueError:
                raise InvalidArgumentError(
                    "hidden", f"expected sizes such as '200,200', got {run['hidden']!r}"
                ) from None
        elif "hidden" in run:
            run["hidden"] = tuple(run["hidden"])
        scheme = run.get("scheme", cls.scheme)
        option_cls = options_class(scheme)
        foreign = _foreign_flags(scheme, flags)
        if foreign:
            flag, users = next(iter(foreign.items()))
            raise InvalidArgumentError(
                flag, f"applies to {', '.join(users)}, not to scheme {scheme!r}"
            )
        return cls(**run, options=option_cls.from_flags(flags))

    @classmethod
    def from_format1(cls, flat: Mapping[str, Any]) -> "RunConfig":
        """Migrate a format-1 configuration: one flat dictionary of every field (what checkpoints
        held before the scheme options were split off).

        The code that wrote such a file ignored the fields of other schemes (``epsilon`` or
        ``grad_clip`` of a SIFL run): set to other than their defaults, they are dropped here with
        a :class:`LegacyConfigWarning` naming them, where :meth:`from_flat` (new input) refuses
        them. Unknown keys are refused in both.

        Parameters
        ----------
        flat:
            Field name -> value, as the file holds them.
        """
        flags = dict(flat)
        scheme = flags.get("scheme", cls.scheme)
        options_class(scheme)  # an unknown scheme is refused, naming it
        foreign = _foreign_flags(scheme, {k: v for k, v in flags.items() if k not in COMMON_FIELDS})
        if foreign:
            dropped = ", ".join(
                f"{flag}={flags.pop(flag)!r} ({'/'.join(users)})" for flag, users in foreign.items()
            )
            warnings.warn(
                f"format-1 configuration of scheme {scheme!r}: dropped the fields of other "
                f"schemes, which that version ignored: {dropped}",
                LegacyConfigWarning,
                stacklevel=2,
            )
        return cls.from_flat(flags)


class LegacyConfigWarning(UserWarning):
    """A format-1 configuration held values this version drops (:meth:`RunConfig.from_format1`)."""


def _foreign_flags(scheme: str, flags: Mapping[str, Any]) -> dict[str, list[str]]:
    """The flags in ``flags`` that ``scheme``'s options do not take but set away from the
    defaults of the schemes that do, each with those schemes' names (unknown flags raise)."""
    owners = flag_owners()
    unknown = sorted(set(flags) - set(owners))
    if unknown:
        raise InvalidArgumentError("config", f"unknown keys {unknown}")
    own = options_class(scheme).accepted_flags()
    foreign: dict[str, list[str]] = {}
    for flag, value in flags.items():
        if flag not in own and any(_sets_option(owner, flag, value) for owner in owners[flag]):
            foreign[flag] = sorted(
                name for name, spec in _schemes().items() if options_class_of(spec) in owners[flag]
            )
    return foreign


def options_class(scheme: str) -> type[SchemeOptions]:
    """The option class the registered ``scheme`` owns (refuses unknown schemes, naming them).

    Parameters
    ----------
    scheme:
        A registered scheme name.
    """
    from .registry import fl_registry

    if not isinstance(scheme, str):
        raise InvalidArgumentError("scheme", f"expected a scheme name, got {scheme!r}")
    return options_class_of(fl_registry().fl_scheme(scheme))


def options_class_of(spec: SchemeSpec) -> type[SchemeOptions]:
    """``spec.options``, refused (naming the scheme) unless it derives from SchemeOptions.

    Parameters
    ----------
    spec:
        A registered scheme.
    """
    cls = spec.options
    if not (isinstance(cls, type) and issubclass(cls, SchemeOptions)):
        from immersion.errors import PluginError

        raise PluginError(f"scheme {spec.name!r}: options must derive from SchemeOptions")
    return cls


def _schemes() -> dict[str, SchemeSpec]:
    from .registry import fl_registry

    return fl_registry().fl_schemes


def flag_owners() -> dict[str, list[type[SchemeOptions]]]:
    """Every flag some registered scheme's options accept, with the option classes that take it."""
    out: dict[str, list[type[SchemeOptions]]] = {}
    for spec in _schemes().values():
        owner = options_class_of(spec)
        for flag in owner.accepted_flags():
            if owner not in out.setdefault(flag, []):
                out[flag].append(owner)
    return out


def _sets_option(owner: type[SchemeOptions], flag: str, value: Any) -> bool:
    """Whether ``flag=value`` differs from ``owner``'s default (a flag meant for another scheme)."""
    name = owner.flag_aliases.get(flag, flag)
    default = next(f.default for f in dataclasses.fields(owner) if f.name == name)
    value = owner.interpret_flag(name, value)
    return value != default and value not in owner.former_defaults.get(name, ())
