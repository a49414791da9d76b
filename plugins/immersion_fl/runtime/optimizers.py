"""Optimizers as composable ``(init, update)`` gradient transformations (Optax style).

A :class:`GradientTransformation` is a pair of pure functions: ``init(params) -> state`` and
``update(updates, state, params) -> (updates, state)``; its state is a named tuple
(:class:`AdamState` ``(count, mu, nu)``, :class:`TraceState`, ...), never anonymous. They run on
numpy arrays and torch tensors alike (element-wise work goes through the array's backend,
:func:`immersion.backends.backend_of`), and :func:`chain` composes them, e.g. a DP-SGD client
(seed 001, Table 1's SGD-DP row)::

    chain(clip_by_norm(C), dp_aggregate(noise_std, rng=rng), sgd(lr))

applied to per-example gradients stacked along the first axis.

The *target* optimizers of seed 000 section 7 use these unchanged: a SIFL client decodes the
encoded model once, runs the ordinary optimizer with its state in original coordinates, and lifts
the total change back (:func:`immersion_fl.schemes.lift_change`). Because the lift is linear and
exact, the decoded trajectory equals the plain one for any optimizer state (momentum, Adam
moments). Registered names (``sgd``, ``momentum``, ``adam``, plugins' own) are resolved at the
edge (engine, CLI) through :func:`immersion_fl.runtime.engine.optimizer_by_name`.

References
----------
Optax, ``optax/_src/base.py`` (``GradientTransformation``, ``chain``) and
``optax/contrib/_privacy.py`` (``differentially_private_aggregate``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar, Union

import numpy as np
from immersion import InvalidArgumentError
from immersion.backends import backend_of

if TYPE_CHECKING:
    import torch

#: A numpy array or a torch tensor (the same code serves both).
Array = Union[np.ndarray, "torch.Tensor"]
#: One of the two, the same throughout a call (a result of its arguments' type).
ArrayT = TypeVar("ArrayT", np.ndarray, "torch.Tensor")

#: An optimizer's state: a named tuple, or a tuple of them (a chain's). Each transformation's
#: ``update`` takes its own state type, so the common type stays open, as in Optax.
OptState = Any


class GradientTransformation(NamedTuple):
    """A pure ``(init, update)`` pair.

    Parameters
    ----------
    init:
        ``init(params) -> state``: the state for parameters shaped like ``params``.
    update:
        ``update(updates, state, params) -> (updates, state)``: transform the incoming updates
        (gradients, or the previous transformation's output) and advance the state.
    """

    init: Callable[[Array], OptState]
    update: Callable[[Array, OptState, Array | None], tuple[Array, OptState]]


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


class TraceState(NamedTuple):
    """The state of :func:`momentum`.

    Parameters
    ----------
    trace:
        The running velocity ``v``.
    """

    trace: Array


class AdamState(NamedTuple):
    """The state of :func:`adam` (Kingma and Ba).

    Parameters
    ----------
    count:
        Steps taken (for the bias correction).
    mu, nu:
        The first and second moment estimates.
    """

    count: int  # type: ignore[assignment]  # shadows tuple.count, as Optax's ScaleByAdamState
    mu: Array
    nu: Array


class DpAggregateState(NamedTuple):
    """The state of :func:`dp_aggregate`.

    Parameters
    ----------
    rng:
        The noise generator (advanced by every update).
    """

    rng: np.random.Generator


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidArgumentError(name, f"expected a real number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgumentError(name, f"expected a finite value > 0, got {value!r}")
    return float(value)


def _unit_interval(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise InvalidArgumentError(name, f"expected a real number in [0, 1), got {value!r}")
    if not 0 <= value < 1:
        raise InvalidArgumentError(name, f"expected a value in [0, 1), got {value!r}")
    return float(value)


def scale(factor: float) -> GradientTransformation:
    """``u <- factor u``.

    Parameters
    ----------
    factor:
        A finite real number.

    Examples
    --------
    >>> import numpy as np
    >>> t = scale(-0.5)
    >>> t.update(np.array([2.0, 4.0]), t.init(None), None)[0].tolist()
    [-1.0, -2.0]
    """
    if isinstance(factor, bool) or not math.isfinite(factor):
        raise InvalidArgumentError("factor", f"expected a finite real number, got {factor!r}")

    def update(
        updates: Array, state: OptState, params: Array | None = None
    ) -> tuple[Array, OptState]:
        return factor * updates, state

    return GradientTransformation(lambda params: EmptyState(), update)


def sgd(lr: float) -> GradientTransformation:
    """Plain SGD: ``w <- w - lr g``.

    Parameters
    ----------
    lr:
        The learning rate, > 0.

    Examples
    --------
    >>> import numpy as np
    >>> opt = sgd(0.1)
    >>> opt.update(np.array([1.0, -2.0]), opt.init(np.zeros(2)), None)[0].tolist()
    [-0.1, 0.2]
    """
    return scale(-_positive("lr", lr))


def momentum(lr: float, beta: float = 0.9) -> GradientTransformation:
    """Heavy ball: ``v <- beta v + g``, ``w <- w - lr v`` (Keras' SGD with momentum, up to sign).

    Parameters
    ----------
    lr:
        The learning rate, > 0.
    beta:
        The decay of the velocity, in [0, 1).

    Examples
    --------
    >>> import numpy as np
    >>> opt = momentum(1.0, beta=0.5)
    >>> state = opt.init(np.zeros(1))
    >>> step, state = opt.update(np.array([1.0]), state, None)
    >>> step, state = opt.update(np.array([1.0]), state, None)
    >>> step.tolist(), state.trace.tolist()
    ([-1.5], [1.5])
    """
    lr, beta = _positive("lr", lr), _unit_interval("beta", beta)

    def init(params: Array) -> TraceState:
        return TraceState(params * 0.0)

    def update(
        updates: Array, state: TraceState, params: Array | None = None
    ) -> tuple[Array, TraceState]:
        velocity = beta * state.trace + updates
        return -lr * velocity, TraceState(velocity)

    return GradientTransformation(init, update)


def adam(
    lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-7
) -> GradientTransformation:
    """Adam with bias correction, Keras defaults (``eps = 1e-7``).

    Parameters
    ----------
    lr:
        The learning rate, > 0.
    beta1, beta2:
        Decays of the first and second moments, in [0, 1).
    eps:
        Added to ``sqrt(nu_hat)``, > 0.

    Notes
    -----
    ``nu >= 0`` in exact arithmetic; a decoded ``nu`` (SIML's target Adam) can be ``-1e-20``, so
    it is clamped at 0 before the square root.

    Examples
    --------
    >>> import numpy as np
    >>> opt = adam(0.1)
    >>> step, state = opt.update(np.array([3.0, -4.0]), opt.init(np.zeros(2)), None)
    >>> np.round(step, 6).tolist(), state.count
    ([-0.1, 0.1], 1)
    """
    lr, eps = _positive("lr", lr), _positive("eps", eps)
    beta1, beta2 = _unit_interval("beta1", beta1), _unit_interval("beta2", beta2)

    def init(params: Array) -> AdamState:
        return AdamState(0, params * 0.0, params * 0.0)

    def update(
        updates: Array, state: AdamState, params: Array | None = None
    ) -> tuple[Array, AdamState]:
        count = state.count + 1
        mu = beta1 * state.mu + (1 - beta1) * updates
        nu = beta2 * state.nu + (1 - beta2) * updates * updates
        mu_hat = mu / (1 - beta1**count)
        nu_hat = nu / (1 - beta2**count)
        ops = backend_of(nu_hat)
        step = -lr * mu_hat / (ops.sqrt(ops.clip_min(nu_hat, 0.0)) + eps)
        return step, AdamState(count, mu, nu)

    return GradientTransformation(init, update)


def clip_to_norm(values: Array, max_norm: float) -> Array:
    """Scale every vector along the last axis into the ball of radius ``max_norm``:
    ``x / max(1, ||x||_2 / C)`` (seed 001 section 2's ``clip(x, C)``; seed 000 Remark 3's norm
    bound). Vectors inside the ball come back bit for bit.

    Parameters
    ----------
    values:
        One vector (1-D) or a stack of them (one per row).
    max_norm:
        The radius ``C > 0``.

    Examples
    --------
    >>> import numpy as np
    >>> clip_to_norm(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    ops = backend_of(values)
    return values / ops.clip_min(ops.row_norms(values) / max_norm, 1.0)


def clip_by_norm(max_norm: float) -> GradientTransformation:
    """Clip each update vector (each row of per-example gradients) to L2 norm ``max_norm``.

    Parameters
    ----------
    max_norm:
        The clip norm ``C > 0``.

    Examples
    --------
    >>> import numpy as np
    >>> t = clip_by_norm(1.0)
    >>> t.update(np.array([[3.0, 4.0], [0.3, 0.4]]), t.init(None), None)[0].tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    bound = _positive("max_norm", max_norm)

    def update(
        updates: Array, state: OptState, params: Array | None = None
    ) -> tuple[Array, OptState]:
        return clip_to_norm(updates, bound), state

    return GradientTransformation(lambda params: EmptyState(), update)


def dp_aggregate(
    noise_std: float, *, rng: int | np.integer | np.random.Generator
) -> GradientTransformation:
    """Average per-example updates (first axis) and add ``N(0, noise_std^2 I)`` to the mean.

    With clipped rows this is the SGD-DP / GD-DP upload of seed 001 (Table 1, isotropic rows:
    ``noise_std^2 = sigma2``); Optax's ``differentially_private_aggregate`` is the same map with
    ``noise_std = l2_norm_clip * noise_multiplier / batch``. Clip first (:func:`clip_by_norm`):
    this transformation does not.

    Parameters
    ----------
    noise_std:
        Standard deviation of the noise on the mean, >= 0 (0: the plain mean, no draw).
    rng:
        Seed or ``numpy.random.Generator`` of the noise (one ``standard_normal(K)`` draw per
        update; a Generator passed in is used, not copied).

    Examples
    --------
    >>> import numpy as np
    >>> t = dp_aggregate(0.0, rng=0)
    >>> t.update(np.array([[1.0, 2.0], [3.0, 4.0]]), t.init(None), None)[0].tolist()
    [2.0, 3.0]
    """
    if isinstance(noise_std, bool) or not (math.isfinite(noise_std) and noise_std >= 0):
        raise InvalidArgumentError("noise_std", f"expected a finite value >= 0, got {noise_std!r}")
    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer, np.random.Generator)):
        raise InvalidArgumentError("rng", f"expected a seed or a numpy Generator, got {rng!r}")

    def init(params: Array) -> DpAggregateState:
        return DpAggregateState(np.random.default_rng(rng))

    def update(
        updates: Array, state: DpAggregateState, params: Array | None = None
    ) -> tuple[Array, DpAggregateState]:
        if updates.ndim != 2 or updates.shape[0] == 0:
            raise InvalidArgumentError(
                "updates",
                f"expected per-example rows (B, K) with B >= 1, got {tuple(updates.shape)}",
            )
        mean = updates.mean(0)
        if noise_std == 0:
            return mean, state
        ops = backend_of(mean)
        noise = ops.asarray(state.rng.standard_normal(mean.shape[-1]))
        return mean + noise_std * noise, state

    return GradientTransformation(init, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply ``transforms`` in order; the state is the tuple of their states.

    Parameters
    ----------
    *transforms:
        :class:`GradientTransformation` objects, applied first to last.

    Examples
    --------
    >>> import numpy as np
    >>> opt = chain(clip_by_norm(1.0), sgd(0.5))
    >>> opt.update(np.array([3.0, 4.0]), opt.init(np.zeros(2)), None)[0].tolist()
    [-0.3, -0.4]
    """
    for i, t in enumerate(transforms):
        if not isinstance(t, GradientTransformation):
            raise InvalidArgumentError(
                "transforms", f"item {i} is a {type(t).__name__}, not a GradientTransformation"
            )

    def init(params: Array) -> tuple[OptState, ...]:
        return tuple(t.init(params) for t in transforms)

    def update(
        updates: Array, state: tuple[OptState, ...], params: Array | None = None
    ) -> tuple[Array, tuple[OptState, ...]]:
        new_states = []
        for t, s in zip(transforms, state, strict=True):
            updates, s = t.update(updates, s, params)
            new_states.append(s)
        return updates, tuple(new_states)

    return GradientTransformation(init, update)
