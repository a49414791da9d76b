"""Options of seed 001's schemes (``sgd-dp``, ``gsgd-dp``, ``gd-dp``), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from immersion import InvalidArgumentError
from immersion_fl.config import SchemeOptions, check_real, check_switch, option

#: How the Flower engine sums the users' updates.
SECURE_SUMS = ("core", "secagg+")


@dataclass(frozen=True)
class DpSgdOptions(SchemeOptions):
    """DP-SGD settings under secure aggregation (seed 001, Table 1 and Theorem 4).

    Parameters
    ----------
    noise:
        ``"on"`` or ``"off"`` (the plain reference: the same steps without noise).
    epsilon, delta:
        Total ``(epsilon, delta)`` of the whole run.
    grad_clip:
        Per-example gradient clip ``C``.
    sigma2:
        Per-user noise variance (the WF-NA floor for gsgd-dp); None: calibrated to ``epsilon``.
    secure_sum:
        How ``engine="flower"`` sums the updates: ``"core"`` (the SDK's secure sum,
        :mod:`immersion_secagg.core_flower`: cryptographic masks, a sum within ``N 2^-61`` of the
        exact one, dropouts recovered) or ``"secagg+"`` (Flower's SecAgg+: quantised and clipped,
        masks from 32-bit Mersenne Twister seeds; kept for comparison).

    Examples
    --------
    >>> DpSgdOptions.from_flags({"noise": "auto", "grad_clip": 2.0}).noise
    'on'
    """

    noise_auto: ClassVar[str | None] = "on"

    noise: str = option(
        "on", "on or off (auto: on).", choices=("auto", "on", "off"), cli_default="auto"
    )
    epsilon: float = option(1.0, "total epsilon over all rounds.", low=0, open_low=True)
    delta: float = option(1e-5, "delta of the whole run.", low=0, high=0.5, open_low=True)
    grad_clip: float = option(10.0, "per-example gradient clip C (seed 001).", low=0, open_low=True)
    sigma2: float | None = option(
        None,
        "per-user noise variance (WF-NA floor); default: calibrated to --epsilon.",
        low=0,
    )
    secure_sum: str = option(
        "core",
        "with --engine flower: the SDK's secure sum, or Flower's SecAgg+ (quantised; masks from "
        "32-bit Mersenne Twister seeds).",
        choices=SECURE_SUMS,
    )

    def __post_init__(self) -> None:
        check_switch("noise", self.noise)
        check_real("epsilon", self.epsilon, low=0.0)
        check_real("delta", self.delta, low=0.0, high=0.5)
        check_real("grad_clip", self.grad_clip, low=0.0)
        if self.sigma2 is not None:
            check_real("sigma2", self.sigma2, low=0.0, open_low=False)
        if self.secure_sum not in SECURE_SUMS:
            raise InvalidArgumentError(
                "secure_sum", f"expected one of {SECURE_SUMS}, got {self.secure_sum!r}"
            )
