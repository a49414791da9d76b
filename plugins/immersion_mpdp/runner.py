"""``run_mpdp``: MP-DP on the in-process engine or on Flower (the scheme's registered runner).

The two engines share the round logic of :mod:`immersion_mpdp.engine`; the Flower engine
(:mod:`immersion_mpdp.flower_engine`) imports it, and this module picks one of them, so neither
engine imports the other.
"""

from __future__ import annotations

from typing import Callable

from immersion import InvalidArgumentError
from immersion_fl.runtime.engine import FederatedTask, RunConfig
from immersion_fl.runtime.faults import FaultPlan

from .engine import MpdpResult, run_local, validate


def run_mpdp(
    cfg: RunConfig,
    *,
    engine: str = "local",
    progress: Callable[[str], None] | None = None,
    faults: FaultPlan | None = None,
    task: FederatedTask | None = None,
) -> MpdpResult:
    """Train ``cfg`` with MP-DP beside plain FedSGD (same batches, same survivors every round).

    Parameters
    ----------
    cfg : RunConfig
        The run (``scheme="mpdp"``, :class:`immersion_mpdp.options.MpdpOptions`).
    engine : {"local", "flower"}
        In this process, or Flower's simulation runtime (one virtual node per client).
    progress : callable, optional
        Called with one line per round.
    faults : FaultPlan, optional
        Clients made to fail on purpose.
    task : FederatedTask, optional
        A user's bias-free ReLU MLP and data (local engine only).

    Returns
    -------
    MpdpResult
        The run's figures and final weights.
    """
    if engine not in ("local", "flower"):
        raise InvalidArgumentError("engine", f"expected 'local' or 'flower', got {engine!r}")
    if engine == "local":
        return run_local(cfg, progress=progress, faults=faults, task=task)
    validate(cfg, task)
    if task is not None:
        raise InvalidArgumentError(
            "engine",
            "mpdp's Flower engine builds its clients from the SDK's datasets; "
            "run a user's model and data with engine='local'",
        )
    from .flower_engine import run_flower

    return run_flower(cfg, progress=progress, faults=faults or FaultPlan())
