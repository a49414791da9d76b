"""``immersion audit``: run every registered attack on every scheme it targets, report the figures.

Each attack is a plugin registration (:class:`immersion.plugins.hookspecs.AttackSpec`, hook
``immersion_register_attacks``) whose ``run(quick=..., seed=...)`` returns
:class:`AttackResult` rows: what was measured, against what baseline (the same measurement
without the leak, e.g. on unrelated data), and the verdict. A mitigation is a separate row with
``mitigation`` set and its measured ``cost``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..errors import InvalidArgumentError

VERDICTS = ("leaks", "resists", "partial")


@dataclass(frozen=True)
class AttackResult:
    """One measured outcome of one attack on one scheme.

    Examples
    --------
    >>> r = AttackResult("subspace", "immerse", "abs correlation with y", 0.9999, 0.03, "leaks")
    >>> r.as_dict()["verdict"]
    'leaks'
    """

    attack: str
    scheme: str
    metric: str
    value: float
    baseline: float
    verdict: str
    mitigation: str | None = None
    cost: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InvalidArgumentError(
                "verdict", f"expected one of {VERDICTS}, got {self.verdict!r}"
            )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_audit(
    *,
    scheme: str | None = None,
    attack: str | None = None,
    quick: bool = False,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the registered attacks (optionally one ``attack`` or those targeting ``scheme``).

    Returns ``{"attacks": [row, ...], "seconds": {attack: s}}``; rows are filtered to ``scheme``.
    """
    from ..plugins.manager import registry

    specs = registry().attacks()
    if attack is not None and attack not in specs:
        raise InvalidArgumentError(
            "attack", f"unknown attack {attack!r}; registered: {sorted(specs)}"
        )
    known_schemes = sorted({s for spec in specs.values() for s in spec.schemes})
    if scheme is not None and scheme not in known_schemes:
        raise InvalidArgumentError(
            "scheme", f"no attack targets {scheme!r}; audited schemes: {known_schemes}"
        )
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    for name, spec in sorted(specs.items()):
        if (attack is not None and name != attack) or (
            scheme is not None and scheme not in spec.schemes
        ):
            continue
        if progress is not None:
            progress(f"{name} ({', '.join(spec.schemes)})")
        start = time.perf_counter()
        results = spec.run(quick=quick, seed=seed)
        seconds[name] = time.perf_counter() - start
        rows += [r.as_dict() for r in results if scheme is None or r.scheme == scheme]
    return {"attacks": rows, "seconds": seconds}
