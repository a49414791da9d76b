"""MP-DP's own options (seed 004), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from immersion import InvalidArgumentError
from immersion_fl.config import SchemeOptions, check_real, check_switch, option

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
        Neighbour graph of the pairwise noise ``Delta``: ``"complete"`` (Theorem 10), ``"nout:N"``
        (Theorem 11) or ``"auto"``: Theorem 11's sparsest n-out graph where it has at most about
        44% of the complete graph's edges (from 289 clients at ``delta = 1e-5``), complete below
        (:func:`immersion_mpdp.calibration.resolve_noise_graph`).
    mask_graph:
        Neighbour graph of the masks of the corrections (no privacy theorem depends on it; it
        is drawn connected): ``"complete"``, ``"nout:N"`` or ``"auto"``: complete up to 7
        clients, ``nout:2`` above (:func:`immersion_mpdp.agreement.resolve_mask_graph`). A
        client's corrections are exposed to a server that colludes with all its mask
        neighbours: at least ``N`` of them with ``nout:N``, every other client with
        ``complete``.
    mask_corrections:
        The server sees only the sum of Psi and Phi (off: the paper's clear upload).
    sensitivity:
        Assumed per-record sensitivity (the paper's ``S_f = 1``; runs report the observed one).
    correction_words:
        64-bit words per masked correction: 1 (half the keystream and upload; range ``2^24 /
        K``, resolution ``2^-38``; both engines retry a round that does not fit with 2) or 2
        (range ``2^42 / K``, resolution ``2^-60``). See :mod:`immersion.securesum.protocol`.

    Examples
    --------
    >>> MpdpOptions.from_flags({"noise": "auto", "graph": "nout:2", "p": 2}).graph
    'nout:2'
    >>> MpdpOptions().graph, MpdpOptions().mask_graph
    ('auto', 'auto')
    """

    noise_auto: ClassVar[str | None] = "on"
    former_defaults: ClassVar[dict[str, tuple[Any, ...]]] = {"graph": ("complete",)}

    noise: str = option(
        "on", "on or off (auto: on).", choices=("auto", "on", "off"), cli_default="auto"
    )
    epsilon: float = option(1.0, "per-round epsilon (seed 004 Eq. 23).", low=0, open_low=True)
    delta: float = option(1e-5, "delta of the per-round guarantee.", low=0, high=0.5, open_low=True)
    graph: str = option(
        "auto",
        "neighbour graph for pairwise noise, auto, complete or nout:N (Theorems 10, 11; auto: "
        "n-out where Theorem 11 allows a sparse one, complete below).",
    )
    mask_graph: str = option(
        "auto",
        "neighbour graph of the masks of the corrections, auto, complete or nout:N (auto: "
        "complete up to 7 clients, nout:2 above).",
    )
    mask_corrections: bool = option(
        True, "the server sees only the sum of Psi and Phi (off: the paper's clear upload)."
    )
    sensitivity: float = option(
        1.0,
        "assumed per-record sensitivity (the paper's S_f = 1; the run reports the observed one).",
        low=0,
        open_low=True,
    )
    correction_words: int = 1

    def __post_init__(self) -> None:
        check_switch("noise", self.noise)
        check_real("epsilon", self.epsilon, low=0.0)
        check_real("delta", self.delta, low=0.0, high=0.5)
        check_real("sensitivity", self.sensitivity, low=0.0)
        for name in ("graph", "mask_graph"):
            spec = getattr(self, name)
            if not isinstance(spec, str):
                raise InvalidArgumentError(
                    name, f"expected 'auto', 'complete' or 'nout:N', got {spec!r}"
                )
            try:
                parse_graph(spec)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(name, str(exc).partition(": ")[2]) from None
        if isinstance(self.correction_words, bool) or self.correction_words not in (1, 2):
            raise InvalidArgumentError(
                "correction_words", f"expected 1 or 2, got {self.correction_words!r}"
            )
        if not isinstance(self.mask_corrections, bool):
            raise InvalidArgumentError(
                "mask_corrections", f"expected True or False, got {self.mask_corrections!r}"
            )
