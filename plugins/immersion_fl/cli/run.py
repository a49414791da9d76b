"""``immersion fl``: the group and ``immersion fl run``, whose options are the shared ones of
:mod:`.options` and the flags of every registered scheme's options (:func:`run_command`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import click
from immersion.cli.params import json_safe

from ..registry import FlRegistry, fl_registry
from .options import RUN_CONTROLS, RUN_FIELDS, scheme_options, shared_option

#: What the float figures mean (printed under them; docs/tutorials/federated_learning.md,
#: "What exactness means").
EXACTNESS_NOTE = (
    "one_step_error: the decoded aggregate against the weighted average of the same round's local "
    "models. diff_vs_plain: the whole trajectory against plain FedAvg, which training (Adam above "
    "all) amplifies from any 1e-16 difference; reference_drift is plain FedAvg against itself with "
    "its uploads summed in another order. --arithmetic modular decodes bit for bit."
)

#: The figures printed without --json (the first four and the time figures for every scheme).
SUMMARY_KEYS = [
    "scheme",
    "optimizer",
    "model",
    "n_params",
    "n_encoded",
    "key_bytes",
    "max_abs_diff_vs_plain",
    "accuracy",
    "accuracy_plain",
    "round_time_ratio",
    "setup_s",
    "epsilon_local",
    "epsilon_global",
    "one_step_error_max",
    "reference_drift_max",
]
#: MP-DP's figures (seed 004) after the common ones.
MPDP_KEYS = [
    "upload_bytes_ratio",
    "noise",
    "epsilon",
    "delta",
    "epsilon_total",
    "delta_total",
    "sensitivity_assumed",
    "sensitivity_observed_max",
]


@click.group("fl")
def fl_group() -> None:
    """Federated learning: immersion (seeds 000, 003) and model perturbation (seed 004,
    --scheme mpdp)."""


def fl_run(
    plot_dir: Path | None,
    as_json: bool,
    engine: str,
    inject: tuple[str, ...],
    checkpoint: Path | None,
    resume: bool,
    reference_drift: bool,
    **flags: Any,
) -> None:
    """Train a model federatedly with a SIFL scheme beside plain FedAvg, or with mpdp beside plain
    FedSGD.

    \b
    Times reported (seconds; the plain twin runs the same clients and batches):
      setup_s            one-time set-up before round 1 (keys drawn, noise calibrated,
                         clients built); in no round
      first_round_s      round 1 alone (it also pays first-use costs)
      round_s_median     steady state: median over rounds 2..R (round 1 if R = 1)
      round_time_ratio   steady state: scheme / plain twin, medians over rounds 2..R
    \f

    Parameters
    ----------
    plot_dir, as_json:
        ``--plot`` and ``--json``: where to write the figures, and one JSON object for the text.
    engine:
        ``local`` or ``flower``.
    inject:
        ``--inject-fault`` values (:meth:`~immersion_fl.runtime.faults.FaultPlan.parse`).
    checkpoint, resume:
        Where to save each round, and whether to continue the run saved there.
    reference_drift:
        Also run FedAvg summing its uploads in reverse order (with ``compare_plain``).
    **flags:
        The run's configuration: the shared fields and the schemes' flags
        (:meth:`~immersion_fl.config.RunConfig.from_flat`).
    """
    from ..runtime.engine import EveryClientFailedError, RunConfig, progress_bar, run_federated
    from ..runtime.faults import FaultPlan

    # a flag left at None (no default, or schemes that default differently) takes the scheme's
    cfg = RunConfig.from_flat({k: v for k, v in flags.items() if v is not None})
    if engine == "flower" and (checkpoint or resume):
        raise click.UsageError("--checkpoint/--resume work with --engine local")
    try:
        result = run_federated(
            cfg,
            engine=engine,
            progress=progress_bar(cfg.rounds),
            faults=FaultPlan.parse(inject),
            checkpoint=checkpoint,
            resume=resume,
            reference_drift=reference_drift and cfg.compare_plain,
        )
    except EveryClientFailedError as exc:  # e.g. an --lr so large that training diverges
        raise click.ClickException(
            f"{exc} (see the reasons above; check --lr, --clip, --epsilon-local, --client-timeout)"
        ) from None
    out = result.summary()
    out["engine"] = engine
    if plot_dir is not None:
        from .plots import write_fl_plots

        out["plots"] = [str(p) for p in write_fl_plots(result, plot_dir)]
    if as_json:  # strict JSON: an infinite epsilon (no noise) is null
        click.echo(json.dumps(json_safe(out)))
        return
    for key in summary_keys(out):
        click.echo(f"  {key:28s} {out.get(key)}")
    if out.get("one_step_error_max") is not None and out.get("arithmetic") == "float":
        click.echo(f"  {EXACTNESS_NOTE}")
    for p in out.get("plots", []):
        click.echo(f"  plot: {p}")


def summary_keys(out: dict[str, Any]) -> list[str]:
    """The figures of ``out`` (a run's summary) that ``fl run`` prints without ``--json``.

    Parameters
    ----------
    out:
        :meth:`RunResult.summary() <immersion_fl.runtime.engine.RunResult.summary>`'s output.
    """
    keys = list(SUMMARY_KEYS)
    if out.get("arithmetic") == "modular":
        keys += ["arithmetic", "max_abs_diff_vs_float_fedavg"]
    if out.get("scheme") == "mpdp":
        return keys[:4] + keys[6:11] + MPDP_KEYS
    if "sigma2" in out:  # seed 001's schemes
        return keys[:4] + keys[7:11] + ["epsilon", "delta", "alpha", "sigma2", "accountant"]
    return keys


def run_command(fl: FlRegistry) -> click.Command:
    """``immersion fl run`` for the schemes and optimizers in ``fl``: the shared options, then
    every scheme's flags (:func:`~immersion_fl.cli.options.scheme_options`), then the run's
    controls.

    Parameters
    ----------
    fl:
        The registered schemes and optimizers (:func:`~immersion_fl.registry.fl_registry`).
    """
    choices = {
        "scheme": click.Choice(sorted(fl.fl_schemes)),
        "optimizer": click.Choice(sorted(fl.optimizers)),
    }
    params = [
        *(
            shared_option(name, **({"type": choices[name]} if name in choices else {}))
            for name in RUN_FIELDS
        ),
        *scheme_options(fl.fl_schemes.values()),
        *(shared_option(name) for name in RUN_CONTROLS),
    ]
    return click.Command("run", callback=fl_run, params=params, help=inspect.getdoc(fl_run))


fl_group.add_command(run_command(fl_registry()))
