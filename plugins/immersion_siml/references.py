"""The plain runs a SIML run is compared with: float training, and its fixed-point twin.

* Float arithmetic: :func:`plain_training` is the ordinary optimizer loop on the same data,
  initial weights and batches (no encoding); the decoded model equals it to rounding.
* Modular arithmetic (``arithmetic="modular"``): the service computes on fixed-point values
  ``q(v) 2^-f`` and adds ``Pi2 q(change)`` to the encoded state (eq. 44 modulo ``2^64``).
  :func:`plain_training` with ``fraction_bits`` is the same computation without any key: the
  dataset and the initial state rounded to the grid ``2^-f Z`` once, every target step's change
  rounded to it (per epoch or per mini-batch, as the plan's ``sync`` says), the state kept as
  integers modulo ``2^64``, the returned model rounded once more (the service encodes
  ``q(w_T)``). The decoded model equals this twin bit for bit; its distance to float training is
  the quantisation carried through training.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
from immersion.integer import decode_fixed, encode_fixed, quantise

from .dynamics import OptimizerDynamics, TrainingPlan, run_plan
from .target import SampleLayout


def plain_training(
    dynamics: OptimizerDynamics,
    x0: Any,
    features: Any,
    targets: Any,
    plan: TrainingPlan,
    *,
    layout: SampleLayout,
    fraction_bits: int | None = None,
    on_epoch: Callable[[int, Any], None] | None = None,
) -> Any:
    """Train plainly from state ``x0``; return the final parameters ``w_T`` (a tensor).

    Parameters
    ----------
    dynamics:
        The optimizer as a dynamical system (the one the service runs).
    x0:
        The plain initial state ``(w_0, zero moments)`` (a float64 tensor).
    features, targets:
        The training set as the user holds it: features ``(N, ...)``, target rows ``(N, C)``.
    plan:
        The training plan (batches and their order, optimizer, ``sync``).
    layout:
        How a sample row is laid out (the service quantises whole rows).
    fraction_bits:
        None: float training (one ordinary loop per epoch). An integer ``f``: the fixed-point
        twin of the modular service (module docstring).
    on_epoch:
        Called as ``on_epoch(e, w_e)`` after every epoch with the parameters (a tensor).

    Examples
    --------
    >>> import torch
    >>> from immersion_fl.runtime.optimizers import sgd
    >>> from immersion_siml.models import SimlModel
    >>> net = torch.nn.Linear(2, 2).double()
    >>> dyn = OptimizerDynamics(SimlModel(net, loss="mse"), sgd(0.1))
    >>> x0 = dyn.initial_state(torch.nn.utils.parameters_to_vector(net.parameters()).detach())
    >>> X, Y = torch.randn(8, 2, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    >>> plan, layout = TrainingPlan(optimizer="sgd", epochs=2, batch_size=4), SampleLayout((2,), 2)
    >>> w = plain_training(dyn, x0, X, Y, plan, layout=layout, fraction_bits=20)
    >>> bool((w * 2**20 == torch.round(w * 2**20)).all())  # on the grid 2^-20 Z
    True
    """
    import torch

    def report(e: int, params: Any) -> None:
        if on_epoch is not None:
            on_epoch(e, params)

    if fraction_bits is None:
        final = run_plan(
            dynamics,
            x0,
            features,
            targets,
            dataclasses.replace(plan, sync="epoch"),  # the plain loop (no encoding)
            on_epoch=lambda e, x: report(e, dynamics.params(x).clone()),
        )
        return dynamics.params(final)
    f = fraction_bits
    rows = layout.rows(features, targets).detach().cpu().numpy()
    q_features, q_targets = layout.split(torch.from_numpy(quantise(rows, f, name="dataset")))

    def read(q: np.ndarray) -> Any:
        return torch.from_numpy(decode_fixed(q, f))

    def apply(q: np.ndarray, change: Any) -> np.ndarray:
        return q + encode_fixed(change.detach().cpu().numpy(), f, name="state change")

    final = run_plan(
        dynamics,
        encode_fixed(x0.detach().cpu().numpy(), f, name="model"),
        q_features,
        q_targets,
        plan,
        read_state=read,
        apply_change=apply,
        on_epoch=lambda e, q: report(e, dynamics.params(read(q))),
    )
    w_final = dynamics.params(decode_fixed(final, f))
    return torch.from_numpy(quantise(w_final, f, name="model"))
