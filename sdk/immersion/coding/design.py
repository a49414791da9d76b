"""``Design``: the dimensions and coding options of an immersion, checked once (seed 002, Prop. 1).

:func:`~immersion.immerse` and :func:`~immersion.draw_keys` take either these options as keywords
or one :class:`Design` (``design=``); both build the same value and draw from it, so a design is
written, defaulted and validated in one place. The modular arithmetic's restrictions (float-only
noise options, numpy backend) are checked here too.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .. import validation as v
from ..backends import check_backend_names
from ..errors import InvalidArgumentError
from ..integer import DEFAULT_FRACTION_BITS, check_fraction_bits
from ..keys import Keys
from ..keys.modular import MODULAR_BLOCK_SIZE
from ..privacy import design_noise
from .keygen import FLOAT_BLOCK_SIZE, draw_geometry

if TYPE_CHECKING:
    from ..keys.modular import ModularKeys

__all__ = ["Design", "NoiseTargets", "design_from"]

#: The three signal dimensions and their added (noise) dimensions, in the keys' order.
DIMENSIONS = ("n_state", "n_input", "n_output", "extra_state", "extra_input", "extra_output")
#: Options that shape the float arithmetic's noise: under ``arithmetic="modular"`` (uniform noise
#: modulo 2^64, per-element epsilon 0, exact decoding) a value other than the default is refused
#: instead of silently ignored.
FLOAT_ONLY = (
    "epsilon_input",
    "epsilon_output",
    "sensitivity_input",
    "sensitivity_output",
    "noise",
    "delta_input",
    "delta_output",
    "noise_mean",
)


@dataclass(frozen=True)
class NoiseTargets:
    """Validated privacy targets and data bounds: what :func:`design_noise` needs.

    Parameters
    ----------
    noise : str
        ``"laplace"`` or ``"gaussian"``.
    epsilon_input, epsilon_output : float
        Per-element DP targets of ``y~`` and ``u~``.
    delta_input, delta_output : float or None
        Gaussian deltas (None for Laplace).
    sensitivity_input, sensitivity_output : float
        Sensitivities of ``y`` and ``u``.
    noise_mean : float
        Mean ``mu`` of ``s_k``.
    """

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
        """``keys`` with the noise designed for these targets (epsilons multiplied by ``scale``).

        Parameters
        ----------
        keys : Keys
            Float keys (their noise law is replaced).
        scale : float
            Factor on both epsilons.
        """
        return design_noise(
            keys,
            epsilon_input=self.epsilon_input * scale,
            epsilon_output=self.epsilon_output * scale,
            **self.design_kwargs(),
        )


@dataclass(frozen=True)
class Design:
    """The dimensions and coding options of an immersion, validated once.

    The value that :func:`~immersion.immerse` and :func:`~immersion.draw_keys` build from their
    keyword options, or take whole as ``design=``: ``immerse(f, g, design=d, rng=s)`` equals
    ``immerse(f, g, n_state, n_input, n_output, **options, rng=s)`` bit for bit, and
    ``draw_keys(design=d, rng=s)`` gives its keys. Defaults are resolved on construction
    (``block_size``, ``fraction_bits``, Gaussian deltas), so two equal designs draw equal keys.

    Parameters
    ----------
    n_state, n_input, n_output : int
        Dimensions of x, y and u.
    extra_state, extra_input, extra_output : int
        Added dimensions (>= 1): the immersed sizes are ``n + extra``.
    epsilon_input, epsilon_output : float
        Per-element DP targets for y~ and u~ (seed 002 Theorem 1; seed 000 Theorem 2 if
        Gaussian).
    sensitivity_input, sensitivity_output : float
        Sensitivities of y and u (L1 for Laplace, L2 for Gaussian).
    noise, delta_input, delta_output, noise_mean
        Law of ``s_k``: ``"laplace"`` (default, scale designed from epsilon) or ``"gaussian"``
        (needs deltas, default 1e-5); ``noise_mean`` is the mean ``mu`` of ``s_k``.
    keys : {"auto", "dense", "block"}
        Kind of keys to draw: dense, block-structured (for large dimensions) or ``"auto"``
        (dense up to 512 immersed entries).
    block_size : int or None
        Block size of block keys; None: 32 for float keys, 16 for integer keys.
    arithmetic : {"float", "modular"}
        Float64 keys with designed noise, or fixed-point integers modulo ``2^64``
        (:mod:`immersion.coding.modular`; the noise options above must keep their defaults).
    fraction_bits : int or None
        Fixed-point bits under ``arithmetic="modular"`` (None: 32); refused with ``"float"``.
    tolerance : float or None
        Largest acceptable estimated decode error (float only; None: no check).
    backend, device, dtype
        Array backend of the handle: ``"numpy"`` (float64) or ``"torch"`` (``device``
        ``"cpu"``/``"cuda"``, float32/float64); modular arithmetic runs on numpy.
    n_public : int or None
        Size of the public signal ``w`` for the shape probe.

    Raises
    ------
    InvalidArgumentError
        Naming the first bad option, with the message :func:`~immersion.immerse` gives.

    Examples
    --------
    >>> from immersion import Design, draw_keys
    >>> d = Design(2, 1, 1, epsilon_input=1e-2)
    >>> d.immersed_sizes, d.block_size
    ((3, 3, 3), 32)
    >>> draw_keys(design=d, rng=0).noise_kind
    'laplace'
    >>> Design(2, 1, 1, extra_input=0)
    Traceback (most recent call last):
    ...
    immersion.errors.InvalidArgumentError: extra_input: expected an integer >= 1, got 0
    """

    n_state: int
    n_input: int
    n_output: int
    extra_state: int = 1
    extra_input: int = 2
    extra_output: int = 2
    epsilon_input: float = 1e-3
    epsilon_output: float = 1e-3
    sensitivity_input: float = 1.0
    sensitivity_output: float = 1.0
    noise: Literal["laplace", "gaussian"] = "laplace"
    delta_input: float | None = None
    delta_output: float | None = None
    noise_mean: float = 0.0
    keys: Literal["auto", "dense", "block"] = "auto"
    block_size: int | None = None
    arithmetic: Literal["float", "modular"] = "float"
    fraction_bits: int | None = None
    tolerance: float | None = 1e-6
    backend: str = "numpy"
    device: Any = None
    dtype: str | None = None
    n_public: int | None = None

    def __post_init__(self) -> None:
        arithmetic, bits = checked_arithmetic(
            self.arithmetic, self.fraction_bits, {k: getattr(self, k) for k in FLOAT_ONLY}
        )
        resolved: dict[str, Any] = {"arithmetic": arithmetic, "fraction_bits": bits}
        resolved["block_size"] = v.positive_int(
            "block_size", default_block_size(self.block_size, arithmetic)
        )
        resolved |= validated_dims(**{k: getattr(self, k) for k in DIMENSIONS})
        if arithmetic == "float":
            targets = NoiseTargets.validated(**{k: getattr(self, k) for k in FLOAT_ONLY})
            resolved |= dataclasses.asdict(targets)
            if self.tolerance is not None:
                resolved["tolerance"] = v.positive_float("tolerance", self.tolerance)
        else:
            _check_modular_backend(self.backend, self.device, self.dtype)
        resolved["keys"] = v.one_of("keys", self.keys, ("auto", "dense", "block"))
        if self.n_public is not None:
            resolved["n_public"] = v.positive_int("n_public", self.n_public)
        check_backend_names(self.backend, self.dtype, self.device)
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    @property
    def dims(self) -> dict[str, int]:
        """The six dimensions by name (what :meth:`Keys.draw` takes)."""
        return {name: getattr(self, name) for name in DIMENSIONS}

    @property
    def immersed_sizes(self) -> tuple[int, int, int]:
        """Sizes of the encoded state, input and output (``n + extra``)."""
        return (
            self.n_state + self.extra_state,
            self.n_input + self.extra_input,
            self.n_output + self.extra_output,
        )

    @property
    def targets(self) -> NoiseTargets | None:
        """The noise design's targets, or None under ``arithmetic="modular"``."""
        if self.arithmetic == "modular":
            return None
        return NoiseTargets(**{k: getattr(self, k) for k in FLOAT_ONLY})

    def draw(self, key_stream: np.random.Generator) -> "Keys | ModularKeys":
        """Keys of this design drawn from ``key_stream``, used as is: float keys with their
        noise law designed for :attr:`targets`, or integer keys.

        :func:`~immersion.draw_keys` and :func:`~immersion.immerse` pass the first of the two
        streams split from their ``rng`` (the second draws the encoding noise).

        Parameters
        ----------
        key_stream : numpy.random.Generator
            The stream the keys are drawn from.

        Returns
        -------
        Keys or ModularKeys
            Validated keys.
        """
        block_size = self.block_size
        assert block_size is not None  # resolved on construction
        keys = draw_geometry(
            self.keys, self.dims, block_size, key_stream, arithmetic=self.arithmetic
        )
        targets = self.targets
        return keys if targets is None else targets.apply(keys)


def design_from(design: Any, **given: Any) -> Design:
    """``design`` if given (checked to be a :class:`Design` and to leave every option in
    ``given`` unset), else ``Design(**given)``: how :func:`~immersion.immerse` and
    :func:`~immersion.draw_keys` read their two call forms.

    Parameters
    ----------
    design : Design or None
        The caller's ``design=``.
    **given
        The caller's dimensions and options by name (dimensions None when left out).
    """
    if design is None:
        for name in ("n_state", "n_input", "n_output"):
            if given[name] is None:
                raise InvalidArgumentError(
                    name, "is required: pass the three dimensions or design=Design(...)"
                )
        return Design(**given)
    if not isinstance(design, Design):
        raise InvalidArgumentError(
            "design", f"expected an immersion.Design, got {type(design).__name__}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(Design)}
    for name, value in given.items():
        default = None if name in DIMENSIONS[:3] else defaults[name]
        if not _is_default(value, default):
            raise InvalidArgumentError(
                name, "is part of design=: set it in Design(...) or leave design= out"
            )
    return design


def _is_default(value: Any, default: Any) -> bool:
    """``value`` is ``default`` or equals it with the same type (``1`` is not ``1.0``)."""
    return value is default or (
        isinstance(value, type(default)) and not isinstance(value, bool) and value == default
    )


def checked_arithmetic(
    arithmetic: Any, fraction_bits: Any, float_options: dict[str, Any]
) -> tuple[str, int | None]:
    """``(arithmetic, fraction_bits)`` checked against the other options (naming the bad one).

    ``fraction_bits`` belongs to ``arithmetic="modular"`` (default 32); the noise-design options
    in :data:`FLOAT_ONLY` belong to ``arithmetic="float"`` (their defaults: :class:`Design`'s).
    """
    arithmetic = v.one_of("arithmetic", arithmetic, ("float", "modular"))
    if arithmetic == "float":
        if fraction_bits is not None:
            raise InvalidArgumentError(
                "fraction_bits", "applies to arithmetic='modular' only (fixed-point integers)"
            )
        return arithmetic, None
    defaults = {f.name: f.default for f in dataclasses.fields(Design)}
    for name, value in float_options.items():
        if not _is_default(value, defaults[name]):
            raise InvalidArgumentError(
                name,
                "applies to arithmetic='float' only: modular coding draws noise uniform modulo "
                "2^64 (per-element epsilon 0 whatever the data) and decodes exactly",
            )
    fb = DEFAULT_FRACTION_BITS if fraction_bits is None else fraction_bits
    return arithmetic, check_fraction_bits(fb)


def validated_dims(**dims: Any) -> dict[str, int]:
    """Check the six dimensions (all integers >= 1, one encoded vector fits in memory), naming the
    bad one."""
    out = {name: v.positive_int(name, value) for name, value in dims.items()}
    for n_name in ("n_state", "n_input", "n_output"):
        x_name = "extra" + n_name[1:]
        if n_name in out and x_name in out:
            name = n_name if out[n_name] >= out[x_name] else x_name
            v.vector_fits(name, out[name], out[n_name] + out[x_name])
    return out


def default_block_size(block_size: Any, arithmetic: str) -> Any:
    """``block_size`` or, if None, 32 for float keys, 16 for integer keys (stored with inverses)."""
    if block_size is not None:
        return block_size
    return MODULAR_BLOCK_SIZE if arithmetic == "modular" else FLOAT_BLOCK_SIZE


def _check_modular_backend(name: Any, device: Any, dtype: Any) -> None:
    """Modular arithmetic runs on numpy uint64 with ``f`` and ``g`` in float64."""
    for option, value, allowed in (
        ("backend", name, ("numpy",)),
        ("device", device, (None, "cpu")),
        ("dtype", dtype, (None, "float64")),
    ):
        if value not in allowed:
            raise InvalidArgumentError(
                option,
                f"modular arithmetic runs on numpy uint64 with f and g in float64; got {value!r}",
            )
