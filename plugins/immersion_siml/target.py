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

import numpy as np
from immersion import InvalidArgumentError, NonFiniteError
from immersion.coding.target_codes import TargetCodes
from immersion.integer import as_uint64, check_fraction_bits, largest_magnitude

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

    With float keys the encoded vectors are arrays of ``backend``; with integer keys
    (:class:`~immersion.keys.ModularKeys`, ``fraction_bits`` given) they are ``uint64`` numpy
    arrays modulo ``2^64``: the service decodes ``x_t = 2^-f Pi2_left x~_t`` and the dataset
    exactly, computes the change in float64 on these fixed-point values and adds its encoded
    fixed-point form, ``x~_{t+1} = x~_t + Pi2 q(change)`` (eq. 44 modulo ``2^64``).

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
        An ``immersion`` array backend (torch, float64 for exact decoding; on the CPU for
        integer keys, where it holds the decoded values).
    fraction_bits:
        ``f`` of the fixed-point values ``q(v) = round(v 2^f)``: required with integer keys,
        refused with float keys.
    """

    def __init__(
        self,
        *,
        keys: Any,
        dynamics: OptimizerDynamics,
        layout: SampleLayout,
        backend: Any,
        fraction_bits: int | None = None,
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
        self.arithmetic: str = getattr(keys, "arithmetic", "float")
        if self.arithmetic == "modular":
            if fraction_bits is None:
                raise InvalidArgumentError("fraction_bits", "integer keys need fraction_bits")
            if getattr(backend, "device", "cpu") != "cpu":
                raise InvalidArgumentError(
                    "device", "modular arithmetic runs on the CPU (numpy uint64)"
                )
            self.fraction_bits: int | None = check_fraction_bits(fraction_bits)
            self.codes = TargetCodes.fixed_point(
                keys, self.fraction_bits, state_name="state change", output_name="model"
            )
        else:
            if fraction_bits is not None:
                raise InvalidArgumentError(
                    "fraction_bits", "applies to integer keys (arithmetic='modular') only"
                )
            self.fraction_bits = None
            self.codes = TargetCodes.from_keys(keys, backend)
        self.n_state_encoded = self.codes.n_state_encoded
        self.n_input_encoded = self.codes.n_input_encoded
        self.n_output_encoded = self.codes.n_output_encoded

    @property
    def modular(self) -> bool:
        """True for integer keys (encoded vectors modulo ``2^64``)."""
        return self.arithmetic == "modular"

    def _decoded(self, values: Any) -> Any:
        """A decoded numpy array (modular) as a tensor of the backend; float values pass."""
        return self.backend.asarray(values) if self.modular else values

    def _encoded(self, name: str, value: Any, shape: tuple[int | None, ...]) -> Any:
        if self.modular:
            value = as_uint64(name, value)
        if value.ndim != len(shape) or any(
            want is not None and got != want for got, want in zip(value.shape, shape, strict=True)
        ):
            shown = tuple("N" if want is None else want for want in shape)
            raise InvalidArgumentError(
                name, f"expected shape {shown}, got {tuple(value.shape)}".replace("'", "")
            )
        if not self.modular and not self.backend.all_finite(value):
            raise NonFiniteError(name, "contains NaN or inf")
        return value

    def decoded_dataset(self, encoded_dataset: Any) -> tuple[Any, Any]:
        """``D_bar``: features and target rows from ``Pi1_left y~_i`` (eq. 44)."""
        encoded = self._encoded("encoded_dataset", encoded_dataset, (None, self.n_input_encoded))
        return self.layout.split(self._decoded(self.codes.input_in(encoded)))

    def decoded_state(self, encoded_state: Any) -> Any:
        """``x_t = Pi2_left x~_t`` (modular: ``2^-f Pi2_left x~_t``) as a tensor of the backend."""
        return self._decoded(self.codes.state_in(encoded_state))

    def decoded_params(self, encoded_state: Any) -> Any:
        """``w_t``, the parameter block of ``Pi2_left x~_t`` (what the service evaluates, e.g. for
        curves)."""
        return self.dynamics.params(self.decoded_state(encoded_state))

    def train(
        self,
        encoded_state: Any,
        encoded_dataset: Any,
        plan: TrainingPlan,
        *,
        on_epoch: Callable[[int, Any], None] | None = None,
    ) -> tuple[Any, Any]:
        """Run eq. 44 for the whole plan; return ``(w~*, x~_T)``.

        Parameters
        ----------
        encoded_state:
            ``x~_0`` (eq. 43).
        encoded_dataset:
            ``y~_i``, one row per sample (eq. 42).
        plan:
            The public training plan.
        on_epoch:
            Called as ``on_epoch(e, x~)`` after every epoch with the encoded state.
        """
        encoded_state = self._encoded("encoded_state", encoded_state, (self.n_state_encoded,))
        encoded_dataset = self._encoded(
            "encoded_dataset", encoded_dataset, (None, self.n_input_encoded)
        )
        if encoded_dataset.shape[0] == 0:
            raise InvalidArgumentError("encoded_dataset", "has no samples")
        features, targets = self.decoded_dataset(encoded_dataset)
        if not (self.backend.all_finite(features) and self.backend.all_finite(targets)):
            raise NonFiniteError(
                "encoded_dataset", "is too large: decoding it overflows to inf or NaN"
            )

        def checked_epoch(epoch: int, xt: Any) -> None:
            if not self.modular and not self.backend.all_finite(xt):
                raise NonFiniteError(
                    "plan",
                    f"training diverged to NaN or inf in epoch {epoch + 1} "
                    "(a learning rate or data too large)",
                )
            if on_epoch is not None:
                on_epoch(epoch, xt)

        if self.modular:
            hooks = _FixedPointSteps(self.codes, self.backend, self.fraction_bits or 0)
            read_state, apply_change = hooks.read, hooks.apply
        else:
            state_out = self.codes.state_out
            read_state, apply_change = self.codes.state_in, lambda xt, dx: xt + state_out(dx)
        final = run_plan(
            self.dynamics,
            encoded_state,
            features,
            targets,
            plan,
            read_state=read_state,
            apply_change=apply_change,
            on_epoch=checked_epoch,
        )
        out = self.output(final, encoded_dataset[0])
        if not self.modular and not (
            self.backend.all_finite(out) and self.backend.all_finite(final)
        ):
            raise NonFiniteError(
                "plan", "training diverged to NaN or inf (a learning rate or data too large)"
            )
        return out, final

    def output(self, encoded_state: Any, encoded_first_sample: Any) -> Any:
        """``w~* = Pi3 w_T + Pi4 y~_0`` (eq. 44, output map; modular: ``Pi3 q(w_T) + Pi4 y~_0``).

        Parameters
        ----------
        encoded_state:
            ``x~_T``.
        encoded_first_sample:
            ``y~_0``, the first encoded sample (its noise masks the model, eq. 17's ``Pi4 y~``).
        """
        w = self.decoded_params(encoded_state)
        if self.modular:
            w = w.detach().cpu().numpy()
        return self.codes.output_out(w) + self.codes.mask(encoded_first_sample)


class _FixedPointSteps:
    """``run_plan``'s hooks modulo ``2^64``: decode ``x_t`` exactly, add ``Pi2 q(change)``.

    The new state ``q(x_t) + q(change)`` is refused (naming ``state``) before it could wrap: when
    ``|x_t| + |change|`` reaches ``2^(62 - f)`` in some entry (one bit of margin below the
    largest fixed-point magnitude ``2^(63 - f)``, so that rounding cannot cross it).
    """

    def __init__(self, codes: TargetCodes, backend: Any, fraction_bits: int) -> None:
        self._codes, self._backend = codes, backend
        self._limit = largest_magnitude(fraction_bits, headroom_bits=1)
        self._x: np.ndarray = np.zeros(0)

    def read(self, encoded_state: np.ndarray) -> Any:
        self._x = self._codes.state_in(encoded_state)
        return self._backend.asarray(self._x)

    def apply(self, encoded_state: np.ndarray, change: Any) -> np.ndarray:
        dx = change.detach().cpu().numpy()
        if not np.isfinite(dx).all():
            raise NonFiniteError("plan", "training diverged to NaN or inf")
        reach = float((np.abs(self._x) + np.abs(dx)).max(initial=0.0))
        if not reach < self._limit:
            raise InvalidArgumentError(
                "state",
                f"the optimizer state (weights and moments) would reach {reach:.6g}, but fixed "
                f"point keeps magnitudes below {self._limit:.6g} here: use fewer fraction_bits, "
                "a smaller lr or smaller data",
            )
        return encoded_state + self._codes.state_out(dx)
