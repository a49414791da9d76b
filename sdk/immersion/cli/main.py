"""Command-line interface: ``immersion ...`` and ``python -m immersion ...`` (click).

``--json`` always prints exactly one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .. import __version__
from ..errors import ImmersionError
from .bench import bench
from .groups import CommandGroup
from .keys import keys_group, report_cmd
from .serve import remote_group, serve_cmd


@click.group(cls=CommandGroup)
@click.version_option(__version__, prog_name="immersion")
def main() -> None:
    """Privacy in cloud computing through immersion-based coding."""


@main.group(cls=CommandGroup)
def demo() -> None:
    """Runnable demos (added by plugins)."""


@main.command("audit")
@click.option(
    "--scheme", default=None, help="Only attacks on this scheme (e.g. immerse, sifl-m1, mpdp)."
)
@click.option("--attack", default=None, help="Only this attack (e.g. subspace).")
@click.option("--quick", is_flag=True, help="Smaller settings (a smoke run).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def audit_cmd(
    scheme: str | None, attack: str | None, quick: bool, seed: int, as_json: bool
) -> None:
    """Run the known attacks against each scheme and report what they measure (THREAT_MODEL.md)."""
    from ..audit.runner import run_audit

    result = run_audit(
        scheme=scheme,
        attack=attack,
        quick=quick,
        seed=seed,
        progress=lambda msg: click.echo(f"[audit] {msg}", err=True),
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    header = ("attack", "scheme", "mitigation", "metric", "value", "baseline", "verdict")
    click.echo(" | ".join(header))
    for r in result["attacks"]:
        click.echo(
            f"{r['attack']} | {r['scheme']} | {r['mitigation'] or '-'} | {r['metric']} | "
            f"{r['value']:.4g} | {r['baseline']:.4g} | {r['verdict']}"
        )


@main.command("docs")
@click.option(
    "--source", type=click.Path(path_type=Path), default=None, help="The folder of conf.py."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Where the HTML goes [default: SOURCE/_build/html].",
)
@click.option("--no-open", is_flag=True, help="Build only; do not open a browser.")
def docs_cmd(source: Path | None, out: Path | None, no_open: bool) -> None:
    """Build the documentation site (warnings are errors) and open it in a browser."""
    import webbrowser

    from .docsite import build_docs, find_docs_source

    folder = find_docs_source(source)
    index = build_docs(folder, out if out is not None else folder / "_build" / "html")
    click.echo(str(index))
    if not no_open:
        webbrowser.open(index.resolve().as_uri())


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plugins_cmd(as_json: bool) -> None:
    """List registered plugins, backends, algorithms and commands."""
    from ..plugins.manager import registry

    reg = registry()
    info = {
        "plugins": reg.plugin_names(),
        "backends": {k: s.description for k, s in sorted(reg.backends.items())},
        "algorithms": {k: s.description for k, s in sorted(reg.algorithms.items())},
        **{  # registrations of plugins' own hooks: immersion_fl's fl_schemes and optimizers
            hook.removeprefix("immersion_register_"): {
                k: s.description for k, s in sorted(reg.collect(hook, hook).items())
            }
            for hook in reg.plugin_hooks()
        },
        "commands": sorted(f"{c.parent} {c.name}".strip() for c in reg.commands()),
    }
    if as_json:
        click.echo(json.dumps(info))
        return
    for section, items in info.items():
        click.echo(f"{section}:")
        for item in items.items() if isinstance(items, dict) else ((i, "") for i in items):
            click.echo(f"  {item[0]:24s} {item[1]}")


for _command in (bench, serve_cmd, remote_group, report_cmd, keys_group):
    main.add_command(_command)


def _mount_plugin_commands() -> None:
    from ..plugins.manager import registry

    groups = {"": main, "demo": demo, "bench": bench, "keys": keys_group}
    try:
        specs = registry().commands()
    except ImmersionError as exc:  # a broken plugin must not take the whole CLI down
        print(f"warning: plugin commands unavailable: {exc}", file=sys.stderr)
        return
    for spec in specs:
        parent = groups.get(spec.parent)
        if parent is None:
            parent = groups[spec.parent] = click.Group(spec.parent, help=f"{spec.parent} commands")
            main.add_command(parent)
        parent.add_command(spec.command, spec.name)


_mount_plugin_commands()
