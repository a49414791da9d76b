"""Seed 001's accountant as a privacy budget for :class:`~immersion_secagg.SecureAggregation`.

Under secure aggregation the server sees only the sum of the contributors' noisy updates, so each
node's noise adds up: seed 001 (Table 1, Theorem 4) gives the Renyi DP of that sum for one record
of one node. :class:`SecureSumBudget` composes it over the rounds run (RDP adds up, each round
with its own number of contributors ``N``), converts with Lemma 1 (:func:`~.accountant.
epsilon_from_rdp`) and, with ``max_epsilon``, refuses a round whose worst case (``threshold``
contributors: every bound grows as ``N`` falls) would pass it, as Flower's ``RdpAccountant``
stops its own DP wrappers.

The guarantee holds only if each node's update is the mechanism named: one step on the node's
``D`` records with per-example gradients clipped to ``C`` and, added by the node before masking,
isotropic Gaussian noise of variance ``sigma2`` (``"gd"``: full gradient; ``"gaussian-sampling"``:
Gaussian sampling of batch ``B``) or WF-NA noise with eigenvalue floor ``sigma2`` (``"wfna"``,
Theorem 4: the paper's claim, see :mod:`.accountant`). The wrapper cannot check what a node's
train function does; the budget states what the sum gives if it does that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from immersion import InvalidArgumentError

from .accountant import (
    Guarantee,
    Setting,
    epsilon_from_rdp,
    rdp_gaussian_sampling_isotropic,
    rdp_gd_isotropic,
    rdp_theorem4,
    theorem4_alpha_max,
)
from .message_wire import PrivacyBudgetExceeded

#: mechanism -> (per-round RDP at order a, end of the orders' range).
MECHANISMS: dict[str, tuple[Callable[..., float], Callable[[Setting, float], float]]] = {
    "gd": (rdp_gd_isotropic, lambda s, sigma2: math.inf),
    "gaussian-sampling": (
        rdp_gaussian_sampling_isotropic,
        lambda s, sigma2: s.users * s.batch * s.samples * sigma2 / s.clip**2,
    ),
    "wfna": (rdp_theorem4, theorem4_alpha_max),
}
NAMES = {
    "gd": "GD + isotropic Gaussian (Table 1)",
    "gaussian-sampling": "Gaussian sampling + isotropic Gaussian (Table 1)",
    "wfna": "Theorem 4 (eq. 35)",
}


@dataclass
class SecureSumBudget:
    """The DP of the secure sum of the nodes' noisy updates over the rounds run, and its cap.

    Parameters
    ----------
    mechanism : {"gd", "gaussian-sampling", "wfna"}
        What each node's update is (module docstring).
    samples : int
        ``D``, records per node.
    batch : int
        ``B``, the batch (``gaussian-sampling``, ``wfna``; ``D`` for ``gd``).
    clip : float
        ``C``, the per-example gradient clip.
    sigma2 : float
        Each node's noise variance (WF-NA: the eigenvalue floor).
    delta : float
        Target delta.
    max_epsilon : float, optional
        Refuse a round that could take epsilon past it (None: only report).
    spent : list of int
        Contributors of each round spent so far (empty for a new budget).

    Examples
    --------
    >>> b = SecureSumBudget("gd", samples=100, batch=100, clip=1.0, sigma2=1e-3, delta=1e-5)
    >>> b.spend(10); b.spend(8)
    >>> round(b.guarantee().epsilon, 4) > 0, b.spent
    (True, [10, 8])
    """

    mechanism: str
    samples: int
    batch: int
    clip: float
    sigma2: float
    delta: float
    max_epsilon: float | None = None
    spent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise InvalidArgumentError(
                "mechanism", f"expected one of {sorted(MECHANISMS)}, got {self.mechanism!r}"
            )
        Setting(users=1, samples=self.samples, batch=self.batch, clip=self.clip)  # checks them
        if not (self.sigma2 > 0 and math.isfinite(self.sigma2)):
            raise InvalidArgumentError("sigma2", f"expected a finite value > 0, got {self.sigma2}")
        if not 0 < self.delta < 1:
            raise InvalidArgumentError("delta", f"expected in (0, 1), got {self.delta}")
        if self.max_epsilon is not None and not self.max_epsilon > 0:
            raise InvalidArgumentError(
                "max_epsilon", f"expected > 0 or None, got {self.max_epsilon}"
            )

    def guarantee(self, rounds: list[int] | None = None) -> Guarantee:
        """``(epsilon, delta)`` after rounds with these numbers of contributors.

        Parameters
        ----------
        rounds : list of int, optional
            Contributors of each round (default: the rounds spent).

        Returns
        -------
        Guarantee
            Epsilon (0 before any round), the order that gave it and the range.
        """
        counts = list(self.spent if rounds is None else rounds)
        if not counts:
            return Guarantee(0.0, self.delta, math.nan, 0, math.inf, NAMES[self.mechanism])
        rdp, alpha_max = MECHANISMS[self.mechanism]
        settings = [Setting(n, self.samples, self.batch, self.clip) for n in counts]
        return epsilon_from_rdp(
            lambda a: sum(rdp(a, s, self.sigma2) for s in settings),
            self.delta,
            alpha_max=min(alpha_max(s, self.sigma2) for s in settings),
            mechanism=NAMES[self.mechanism] + f", {len(counts)} rounds",
        )

    def check(self, contributors: int) -> None:
        """Refuse (:class:`PrivacyBudgetExceeded`) a round of ``contributors`` that would pass
        ``max_epsilon``.

        Parameters
        ----------
        contributors : int
            The fewest contributors the round may have (the wrapper's ``threshold``).
        """
        if self.max_epsilon is None:
            return
        after = self.guarantee([*self.spent, contributors]).epsilon
        if after > self.max_epsilon:
            raise PrivacyBudgetExceeded(
                f"round {len(self.spent) + 1} could take epsilon to {after:.4g} "
                f"(delta {self.delta:g}), past max_epsilon {self.max_epsilon:g}; "
                f"spent so far {self.guarantee().epsilon:.4g} over {len(self.spent)} rounds"
            )

    def spend(self, contributors: int) -> None:
        """Record a round whose sum had ``contributors`` noisy updates.

        Parameters
        ----------
        contributors : int
            The round's contributors.
        """
        self.spent.append(int(contributors))
