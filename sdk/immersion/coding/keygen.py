"""Drawing keys with a designed noise law, with or without an algorithm (seed 002,
Proposition 1)."""

from __future__ import annotations

import math
import numbers
import secrets
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .. import validation as v
from ..errors import ImmersionSecurityWarning, InvalidArgumentError
from ..keys import Keys

if TYPE_CHECKING:
    from ..keys.modular import ModularKeys
from ..privacy import design_noise

#: Largest immersed dimension for which ``keys="auto"`` draws dense keys (block keys are faster
#: above: measured 5.7x at n = 1000).
AUTO_DENSE_LIMIT = 512
#: Default block size of float block keys.
FLOAT_BLOCK_SIZE = 32


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
    """A numpy Generator from ``rng`` (seed, Generator or None), or from OS entropy if
    ``secure``."""
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


#: Codings that already warned about a seeded key in this process.
_WARNED_SEEDED: set[str] = set()


def warn_seeded_key(rng: Any, coding: str) -> None:
    """Warn once per process and coding when a cryptographic key is derived from ``rng``.

    Parameters
    ----------
    rng:
        The user's ``rng`` argument (None: OS entropy, no warning).
    coding:
        The coding whose key it seeds (named in the message).
    """
    if rng is None or coding in _WARNED_SEEDED:
        return
    _WARNED_SEEDED.add(coding)
    warnings.warn(
        f"coding={coding!r} with a seeded rng: the secret key is derived from the seed, so "
        "anyone who guesses the seed decrypts everything. Seeds are for tests and reproducible "
        "benchmarks; leave rng out (OS entropy) or pass secure=True",
        ImmersionSecurityWarning,
        stacklevel=4,  # the caller of encrypt_controller
    )


def split_rng(rng: Any, secure: bool) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent streams for the keys and for the noise (same seed -> same keys everywhere)."""
    key_rng, noise_rng = resolve_rng(rng, secure).spawn(2)
    return key_rng, noise_rng


def draw_geometry(
    kind: Any,
    dims: dict[str, int],
    block_size: int,
    rng: np.random.Generator,
    *,
    arithmetic: str = "float",
) -> Any:
    """Draw and validate keys (float: no noise law yet); ``kind`` is ``"auto"``, ``"dense"`` or
    ``"block"``. ``arithmetic="modular"`` draws :class:`~immersion.keys.ModularKeys`.
    """
    from ..keys.modular import ModularKeys

    kind = v.one_of("keys", kind, ("auto", "dense", "block"))
    sizes = {n: dims[n] + dims["extra" + n[1:]] for n in ("n_state", "n_input", "n_output")}
    biggest = max(sizes, key=lambda n: sizes[n])
    size = sizes[biggest]
    if kind == "auto":
        kind = "dense" if size <= AUTO_DENSE_LIMIT else "block"
    entries = size * (size if kind == "dense" else min(block_size, size))
    # integer keys keep each block with its inverse (dense: K and K^-1 split in four matrices)
    modular = arithmetic == "modular"
    v.vector_fits(biggest, dims[biggest], 2 * entries if modular else entries, "the keys")
    try:
        keys = (ModularKeys if modular else Keys).draw(
            kind=kind,  # type: ignore[arg-type]
            block_size=block_size,
            rng=rng,
            **dims,
        )
    except MemoryError as exc:
        raise InvalidArgumentError(
            biggest, f"keys of these dimensions do not fit in memory ({exc})"
        ) from None
    keys.validate()
    return keys


#: Options that shape the float arithmetic's noise and precision, with their defaults: under
#: ``arithmetic="modular"`` (uniform noise modulo 2^64, per-element epsilon 0, exact decoding) a
#: value other than the default is refused instead of silently ignored.
FLOAT_ONLY_DEFAULTS: dict[str, Any] = {
    "epsilon_input": 1e-3,
    "epsilon_output": 1e-3,
    "sensitivity_input": 1.0,
    "sensitivity_output": 1.0,
    "noise": "laplace",
    "delta_input": None,
    "delta_output": None,
    "noise_mean": 0.0,
}


def checked_arithmetic(
    arithmetic: Any, fraction_bits: Any, float_options: dict[str, Any]
) -> tuple[str, int | None]:
    """``(arithmetic, fraction_bits)`` checked against the other options (naming the bad one).

    ``fraction_bits`` belongs to ``arithmetic="modular"`` (default 32); the noise-design options
    in :data:`FLOAT_ONLY_DEFAULTS` belong to ``arithmetic="float"``.
    """
    from ..integer import DEFAULT_FRACTION_BITS, check_fraction_bits

    arithmetic = v.one_of("arithmetic", arithmetic, ("float", "modular"))
    if arithmetic == "float":
        if fraction_bits is not None:
            raise InvalidArgumentError(
                "fraction_bits", "applies to arithmetic='modular' only (fixed-point integers)"
            )
        return arithmetic, None
    for name, value in float_options.items():
        default = FLOAT_ONLY_DEFAULTS[name]
        if value is not default and not (
            isinstance(value, type(default)) and not isinstance(value, bool) and value == default
        ):
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
    """The dimensions and the noise targets shared by :func:`immerse` and :func:`draw_keys`,
    checked."""
    dims = validated_dims(
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
    )
    return dims, NoiseTargets.validated(**targets)


def validated_arithmetic_design(
    *, arithmetic: Any, fraction_bits: Any, block_size: Any, **options: Any
) -> tuple[dict[str, int], NoiseTargets | None, int | None, int]:
    """What :func:`immerse` and :func:`draw_keys` check first.

    Returns ``(dims, targets, fraction_bits, block_size)``: ``targets`` is None for the modular
    arithmetic, ``fraction_bits`` is None for the float one.
    """
    name, bits = checked_arithmetic(
        arithmetic, fraction_bits, {k: options[k] for k in FLOAT_ONLY_DEFAULTS}
    )
    block = v.positive_int("block_size", default_block_size(block_size, name))
    if name == "modular":
        dims = validated_dims(
            **{k: val for k, val in options.items() if k not in FLOAT_ONLY_DEFAULTS}
        )
        return dims, None, bits, block
    dims, targets = validated_design(**options)
    return dims, targets, None, block


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
    block_size: int | None = None,
    arithmetic: Literal["float", "modular"] = "float",
    rng: Any = None,
    secure: bool = False,
) -> "Keys | ModularKeys":
    """Draw keys with their noise law designed for the targets, without an algorithm.

    Same options and defaults as :func:`immerse`; ``draw_keys(..., rng=s)`` gives the keys
    that ``immerse(..., rng=s)`` would draw. Save them with :func:`save_keys` and pass them to
    ``immerse(..., keys=...)`` later (their noise law is then used as is).
    ``arithmetic="modular"`` draws integer keys invertible modulo 2^64
    (:class:`~immersion.keys.ModularKeys`; the noise options do not apply). Modular keys take
    no ``fraction_bits``: the fixed-point scale is not part of the keys, it is set when they are
    used, ``immerse(..., keys=keys, arithmetic="modular", fraction_bits=f)`` (default 32).

    Parameters
    ----------
    n_state, n_input, n_output:
        Dimensions of x, y and u.
    extra_state, extra_input, extra_output:
        Added dimensions (>= 1): the immersed sizes are ``n + extra``.
    epsilon_input, epsilon_output:
        Per-element DP targets for y~ and u~ (seed 002 Theorem 1; seed 000 Theorem 2 if Gaussian).
    sensitivity_input, sensitivity_output:
        Sensitivities of y and u (L1 for Laplace, L2 for Gaussian).
    noise, delta_input, delta_output, noise_mean:
        Law of ``s_k``: Laplace (default, scale designed from epsilon) or Gaussian (needs deltas,
        default 1e-5); ``noise_mean`` is the mean ``mu`` of ``s_k``.
    keys:
        ``"dense"``, ``"block"`` (structured, for large dimensions) or ``"auto"`` (dense up to
        512 immersed entries).
    block_size:
        Block size of structured keys; default 32 for float keys, 16 for integer keys.
    arithmetic:
        ``"float"`` (float64 keys, designed noise) or ``"modular"`` (integer keys modulo 2^64).
    rng, secure:
        Seed or Generator for the keys and the noise law; ``secure=True`` draws from 256 bits of
        OS entropy.

    Returns
    -------
    Keys or ModularKeys
        The keys with their noise law.

    Examples
    --------
    >>> keys = draw_keys(3, 1, 1, epsilon_input=1e-2, rng=0)
    >>> keys.Pi1.shape, keys.noise_kind, keys.noise_scale > 0
    ((3, 1), 'laplace', True)
    >>> draw_keys(3, 1, 1, arithmetic="modular", rng=0).Pi1.dtype.name
    'uint64'
    """
    dims, targets, _, block = validated_arithmetic_design(
        arithmetic=arithmetic,
        fraction_bits=None,
        block_size=block_size,
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
    if targets is None:
        return draw_geometry(keys, dims, block, split_rng(rng, secure)[0], arithmetic="modular")
    key_rng, _ = split_rng(rng, secure)
    return targets.apply(draw_geometry(keys, dims, block, key_rng))


def default_block_size(block_size: Any, arithmetic: str) -> Any:
    """``block_size`` or, if None, 32 for float keys, 16 for integer keys (stored with inverses)."""
    from ..keys.modular import MODULAR_BLOCK_SIZE

    if block_size is not None:
        return block_size
    return MODULAR_BLOCK_SIZE if arithmetic == "modular" else FLOAT_BLOCK_SIZE
