"""Accuracy and loss per round, scheme beside plain FedAvg (seed 000 Figs. 2-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_fl_plots(result: Any, folder: Path) -> list[Path]:
    """Write ``accuracy.png`` and ``loss.png``; return their paths.

    Parameters
    ----------
    result:
        A run's result with per-round ``accuracy``, ``loss`` and their ``_plain`` twins
        (:class:`~immersion_fl.runtime.engine.RunResult` or a scheme runner's own).
    folder:
        Where to write (created).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    rounds = list(range(1, len(result.accuracy) + 1))
    paths = []
    for metric, ylabel in (("accuracy", "test accuracy"), ("loss", "test loss")):
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(rounds, getattr(result, metric), "o-", label=result.config.scheme)
        plain = getattr(result, f"{metric}_plain")
        if plain:
            ax.plot(rounds, plain, "x--", label=getattr(result, "plain_name", "fedavg (plain)"))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(
            f"{result.config.model}, {result.config.optimizer}, {result.config.clients} clients"
        )
        ax.legend()
        fig.tight_layout()
        path = folder / f"{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
