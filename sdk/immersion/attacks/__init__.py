"""Attacks run by ``immersion audit`` against the core ``immerse(f, g)`` (scheme ``"immerse"``).

:mod:`.eavesdropper`: an eavesdropper on the user-cloud link who collects many encoded inputs
``y~_k = Pi1 y_k + N1 s_k`` under one key (seed 002 eq. 16): the ``subspace`` attack (PCA) and the
``known-plaintext`` attack (least squares on a few pairs), each measured without and with key
rotation (:mod:`immersion.rotation`).
"""

from .eavesdropper import (
    aligned_recovery,
    known_plaintext_attack,
    relative_error,
    run_known_plaintext,
    run_subspace,
    subspace_attack,
)
from .specs import attack_specs

__all__ = [
    "subspace_attack",
    "known_plaintext_attack",
    "aligned_recovery",
    "relative_error",
    "run_subspace",
    "run_known_plaintext",
    "attack_specs",
]
