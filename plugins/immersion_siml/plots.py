"""SIML figures: one sample before and after encoding (seed 002 Fig. 2), accuracy per epoch
(Fig. 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    from immersion.plotting import pyplot

    return pyplot("SIML plots")


def write_siml_plots(result: Any, folder: Path) -> list[Path]:
    """Write ``siml_sample.png`` (Fig. 2) and ``siml_accuracy.png`` (Fig. 3); return their paths."""
    import numpy as np

    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    size = result.sample_original.size
    side = int(round(np.sqrt(size)))
    shape = (side, side) if side * side == size else (1, size)  # an image, or a row of features
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.4))
    for ax, image, title in (
        (axes[0], result.sample_original, "original sample"),
        (
            axes[1],
            result.sample_encoded,
            f"encoded (first {result.sample_encoded.size} of {result.n_sample_encoded} entries)",
        ),
    ):
        aspect = "equal" if shape[0] > 1 else "auto"
        shown = ax.imshow(np.asarray(image).reshape(shape), cmap="gray", aspect=aspect)
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        fig.colorbar(shown, ax=ax, fraction=0.046)
    fig.suptitle(
        f"{result.dataset}: epsilon_data = {result.privacy['epsilon_data']:.3g} per element",
        fontsize=10,
    )
    fig.tight_layout()
    sample_path = folder / "siml_sample.png"
    fig.savefig(sample_path, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    epochs = list(range(1, len(result.accuracy_curve) + 1))
    ax.plot(epochs, result.accuracy_curve, "o-", label=f"SIML (target {result.plan.optimizer})")
    if result.accuracy_curve_plain:
        ax.plot(epochs, result.accuracy_curve_plain, "x--", label=f"plain {result.plan.optimizer}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(
        f"{result.model} on {result.dataset}: "
        f"max |w_SIML - w_plain| = {result.max_abs_diff_vs_plain:.1e}",
        fontsize=10,
    )
    ax.legend()
    fig.tight_layout()
    curve_path = folder / "siml_accuracy.png"
    fig.savefig(curve_path, dpi=110)
    plt.close(fig)
    return [sample_path, curve_path]
