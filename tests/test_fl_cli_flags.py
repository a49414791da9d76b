"""``immersion fl run`` takes its scheme flags from the option classes the schemes register
(``immersion_fl.config.option``): a third party's scheme gets its flags without editing the CLI,
and flags that several schemes share merge into one option."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner
from immersion.errors import PluginError
from immersion.plugins.hookspecs import hookimpl
from immersion.plugins.manager import registry
from immersion_fl.cli.options import SHARED, scheme_options
from immersion_fl.cli.run import run_command
from immersion_fl.config import SchemeOptions, check_real, option
from immersion_fl.hookspecs import SchemeSpec
from immersion_fl.registry import fl_registry


@dataclass(frozen=True)
class TinyOptions(SchemeOptions):
    """A third party's scheme option: one flag, ``--tiny-rate``."""

    tiny_rate: float = option(0.5, "how much the tiny scheme does.", low=0, open_low=True)

    def __post_init__(self) -> None:
        check_real("tiny_rate", self.tiny_rate, low=0.0)


#: The options each tiny scheme was built with, in order.
BUILT: list[TinyOptions] = []


def _tiny_scheme(options: TinyOptions, context: object) -> object:
    from immersion_fl.schemes import FedAvg

    BUILT.append(options)
    return FedAvg()


class TinyPlugin:
    """What a third party's package registers through its entry point."""

    @hookimpl
    def immersion_register_fl_schemes(self) -> list[SchemeSpec]:
        return [SchemeSpec(name="tiny", options=TinyOptions, factory=_tiny_scheme)]


@pytest.fixture
def tiny_registered():
    manager = registry().manager
    plugin = TinyPlugin()
    manager.register(plugin, name="tiny-test-plugin")
    fl_registry.cache_clear()
    try:
        yield fl_registry()
    finally:
        manager.unregister(plugin)
        fl_registry.cache_clear()
        BUILT.clear()


def test_a_third_party_scheme_gets_its_flag_on_fl_run(tiny_registered):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    command = run_command(tiny_registered)
    runner = CliRunner()
    shown = runner.invoke(command, ["--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "--tiny-rate FLOAT RANGE" in shown.output
    assert "tiny: how much the tiny scheme does." in shown.output
    assert "--epsilon-local" in shown.output  # the built-in schemes' flags are still there
    args = ["--scheme", "tiny", "--tiny-rate", "0.25", "--model", "linear", "--clients", "2"]
    done = runner.invoke(command, [*args, "--rounds", "1", "--no-compare-plain", "--json"])
    assert done.exit_code == 0, done.output
    assert BUILT == [TinyOptions(tiny_rate=0.25)]
    assert json.loads(done.output.strip().splitlines()[-1])["rounds"] == 1
    # another scheme refuses the flag, naming the scheme that takes it
    refused = runner.invoke(command, ["--scheme", "fedavg", "--tiny-rate", "0.25"])
    assert refused.exit_code != 0
    assert "applies to tiny" in str(refused.exception)


def test_every_declared_option_is_a_flag_of_the_installed_fl_run():
    command = run_command(fl_registry())
    names = [p.name for p in command.params]
    assert len(names) == len(set(names))
    for spec in fl_registry().fl_schemes.values():
        for field, _ in spec.options.cli_flags():
            assert field.name in names, (spec.name, field.name)
    assert set(SHARED) <= set(names)


def _spec(name: str, options: type) -> SchemeSpec:
    return SchemeSpec(name=name, options=options, factory=lambda o, c: None)


@dataclass(frozen=True)
class _RateA(SchemeOptions):
    rate: float = option(0.1, "a's rate.", low=0, high=1.0)
    mode: str = option("x", "a's mode.", choices=("x", "y"))


@dataclass(frozen=True)
class _RateB(SchemeOptions):
    rate: float = option(0.2, "b's rate.", low=0.5, high=2.0, open_low=True)
    mode: str = option("x", "b's mode.", choices=("y", "z"))


@dataclass(frozen=True)
class _RateInt(SchemeOptions):
    rate: int = option(1, "an integer rate.")


def test_a_flag_that_two_schemes_declare_is_one_option():
    by_name = {o.name: o for o in scheme_options([_spec("a", _RateA), _spec("b", _RateB)])}
    rate, mode = by_name["rate"], by_name["mode"]
    assert rate.default is None  # the defaults differ: each scheme keeps its own
    assert rate.help == "a: a's rate. b: b's rate."
    assert (rate.type.min, rate.type.max, rate.type.min_open) == (0, 2.0, False)
    assert mode.default == "x" and list(mode.type.choices) == ["x", "y", "z"]
    assert isinstance(mode.type, click.Choice)


def test_a_flag_declared_with_two_types_is_refused_naming_it():
    with pytest.raises(PluginError, match="--rate"):
        scheme_options([_spec("a", _RateA), _spec("c", _RateInt)])


def test_a_switch_declared_with_two_defaults_is_refused_naming_it():
    @dataclass(frozen=True)
    class On(SchemeOptions):
        masked: bool = option(True, "on.")

    @dataclass(frozen=True)
    class Off(SchemeOptions):
        masked: bool = option(False, "off.")

    with pytest.raises(PluginError, match="--masked"):
        scheme_options([_spec("on", On), _spec("off", Off)])
    (switch,) = scheme_options([_spec("on", On)])
    assert switch.opts == ["--masked"] and switch.secondary_opts == ["--no-masked"]
    assert switch.default is True


def test_a_scheme_option_cannot_shadow_a_shared_one():
    @dataclass(frozen=True)
    class Shadow(SchemeOptions):
        rounds: int = option(3, "rounds again.")

    with pytest.raises(PluginError, match="shared option"):
        scheme_options([_spec("s", Shadow)])


def test_fields_without_option_stay_off_the_cli():
    from immersion_fl.schemes import SiflOptions

    flagged = {f.name for f, _ in SiflOptions.cli_flags()}
    assert "client_noise" not in flagged
    assert flagged < {f.name for f in dataclasses.fields(SiflOptions)}
