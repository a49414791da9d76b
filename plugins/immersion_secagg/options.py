"""Options of seed 001's schemes (``sgd-dp``, ``gsgd-dp``, ``gd-dp``), validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from immersion_fl.config import SchemeOptions, check_real, check_switch


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

    Examples
    --------
    >>> DpSgdOptions.from_flags({"noise": "auto", "grad_clip": 2.0}).noise
    'on'
    """

    noise_auto: ClassVar[str | None] = "on"

    noise: str = "on"
    epsilon: float = 1.0
    delta: float = 1e-5
    grad_clip: float = 10.0
    sigma2: float | None = None

    def __post_init__(self) -> None:
        check_switch("noise", self.noise)
        check_real("epsilon", self.epsilon, low=0.0)
        check_real("delta", self.delta, low=0.0, high=0.5)
        check_real("grad_clip", self.grad_clip, low=0.0)
        if self.sigma2 is not None:
            check_real("sigma2", self.sigma2, low=0.0, open_low=False)
