"""Drawing keys with a designed noise law, with or without an algorithm (seed 002, Proposition 1)."""

from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from . import _validation as v
from .errors import InvalidArgumentError
from .keys import Keys
from .privacy import design_noise

#: Largest immersed dimension for which ``keys="auto"`` draws dense keys (block keys are faster
#: above: measured 5.7x at n = 1000).
AUTO_DENSE_LIMIT = 512


@dataclass(frozen=True)
class NoiseTargets:
    """Validated privacy targets and data bounds: what :func:`design_noise` needs."""

    noise: str
    epsilon_input: float
    epsilon_output: float
    delta_input: float | None
    delta_output: float | None
    sensitivity_input: float
    sensitivity_output: float
    noise_mean: float

    @classmethod
    def validated(
        cls,
        *,
        noise: Any,
        epsilon_input: Any,
        epsilon_output: Any,
        delta_input: Any,
        delta_output: Any,
        sensitivity_input: Any,
        sensitivity_output: Any,
        noise_mean: Any,
    ) -> "NoiseTargets":
        """Check every option, naming the bad one."""
        noise = v.one_of("noise", noise, ("laplace", "gaussian"))
        if noise == "laplace":
            for name, val in (("delta_input", delta_input), ("delta_output", delta_output)):
                if val is not None and not (
                    isinstance(val, numbers.Real) and not isinstance(val, bool) and val == 0
                ):
                    raise InvalidArgumentError(
                        name, "Laplace noise gives pure DP (delta = 0); use noise='gaussian'"
                    )
            d_in = d_out = None
        else:
            d_in = v.probability("delta_input", 1e-5 if delta_input is None else delta_input)
            d_out = v.probability("delta_output", 1e-5 if delta_output is None else delta_output)
        if isinstance(noise_mean, bool) or not isinstance(noise_mean, numbers.Real):
            raise InvalidArgumentError(
                "noise_mean", f"expected a finite number, got {noise_mean!r}"
            )
        mean = v.as_float(noise_mean)
        if not math.isfinite(mean):
            raise InvalidArgumentError(
                "noise_mean", f"expected a finite number, got {noise_mean!r}"
            )
        return cls(
            noise,
            v.positive_float("epsilon_input", epsilon_input),
            v.positive_float("epsilon_output", epsilon_output),
            d_in,
            d_out,
            v.positive_float("sensitivity_input", sensitivity_input),
            v.positive_float("sensitivity_output", sensitivity_output),
            mean,
        )

    def design_kwargs(self) -> dict[str, Any]:
        """Everything :func:`design_noise` takes besides the keys and the epsilons."""
        return {
            "noise": self.noise,
            "delta_input": self.delta_input,
            "delta_output": self.delta_output,
            "sensitivity_input": self.sensitivity_input,
            "sensitivity_output": self.sensitivity_output,
            "noise_mean": self.noise_mean,
        }

    def apply(self, keys: Keys, *, scale: float = 1.0) -> Keys:
        """``keys`` with the noise designed for these targets (epsilons multiplied by ``scale``)."""
        return design_noise(
            keys,
            epsilon_input=self.epsilon_input * scale,
            epsilon_output=self.epsilon_output * scale,
            **self.design_kwargs(),
        )


def resolve_rng(rng: Any, secure: bool) -> np.random.Generator:
    """A numpy Generator from ``rng`` (seed, Generator or None), or from OS entropy if ``secure``."""
    if not isinstance(secure, (bool, np.bool_)):
        raise InvalidArgumentError("secure", f"expected True or False, got {secure!r}")
    if secure:
        if rng is not None:
            raise InvalidArgumentError("rng", "pass either rng or secure=True, not both")
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(secrets.randbits(256))))
    if isinstance(rng, (bool, np.bool_)):
        raise InvalidArgumentError(
            "rng", f"expected None, an int seed or a numpy Generator, got {rng!r}"
        )
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        if isinstance(rng, (int, np.integer)) and rng < 0:
            raise InvalidArgumentError("rng", f"expected a non-negative seed, got {rng}")
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise InvalidArgumentError(
        "rng", f"expected None, an int seed or a numpy Generator, got {type(rng).__name__}"
    )


def split_rng(rng: Any, secure: bool) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent streams for the keys and for the noise (same seed -> same keys everywhere)."""
    key_rng, noise_rng = resolve_rng(rng, secure).spawn(2)
    return key_rng, noise_rng


def draw_geometry(
    kind: Any, dims: dict[str, int], block_size: int, rng: np.random.Generator
) -> Keys:
    """Draw and validate keys (no noise law yet); ``kind`` is ``"auto"``, ``"dense"`` or ``"block"``."""
    kind = v.one_of("keys", kind, ("auto", "dense", "block"))
    if kind == "auto":
        largest = max(
            dims["n_state"] + dims["extra_state"],
            dims["n_input"] + dims["extra_input"],
            dims["n_output"] + dims["extra_output"],
        )
        kind = "dense" if largest <= AUTO_DENSE_LIMIT else "block"
    biggest = max(("n_state", "n_input", "n_output"), key=lambda n: dims[n] + dims["extra" + n[1:]])
    size = dims[biggest] + dims["extra" + biggest[1:]]
    v.vector_fits(
        biggest,
        dims[biggest],
        size * (size if kind == "dense" else min(block_size, size)),
        "the keys",
    )
    try:
        keys = Keys.draw(kind=kind, block_size=block_size, rng=rng, **dims)  # type: ignore[arg-type]
    except MemoryError as exc:
        raise InvalidArgumentError(
            biggest, f"keys of these dimensions do not fit in memory ({exc})"
        ) from None
    keys.validate()
    return keys


def validated_dims(**dims: Any) -> dict[str, int]:
    """Check the six dimensions (all integers >= 1, one encoded vector fits in memory), naming the bad one."""
    out = {name: v.positive_int(name, value) for name, value in dims.items()}
    for n_name in ("n_state", "n_input", "n_output"):
        x_name = "extra" + n_name[1:]
        if n_name in out and x_name in out:
            name = n_name if out[n_name] >= out[x_name] else x_name
            v.vector_fits(name, out[name], out[n_name] + out[x_name])
    return out


def validated_design(
    *,
    n_state: Any,
    n_input: Any,
    n_output: Any,
    extra_state: Any,
    extra_input: Any,
    extra_output: Any,
    **targets: Any,
) -> tuple[dict[str, int], NoiseTargets]:
    """The dimensions and the noise targets shared by :func:`immerse` and :func:`draw_keys`, checked."""
    dims = validated_dims(
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
    )
    return dims, NoiseTargets.validated(**targets)


def draw_keys(
    n_state: int,
    n_input: int,
    n_output: int,
    *,
    extra_state: int = 1,
    extra_input: int = 2,
    extra_output: int = 2,
    epsilon_input: float = 1e-3,
    epsilon_output: float = 1e-3,
    sensitivity_input: float = 1.0,
    sensitivity_output: float = 1.0,
    noise: Literal["laplace", "gaussian"] = "laplace",
    delta_input: float | None = None,
    delta_output: float | None = None,
    noise_mean: float = 0.0,
    keys: Literal["auto", "dense", "block"] = "auto",
    block_size: int = 32,
    rng: Any = None,
    secure: bool = False,
) -> Keys:
    """Draw keys with their noise law designed for the targets, without an algorithm.

    Same options and defaults as :func:`immerse`; ``draw_keys(..., rng=s)`` gives the keys
    that ``immerse(..., rng=s)`` would draw. Save them with :func:`save_keys` and pass them to
    ``immerse(..., keys=...)`` later (their noise law is then used as is).

    Examples
    --------
    >>> keys = draw_keys(3, 1, 1, epsilon_input=1e-2, rng=0)
    >>> keys.Pi1.shape, keys.noise_kind, keys.noise_scale > 0
    ((3, 1), 'laplace', True)
    """
    dims, targets = validated_design(
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
        noise=noise,
        epsilon_input=epsilon_input,
        epsilon_output=epsilon_output,
        delta_input=delta_input,
        delta_output=delta_output,
        sensitivity_input=sensitivity_input,
        sensitivity_output=sensitivity_output,
        noise_mean=noise_mean,
    )
    key_rng, _ = split_rng(rng, secure)
    return targets.apply(
        draw_geometry(keys, dims, v.positive_int("block_size", block_size), key_rng)
    )
