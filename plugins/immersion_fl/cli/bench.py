"""``immersion bench sifl``: the paper's MLP with 10 clients, a SIFL scheme beside plain FedAvg."""

from __future__ import annotations

import json

import click
import numpy as np
from immersion.cli.params import json_safe

from ..registry import fl_registry
from .options import shared


@click.command("sifl")
@shared("rounds", default=3)
@click.option(
    "--scheme",
    type=click.Choice([s for s in sorted(fl_registry().fl_schemes) if s != "fedavg"]),
    default="sifl-m1",
    show_default=True,
)
@shared("dataset", default="digits28", help=None)
@shared(
    "local_epochs",
    default=40,
    help="40 epochs of digits' ~144 samples per client ~ one epoch of MNIST's 6000 per client.",
)
@click.option(
    "--arithmetic",
    type=click.Choice(["float", "modular"]),
    default="float",
    show_default=True,
    help="The scheme's coding: float64 (seed 000) or integers mod 2^64.",
)
@shared("as_json")
def bench_sifl(
    rounds: int, scheme: str, dataset: str, local_epochs: int, arithmetic: str, as_json: bool
) -> None:
    """The paper's 199,210-parameter MLP with 10 clients, scheme beside plain FedAvg in one run."""
    from ..runtime.engine import RunConfig, progress_bar, run_federated

    cfg = RunConfig.from_flat(
        {
            "scheme": scheme,
            "model": "mlp",
            "hidden": (200, 200),
            "clients": 10,
            "rounds": rounds,
            "dataset": dataset,
            "keys": "block",
            "local_epochs": local_epochs,
            "arithmetic": arithmetic,
        }
    )
    result = run_federated(cfg, progress=progress_bar(cfg.rounds))
    out = result.summary()
    keep = (
        "scheme",
        "arithmetic",
        "n_params",
        "n_encoded",
        "round_time_ratio",
        "key_bytes",
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "round_s_median",
    )
    out = {k: out[k] for k in keep}
    from ..runtime.engine import codec_seconds_per_round

    codec = codec_seconds_per_round(cfg)
    plain = float(np.median(result.round_s_plain))
    out.update(
        {
            "plain_round_s_median": plain,
            "codec_s_per_round": codec,
            "round_time_ratio_from_codec": (plain + codec) / plain,
        }
    )
    click.echo(
        json.dumps(json_safe(out))
        if as_json
        else "\n".join(f"  {k:24s} {v}" for k, v in out.items())
    )
