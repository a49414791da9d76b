"""The optimizer as a dynamical system (seed 002 eq. 39): ``x_{t+1} = x_t + change(x_t, D)``.

The state ``x`` is the flat vector ``(w, optimizer moments)``: ``w`` alone for SGD (eq. 40),
``(w, m, v)`` for Adam (eq. 41); Adam's step counter is public (it is the loop index). Plain
training and the target optimizer call the same :meth:`OptimizerDynamics.change` (per batch) or
:meth:`OptimizerDynamics.epoch_change` (per epoch: the ordinary loop on ``(w, state)``, packed
once), so the only difference between them is the encoding, which is what makes their comparison
exact. Plain training runs per epoch (no encoding between batches to pay for).

A target step is one mini-batch (``sync="batch"``, eqs. 40-41 literally) or one epoch
(``sync="epoch"``: ``t`` counts epochs, as the paper's eq. 39 says); both are instances of
eq. 44, with ``p(x) = -change(x)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import InvalidArgumentError

from .models import SimlModel

if TYPE_CHECKING:
    from immersion_fl.runtime.optimizers import GradientTransformation

SYNC_MODES = ("epoch", "batch")
#: Optimizers whose state SIML carries in the encoded state (:class:`OptimizerDynamics`).
OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclass(frozen=True)
class TrainingPlan:
    """The public training schedule: optimizer, learning rate, epochs, batches and their order.

    ``shuffle=True``: a fresh permutation of the samples every epoch, drawn from
    ``order_seed``; ``shuffle=False``: the samples in their order every epoch. Either way the
    last batch of an epoch may be shorter than ``batch_size``.

    Parameters
    ----------
    optimizer:
        One of :data:`OPTIMIZERS`: ``"sgd"`` (eq. 40), ``"momentum"`` or ``"adam"`` (eq. 41).
    lr:
        The learning rate, finite and > 0.
    epochs:
        Passes over the data (the paper's ``T`` with ``sync="epoch"``).
    batch_size:
        Samples per mini-batch.
    sync:
        ``"epoch"``: one target step per epoch (eq. 39's ``t``); ``"batch"``: one per
        mini-batch (eqs. 40-41).
    order_seed:
        Seed of the batch order (integer >= 0).
    shuffle:
        A fresh permutation per epoch (True) or the samples in order (False).
    """

    optimizer: str = "adam"
    lr: float = 0.001
    epochs: int = 5
    batch_size: int = 32
    sync: str = "epoch"
    order_seed: int = 0
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise InvalidArgumentError(
                "optimizer", f"expected one of {OPTIMIZERS}, got {self.optimizer!r}"
            )
        if not (isinstance(self.lr, (int, float)) and np.isfinite(self.lr) and self.lr > 0):
            raise InvalidArgumentError("lr", f"expected a finite lr > 0, got {self.lr!r}")
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise InvalidArgumentError(name, f"expected an integer >= 1, got {value!r}")
        if self.sync not in SYNC_MODES:
            raise InvalidArgumentError("sync", f"expected one of {SYNC_MODES}, got {self.sync!r}")
        if (
            isinstance(self.order_seed, bool)
            or not isinstance(self.order_seed, (int, np.integer))
            or self.order_seed < 0
        ):
            raise InvalidArgumentError(
                "order_seed", f"expected an integer >= 0, got {self.order_seed!r}"
            )
        if not isinstance(self.shuffle, bool):
            raise InvalidArgumentError("shuffle", f"expected True or False, got {self.shuffle!r}")

    def batches(self, n_samples: int) -> list[list[np.ndarray]]:
        """Index arrays of every mini-batch, epoch by epoch (a fresh shuffle per epoch, or the
        samples in order; the last batch may be short).

        Parameters
        ----------
        n_samples:
            Size of the training set.

        Examples
        --------
        >>> plan = TrainingPlan(epochs=1, batch_size=2, order_seed=0)
        >>> [[b.tolist() for b in e] for e in plan.batches(3)]
        [[[2, 0], [1]]]
        >>> plan = TrainingPlan(epochs=2, batch_size=2, shuffle=False)
        >>> [[b.tolist() for b in e] for e in plan.batches(3)]
        [[[0, 1], [2]], [[0, 1], [2]]]
        """
        rng = np.random.default_rng(self.order_seed)
        epochs = []
        for _ in range(self.epochs):
            order = rng.permutation(n_samples) if self.shuffle else np.arange(n_samples)
            epochs.append(
                [order[i : i + self.batch_size] for i in range(0, n_samples, self.batch_size)]
            )
        return epochs


class OptimizerDynamics:
    """``change(x, features, targets, t)``: one mini-batch step on the flat state ``x``
    (eqs. 39-41).

    The optimizer is a gradient transformation with a named state
    (:mod:`immersion_fl.runtime.optimizers`); its array fields are the moment blocks of ``x``
    after ``w``, in field order, and an integer ``count`` field is the public step counter. A
    field named ``nu`` (Adam's second moment, ``~ g^2``) is carried as ``sqrt(nu)``: it then shares
    the scale of the weights' code, which keeps the decoded trajectory exact (carrying ``nu`` itself
    gave 1e-4 after 5 epochs).

    Parameters
    ----------
    model:
        The model as a function of its flat parameter vector.
    optimizer:
        The optimizer (e.g. ``immersion_fl.runtime.optimizers.adam(0.001)``).
    """

    def __init__(self, model: SimlModel, optimizer: GradientTransformation) -> None:
        self.model, self.optimizer = model, optimizer
        self.n_params = model.n_params
        probe = optimizer.init(model._torch.zeros(model.n_params, dtype=model._torch.float64))
        if not (isinstance(probe, tuple) and hasattr(type(probe), "_fields")):
            raise InvalidArgumentError(
                "optimizer",
                "SIML carries the optimizer state in the encoded state: it needs one "
                "transformation with a named-tuple state (sgd, momentum, adam), not a chain",
            )
        self._state_type = type(probe)
        self._fields: tuple[str, ...] = probe._fields  # type: ignore[attr-defined]
        self._vector_fields = [
            name for name in self._fields if hasattr(getattr(probe, name), "shape")
        ]
        self.n_moments = len(self._vector_fields)
        self.n_state = self.n_params * (1 + self.n_moments)

    def initial_state(self, w0: Any) -> Any:
        """``x0 = (w0, zero moments)``."""
        torch = self.model._torch
        return torch.cat([w0] + [torch.zeros_like(w0)] * self.n_moments)

    def params(self, x: Any) -> Any:
        """The model parameters ``w``, the first block of ``x``."""
        return x[..., : self.n_params]

    def _unpack(self, x: Any, steps_done: int) -> tuple[Any, Any]:
        n = self.n_params
        blocks = {name: x[n * (i + 1) : n * (i + 2)] for i, name in enumerate(self._vector_fields)}
        values = {
            name: blocks[name] * blocks[name] if name == "nu" else blocks[name] for name in blocks
        }
        state = self._state_type(**{name: values.get(name, steps_done) for name in self._fields})
        return x[:n], state

    def _stored(self, state: Any) -> list[Any]:
        return [
            getattr(state, name).clamp_min(0.0).sqrt() if name == "nu" else getattr(state, name)
            for name in self._vector_fields
        ]

    def change(self, x: Any, features: Any, targets: Any, steps_done: int) -> Any:
        """``x_{t+1} - x_t`` for one mini-batch: ``-p(x_t)`` of eq. 44 (eq. 40 for SGD, eq. 41 for
        Adam)."""
        torch = self.model._torch
        w, state = self._unpack(x, steps_done)
        _, grad = self.model.loss_and_grad(w, features, targets)
        update, new_state = self.optimizer.update(grad, state, w)
        moments = [
            new - old for new, old in zip(self._stored(new_state), self._stored(state), strict=True)
        ]
        return torch.cat([update] + moments)

    def epoch_change(
        self, x: Any, features: Any, targets: Any, batches: list[np.ndarray], steps_done: int
    ) -> Any:
        """``x_{e+1} - x_e`` over one epoch of mini-batches (``sync="epoch"``).

        Inside the epoch the optimizer runs on ``(w, state)`` as an ordinary training loop (no
        flat state per step); the state is packed once, at the end.
        """
        torch = self.model._torch
        w, state = self._unpack(x, steps_done)
        for idx in batches:
            _, grad = self.model.loss_and_grad(w, features[idx], targets[idx])
            update, state = self.optimizer.update(grad, state, w)
            w = w + update
        return torch.cat([w] + self._stored(state)) - x


def run_plan(
    dynamics: OptimizerDynamics,
    x: Any,
    features: Any,
    targets: Any,
    plan: TrainingPlan,
    *,
    apply_change: Callable[[Any, Any], Any] | None = None,
    read_state: Callable[[Any], Any] | None = None,
    on_epoch: Callable[[int, Any], None] | None = None,
) -> Any:
    """Iterate the plan from state ``x``: the plain optimizer, or (with the hooks) its target.

    ``read_state(x)`` gives the original-coordinate state the optimizer works on and
    ``apply_change(x, dx)`` applies a change: identity and ``x + dx`` for plain training,
    ``Pi2_left x~`` and ``x~ + Pi2 dx`` for the target optimizer (eq. 44). ``on_epoch(e, x)``
    is called after every epoch (curves, progress).
    """
    read = read_state or (lambda s: s)
    apply = apply_change or (lambda s, dx: s + dx)
    steps_done = 0
    for e, batches in enumerate(plan.batches(len(features))):
        if plan.sync == "epoch":
            x = apply(x, dynamics.epoch_change(read(x), features, targets, batches, steps_done))
        else:
            for i, idx in enumerate(batches):
                x = apply(x, dynamics.change(read(x), features[idx], targets[idx], steps_done + i))
        steps_done += len(batches)
        if on_epoch is not None:
            on_epoch(e, x)
    return x
