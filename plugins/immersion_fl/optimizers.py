"""Ordinary optimizers as pure ``(init, update)`` pairs on flat vectors (Optax style).

The *target* optimizers of seed 000 section 7 use them unchanged: the client decodes the
encoded model once, runs the ordinary optimizer with its state in original coordinates, and
lifts the total change back (see :func:`lift_change`). Because the lift is linear and exact,
the decoded trajectory equals the plain one for any optimizer state (momentum, Adam moments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from immersion import InvalidArgumentError


@dataclass(frozen=True)
class SGD:
    """``w <- w - lr g``."""

    lr: float

    def init(self, params: Any) -> tuple[Any, ...]:
        return ()

    def update(self, grad: Any, state: tuple[Any, ...], params: Any) -> tuple[Any, tuple[Any, ...]]:
        return -self.lr * grad, state


@dataclass(frozen=True)
class Momentum:
    """Heavy ball: ``v <- beta v + g``, ``w <- w - lr v`` (Keras' SGD with momentum, up to sign)."""

    lr: float
    beta: float = 0.9

    def init(self, params: Any) -> tuple[Any, ...]:
        return (params * 0.0,)

    def update(self, grad: Any, state: tuple[Any, ...], params: Any) -> tuple[Any, tuple[Any, ...]]:
        velocity = self.beta * state[0] + grad
        return -self.lr * velocity, (velocity,)


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba) with bias correction; Keras defaults (eps 1e-7)."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-7

    def init(self, params: Any) -> tuple[Any, ...]:
        return (params * 0.0, params * 0.0, 0)

    def update(self, grad: Any, state: tuple[Any, ...], params: Any) -> tuple[Any, tuple[Any, ...]]:
        m, v, t = state
        t += 1
        m = self.beta1 * m + (1 - self.beta1) * grad
        v = self.beta2 * v + (1 - self.beta2) * grad * grad
        m_hat = m / (1 - self.beta1**t)
        v_hat = v / (1 - self.beta2**t)
        # v >= 0 in exact arithmetic; a decoded v (SIML's target Adam) can be -1e-20: clamp before sqrt
        return -self.lr * m_hat / (v_hat.clamp_min(0.0).sqrt() + self.eps), (m, v, t)


def make_optimizer(name: str, lr: float) -> Any:
    """A registered optimizer (``sgd``, ``momentum``, ``adam`` or a plugin's) with learning rate ``lr``."""
    from immersion.plugin_manager import registry

    if not lr > 0:
        raise InvalidArgumentError("lr", f"expected lr > 0, got {lr}")
    return registry().optimizer(name).factory(lr)


def lift_change(encoded: Any, before: Any, after: Any, encoder: Any) -> Any:
    """Target-optimizer lift (seed 000 eq. 20 summed over the local steps): ``w~ - Pi1 (w_before - w_after)``."""
    return encoded - encoder(before - after)
