"""The cloud side of SIML: the target optimizer of seed 002 eq. 44 (Corollary 1, two time scales).

The service receives the encoded dataset ``y~_i = Pi1 y_i + N1 s_i`` (eq. 42) once and the
encoded initial state ``x~_0 = Pi2 x_0`` (eq. 43), iterates

    x~_{t+1} = x~_t - Pi2 p(Pi2_left x~_t, D_bar),   D_bar = {Pi1_left y~_i}      (eq. 44)

and returns ``w~* = Pi3 w_T + Pi4 y~_0`` with ``w_T`` the parameter block of ``Pi2_left x~_T``.
``D_bar`` is the same at every step (the dataset is uploaded once), so it is computed once.

What this protects, honestly: the service holds ``Pi1_left`` and ``Pi2_left`` (eq. 44 needs
them), so it sees the decoded data and every model iterate; the encoding protects the dataset
file and the returned model against parties without the target (links, storage), element by
element (Theorem 1). See THREAT_MODEL.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from immersion import InvalidArgumentError, Keys, NonFiniteError

from .dynamics import OptimizerDynamics, TrainingPlan, run_plan


class SampleLayout:
    """One dataset row ``y_i = (flattened features, target row)`` (eq. 42's ``y_i``).

    ``n_sample = prod(feature_shape) + n_targets``. Features may have any shape (an image
    ``(C, H, W)``, a tabular row ``(F,)``, a sequence ``(T, F)``, or ``()`` for one number per
    sample); targets are one-hot or probability rows of width ``n_targets`` (integer class
    labels are one-hot encoded by :meth:`rows`).

    Examples
    --------
    >>> import torch
    >>> layout = SampleLayout((1, 2, 2), 3)
    >>> rows = layout.rows(torch.ones(2, 1, 2, 2, dtype=torch.float64), torch.tensor([0, 2]))
    >>> rows.shape, rows[1, 4:].tolist()
    (torch.Size([2, 7]), [0.0, 0.0, 1.0])
    >>> features, targets = SampleLayout((3,), 2).split(torch.arange(10.0).reshape(2, 5))
    >>> features.tolist(), targets.tolist()
    ([[0.0, 1.0, 2.0], [5.0, 6.0, 7.0]], [[3.0, 4.0], [8.0, 9.0]])
    """

    def __init__(self, feature_shape: tuple[int, ...], n_targets: int) -> None:
        self.feature_shape = tuple(int(s) for s in feature_shape)
        self.n_targets = int(n_targets)
        self.n_features = math.prod(self.feature_shape)
        self.n_sample = self.n_features + self.n_targets

    def rows(self, features: Any, targets: Any) -> Any:
        """Stack features ``(N, *feature_shape)`` and targets (integer labels ``(N,)`` or rows
        ``(N, n_targets)``) into rows ``(N, n_sample)``."""
        import torch

        if targets.ndim == 1:
            targets = torch.nn.functional.one_hot(targets.long(), self.n_targets)
        return torch.cat([features.reshape(len(features), -1), targets.to(features.dtype)], dim=1)

    def split(self, rows: Any) -> tuple[Any, Any]:
        """``(features, targets)`` from rows: the inverse of :meth:`rows` (targets stay rows)."""
        features = rows[:, : self.n_features].reshape((-1,) + self.feature_shape)
        return features, rows[:, self.n_features :]


class TargetOptimizer:
    """Eq. 44 on one backend: what the training service runs. Holds no ``N1``, ``Pi3_left``, noise.

    Parameters
    ----------
    keys:
        The geometry of the user's keys (``n_input`` = sample size, ``n_state`` = optimizer state
        size, ``n_output`` = number of model parameters); any noise law is ignored.
    dynamics:
        The plain optimizer (:class:`OptimizerDynamics`), built from public model and plan.
    layout:
        How a decoded row splits into features and target row.
    backend:
        An ``immersion`` array backend (torch, float64 for exact decoding).
    """

    def __init__(
        self, *, keys: Keys, dynamics: OptimizerDynamics, layout: SampleLayout, backend: Any
    ) -> None:
        dims = keys.dims
        expected = {
            "n_input": layout.n_sample,
            "n_state": dynamics.n_state,
            "n_output": dynamics.n_params,
        }
        got = {k: dims[k] for k in expected}
        if got != expected:
            raise InvalidArgumentError(
                "keys", f"were drawn for {got}, but this model and dataset need {expected}"
            )
        self.dynamics, self.layout, self.backend = dynamics, layout, backend
        self.n_state_encoded = keys.state_code.n_total
        self.n_input_encoded = keys.input_code.n_total
        self.n_output_encoded = keys.output_code.n_total
        self._input_in = keys.input_code.decoder(backend)
        self._state_in = keys.state_code.decoder(backend)
        self._state_out = keys.state_code.encoder(backend)
        self._output_out = keys.output_code.encoder(backend)
        self._mask = keys.mask.operator(keys.input_code, keys.output_code, backend)  # type: ignore[arg-type]

    def decoded_dataset(self, encoded_dataset: Any) -> tuple[Any, Any]:
        """``D_bar``: features and target rows from ``Pi1_left y~_i`` (eq. 44)."""
        if tuple(encoded_dataset.shape[1:]) != (self.n_input_encoded,) or encoded_dataset.ndim != 2:
            raise InvalidArgumentError(
                "encoded_dataset",
                f"expected shape (N, {self.n_input_encoded}), got {tuple(encoded_dataset.shape)}",
            )
        return self.layout.split(self._input_in(encoded_dataset))

    def decoded_params(self, encoded_state: Any) -> Any:
        """``w_t``, the parameter block of ``Pi2_left x~_t`` (what the service evaluates, e.g. for
        curves)."""
        return self.dynamics.params(self._state_in(encoded_state))

    def train(
        self,
        encoded_state: Any,
        encoded_dataset: Any,
        plan: TrainingPlan,
        *,
        on_epoch: Callable[[int, Any], None] | None = None,
    ) -> tuple[Any, Any]:
        """Run eq. 44 for the whole plan; return ``(w~*, x~_T)``.

        ``on_epoch(e, x~)`` is called after every epoch with the encoded state.
        """
        if tuple(encoded_state.shape) != (self.n_state_encoded,):
            raise InvalidArgumentError(
                "encoded_state",
                f"expected shape ({self.n_state_encoded},), got {tuple(encoded_state.shape)}",
            )
        if encoded_dataset.ndim == 2 and encoded_dataset.shape[0] == 0:
            raise InvalidArgumentError("encoded_dataset", "has no samples")
        for name, value in (("encoded_state", encoded_state), ("encoded_dataset", encoded_dataset)):
            if not self.backend.all_finite(value):
                raise NonFiniteError(name, "contains NaN or inf")
        features, targets = self.decoded_dataset(encoded_dataset)
        if not (self.backend.all_finite(features) and self.backend.all_finite(targets)):
            raise NonFiniteError(
                "encoded_dataset", "is too large: decoding it overflows to inf or NaN"
            )
        state_out = self._state_out

        def checked_epoch(epoch: int, xt: Any) -> None:
            if not self.backend.all_finite(xt):
                raise NonFiniteError(
                    "plan",
                    f"training diverged to NaN or inf in epoch {epoch + 1} "
                    "(a learning rate or data too large)",
                )
            if on_epoch is not None:
                on_epoch(epoch, xt)

        final = run_plan(
            self.dynamics,
            encoded_state,
            features,
            targets,
            plan,
            read_state=self._state_in,
            apply_change=lambda xt, dx: xt + state_out(dx),
            on_epoch=checked_epoch,
        )
        out = self.output(final, encoded_dataset[0])
        if not (self.backend.all_finite(out) and self.backend.all_finite(final)):
            raise NonFiniteError(
                "plan", "training diverged to NaN or inf (a learning rate or data too large)"
            )
        return out, final

    def output(self, encoded_state: Any, encoded_first_sample: Any) -> Any:
        """``w~* = Pi3 w_T + Pi4 y~_0`` (eq. 44, output map)."""
        return self._output_out(self.decoded_params(encoded_state)) + self._mask(
            encoded_first_sample
        )
