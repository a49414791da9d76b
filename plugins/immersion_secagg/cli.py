"""``immersion dp secagg``: the DP the secure-aggregation sum gives (seed 001 Theorems 2, 4)."""

from __future__ import annotations

import json
import math

import click
from immersion.cli.params import FiniteFloatRange


@click.group("dp")
def dp_group() -> None:
    """Differential-privacy accountants."""


@dp_group.command("secagg")
@click.option(
    "--theorem",
    type=click.Choice(["2", "4"]),
    required=True,
    help="2: Gaussian-sampling updates alone (eq. 19); 4: plus WF-NA noise (eq. 35).",
)
@click.option(
    "--users", type=click.IntRange(1), required=True, help="N, users whose updates are summed."
)
@click.option("--samples", type=click.IntRange(1), required=True, help="D, records per user.")
@click.option(
    "--batch",
    type=click.IntRange(1),
    required=True,
    help="B, the covariance scale of Gaussian sampling.",
)
@click.option(
    "--clip",
    type=FiniteFloatRange(min=0, min_open=True),
    required=True,
    help="C, per-example clip norm.",
)
@click.option("--delta", type=FiniteFloatRange(0, 1, min_open=True, max_open=True), required=True)
@click.option(
    "--rounds",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="T (RDP adds over rounds).",
)
@click.option(
    "--lambda-min",
    "lambda_min",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Theorem 2: a lower bound on every user's lambda_min(G G^T / D); Lambda = N * this.",
)
@click.option(
    "--lambda-sum",
    "lambda_sum",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Theorem 2: Lambda, the sum over users of lambda_min(G_i G_i^T / D).",
)
@click.option(
    "--sigma2",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Theorem 4: the WF-NA eigenvalue floor sigma^2 on G G^T / (B D).",
)
@click.option(
    "--strict-range",
    is_flag=True,
    help="Theorem 4: the paper's stated range alpha < N D sigma^2 / (2 C^2).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def secagg(
    theorem: str,
    users: int,
    samples: int,
    batch: int,
    clip: float,
    delta: float,
    rounds: int,
    lambda_min: float | None,
    lambda_sum: float | None,
    sigma2: float | None,
    strict_range: bool,
    as_json: bool,
) -> None:
    """(epsilon, delta) of the secure-aggregation sum for one record of one user (replacement)."""
    from .accountant import Setting, guarantee, rdp_theorem2, rdp_theorem4

    s = Setting(users, samples, batch, clip)
    if theorem == "2":
        if sigma2 is not None or (lambda_min is None) == (lambda_sum is None):
            raise click.UsageError(
                "--theorem 2 needs exactly one of --lambda-min or --lambda-sum (and no --sigma2)"
            )
        if lambda_sum is not None:
            total = lambda_sum
        else:
            assert lambda_min is not None  # exactly one of the two, checked above
            total = users * float(lambda_min)
        result = guarantee("2", s, delta, rounds=rounds, min_eig_sum=total)
        rdp2 = rdp_theorem2(2.0, s, total)
        extra = {"lambda_sum": total}
    else:
        if sigma2 is None or lambda_min is not None or lambda_sum is not None:
            raise click.UsageError("--theorem 4 needs --sigma2 (and no --lambda-min/--lambda-sum)")
        result = guarantee("4", s, delta, rounds=rounds, sigma2=sigma2, strict_range=strict_range)
        rdp2 = rdp_theorem4(2.0, s, sigma2, strict_range=strict_range)
        extra = {"sigma2": sigma2, "strict_range": strict_range}
    out = {
        "theorem": theorem,
        "epsilon": result.epsilon,
        "delta": delta,
        "alpha": result.alpha,
        "alpha_max": result.alpha_max,
        "rounds": rounds,
        "rdp_at_alpha2": rdp2,
        "users": users,
        "samples": samples,
        "batch": batch,
        "clip": clip,
        **extra,
    }
    if not math.isfinite(result.epsilon):
        out["note"] = (
            "no guarantee: the valid range of alpha is empty or the bound is infinite there"
        )
    safe = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()
    }  # JSON has no inf
    if as_json:
        click.echo(json.dumps(safe))
        return
    for key, value in safe.items():
        click.echo(f"  {key:16s} {value}")
