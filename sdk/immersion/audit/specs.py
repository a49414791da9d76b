"""The audit's registrations of the core attacks: each attack runs on the float and the modular
arithmetic of ``immerse`` (registered by :mod:`immersion.plugins.builtin`).

This module sits above both variants (:mod:`.eavesdropper` for float, :mod:`.modular`, which
reuses the eavesdropper's cases and verdicts), so neither imports the other back.
"""

from __future__ import annotations

from typing import Callable

from ..plugins.hookspecs import AttackSpec
from . import modular
from .eavesdropper import SCHEME, run_known_plaintext, run_subspace
from .runner import AttackResult


def _both(
    float_run: Callable[..., list[AttackResult]], modular_run: Callable[..., list[AttackResult]]
) -> Callable[..., list[AttackResult]]:
    """Rows of ``float_run`` followed by those of ``modular_run``."""

    def run(quick: bool = False, seed: int = 0) -> list[AttackResult]:
        return [*float_run(quick=quick, seed=seed), *modular_run(quick, seed)]

    return run


def attack_specs() -> list[AttackSpec]:
    """The two attacks, on float and modular arithmetic (registered by
    :mod:`immersion.plugins.builtin`)."""
    return [
        AttackSpec(
            "subspace",
            (SCHEME, modular.SCHEME),
            _both(run_subspace, modular.run_subspace_modular),
            "eavesdropper: PCA on many y~ under one key removes the noise subspace range(N1); "
            "modular: PCA and lattice reduction (LLL) on the stream",
        ),
        AttackSpec(
            "known-plaintext",
            (SCHEME, modular.SCHEME),
            _both(run_known_plaintext, modular.run_known_plaintext_modular),
            "eavesdropper: n_input + extra_input known (y, y~) pairs give Pi1_left (least squares; "
            "modular: elimination modulo 2^64)",
        ),
    ]
