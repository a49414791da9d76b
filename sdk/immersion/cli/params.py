"""Click parameter types shared by ``immersion`` and the plugins' commands (no side effects)."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """:class:`click.FloatRange` that also refuses ``nan`` and ``inf`` (click lets NaN through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        out = super().convert(value, param, ctx)
        if isinstance(out, float) and not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return out


#: Seeds: numpy and torch take non-negative seeds that fit in 64-bit integers.
SEED = click.IntRange(0, 2**63 - 1)


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinite floats as None, for ``--json`` output (JSON has neither)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value
