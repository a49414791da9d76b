"""``immersion keys flower``: TLS certificates and SuperNode keys for a Flower deployment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


@click.command("flower")
@click.option(
    "--out",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the files (created 0700 if missing).",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="A name or address the SuperLink is dialled at (repeat); makes a CA and its certificate.",
)
@click.option("--node", "nodes", multiple=True, help="A SuperNode key pair NAME (repeat).")
@click.option("--overwrite", is_flag=True, help="Replace existing files.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def keys_flower(
    folder: Path, hosts: tuple[str, ...], nodes: tuple[str, ...], overwrite: bool, as_json: bool
) -> None:
    """TLS certificates and SuperNode keys for a Flower deployment (extra: fl), files mode 0600."""
    from ..flower.tls import write_node_key, write_tls_certificates

    if not hosts and not nodes:
        raise click.UsageError("give --host (TLS certificates) and/or --node (SuperNode keys)")
    info: dict[str, Any] = {}
    if hosts:
        info.update(
            {
                k: str(v)
                for k, v in write_tls_certificates(folder, list(hosts), overwrite=overwrite).items()
            }
        )
    for name in nodes:
        private, public = write_node_key(folder, name, overwrite=overwrite)
        info[name] = {"private": str(private), "public": str(public)}
    click.echo(json.dumps(info) if as_json else "\n".join(f"{k:15s} {v}" for k, v in info.items()))
