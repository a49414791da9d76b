"""MP-DP's own options (seed 004), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from immersion import InvalidArgumentError
from immersion_fl.config import SchemeOptions, check_real, check_switch

from .agreement import parse_graph


@dataclass(frozen=True)
class MpdpOptions(SchemeOptions):
    """Options of ``mpdp`` (model perturbation + distributed DP noise, seed 004).

    Parameters
    ----------
    noise:
        ``"on"`` (DDP noise calibrated to ``epsilon``, ``delta``) or ``"off"`` (the conformance
        setting: the run reproduces plain FedSGD round by round).
    epsilon, delta:
        Per-round ``(epsilon, delta)`` of the distributed noise (Eq. 23).
    graph:
        Neighbour graph of the pairwise noise: ``"complete"`` or ``"nout:N"`` (Theorems 10, 11).
    mask_corrections:
        The server sees only the sum of Psi and Phi (off: the paper's clear upload).
    sensitivity:
        Assumed per-record sensitivity (the paper's ``S_f = 1``; runs report the observed one).
    correction_words:
        64-bit words per masked correction: 1 (half the keystream and upload; range ``2^24 /
        K``, resolution ``2^-38``; the in-process engine retries a round that does not fit with
        2) or 2 (range ``2^42 / K``, resolution ``2^-60``). See :mod:`immersion.securesum`.

    Examples
    --------
    >>> MpdpOptions.from_flags({"noise": "auto", "graph": "nout:2", "p": 2}).graph
    'nout:2'
    """

    noise_auto: ClassVar[str | None] = "on"

    noise: str = "on"
    epsilon: float = 1.0
    delta: float = 1e-5
    graph: str = "complete"
    mask_corrections: bool = True
    sensitivity: float = 1.0
    correction_words: int = 1

    def __post_init__(self) -> None:
        check_switch("noise", self.noise)
        check_real("epsilon", self.epsilon, low=0.0)
        check_real("delta", self.delta, low=0.0, high=0.5)
        check_real("sensitivity", self.sensitivity, low=0.0)
        if not isinstance(self.graph, str):
            raise InvalidArgumentError(
                "graph", f"expected 'complete' or 'nout:N', got {self.graph!r}"
            )
        parse_graph(self.graph)
        if isinstance(self.correction_words, bool) or self.correction_words not in (1, 2):
            raise InvalidArgumentError(
                "correction_words", f"expected 1 or 2, got {self.correction_words!r}"
            )
        if not isinstance(self.mask_corrections, bool):
            raise InvalidArgumentError(
                "mask_corrections", f"expected True or False, got {self.mask_corrections!r}"
            )
