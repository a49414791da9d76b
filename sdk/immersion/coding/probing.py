"""Probing the user's ``f`` and ``g`` when :func:`immerse` is called: signature, shapes, gain."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np

from .. import validation as v
from ..backends import ArrayBackend
from ..errors import InvalidArgumentError, NonFiniteError
from .target import CheckedFunction


def uses_public(fn: Callable[..., Any], name: str) -> bool:
    """True if ``fn`` takes a third positional argument ``w`` (public, unencoded)."""
    if not callable(fn):
        raise InvalidArgumentError(
            name, f"expected a callable {name}(x, y) or {name}(x, y, w), got {fn!r}"
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 3 or len(positional) < 2:
        raise InvalidArgumentError(
            name, f"must take (x, y) or (x, y, w); its signature is {inspect.signature(fn)}"
        )
    return len(positional) >= 3


def _probe(fn: CheckedFunction, x: Any, y: Any, w: Any) -> None:
    try:
        fn(x, y, w)
    except (InvalidArgumentError, NonFiniteError):
        raise
    except Exception as exc:  # the user's code failed on the probe point: say where
        raise InvalidArgumentError(
            fn.name,
            f"raised {type(exc).__name__} when probed at "
            f"(x={x!r}, y={y!r}): {exc}; pass probe=(x, y[, w]) with a valid point",
        ) from exc


def probe_both(
    f: CheckedFunction,
    g: CheckedFunction,
    n_state: int,
    n_input: int,
    n_public: int | None,
    probe: tuple[Any, ...] | None,
    be: ArrayBackend,
) -> list[Any]:
    """Call f and g once to check their output shapes (done when ``immerse`` is called)."""
    needs_w = f.uses_public or g.uses_public
    if probe is None:
        if needs_w and n_public is None:
            raise InvalidArgumentError(
                "n_public",
                "f or g takes a public signal w: give n_public (its length) or probe=(x, y, w)",
            )
        point = [
            be.zeros((n_state,)),
            be.zeros((n_input,)),
            be.zeros((n_public,)) if needs_w and n_public is not None else None,
        ]
    else:
        if not isinstance(probe, tuple) or len(probe) not in (2, 3):
            raise InvalidArgumentError("probe", "expected a tuple (x, y) or (x, y, w)")
        point = [
            be.asarray(v.finite_array("probe[0]", probe[0], ndim=1, last_dim=n_state)),
            be.asarray(v.finite_array("probe[1]", probe[1], ndim=1, last_dim=n_input)),
            probe[2] if len(probe) == 3 else None,
        ]
        if needs_w and point[2] is None:
            raise InvalidArgumentError("probe", "f or g takes w: give probe=(x, y, w)")
    _probe(f, *point)
    _probe(g, *point)
    return point


#: Random sign directions and relative step of the input-gain probe.
GAIN_PROBES, GAIN_STEP = 3, 1e-6


def estimate_input_gain(
    f: CheckedFunction, g: CheckedFunction, point: list[Any], be: ArrayBackend
) -> float:
    """How much ``f`` and ``g`` amplify a small random error in ``y`` (max-norm ratio, >= 1).

    Decoding errors of ``y~`` look like small random vectors; this measures the response to a
    few random-sign perturbations by finite differences at the probe point, times 2 for safety.
    """
    x, y, w = point
    rng = np.random.default_rng(0)
    base_f, base_g = be.to_numpy(f(x, y, w)), be.to_numpy(g(x, y, w))
    step = GAIN_STEP * max(1.0, float(np.abs(be.to_numpy(y)).max()))
    gain = 1.0
    for _ in range(GAIN_PROBES):
        direction = be.asarray(rng.choice([-1.0, 1.0], size=int(y.shape[0])) * step)
        try:
            moved_f, moved_g = (
                be.to_numpy(f(x, y + direction, w)),
                be.to_numpy(g(x, y + direction, w)),
            )
        except Exception:  # noqa: BLE001 - f or g undefined next to the probe point
            continue  # keep the gain so far
        gain = max(
            gain,
            float(np.abs(moved_f - base_f).max()) / step,
            float(np.abs(moved_g - base_g).max()) / step,
        )
    return 2.0 * gain
