"""``immerse(f, g)``: the affine immersion of seed 002 (Proposition 1, eqs. 16-18; Corollary 1).

User side: :class:`Immersion` (keys, encoder, decoder, report; :mod:`immersion.coding.handle`).
Cloud side: :class:`TargetAlgorithm`, which carries only what eq. 17 needs
(:mod:`immersion.coding.target`). :func:`immerse` is the one place that picks the arithmetic: it
sits above the float design (:class:`FloatDesign`) and the modular variant
(:mod:`immersion.coding.modular`), which import nothing from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from .. import validation as v
from ..backends import ArrayBackend, make_backend
from ..errors import InvalidArgumentError
from ..keys import Keys, ModularKeys
from ..privacy.precision import refuse_infeasible_precision
from .handle import Immersion
from .keygen import (
    NoiseTargets,
    draw_geometry,
    split_rng,
    validated_arithmetic_design,
)
from .modular import ModularImmersion, ModularTarget
from .probing import estimate_input_gain, probe_both, uses_public
from .target import CheckedFunction, TargetAlgorithm

__all__ = ["Immersion", "FloatDesign", "TargetAlgorithm", "immerse"]


def immerse(
    f: Callable[..., Any],
    g: Callable[..., Any],
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
    keys: Literal["auto", "dense", "block"] | Keys | ModularKeys = "auto",
    block_size: int | None = None,
    arithmetic: Literal["float", "modular"] = "float",
    fraction_bits: int | None = None,
    tolerance: float | None = 1e-6,
    backend: str = "numpy",
    device: str | None = None,
    dtype: str | None = None,
    n_public: int | None = None,
    probe: tuple[Any, ...] | None = None,
    rng: Any = None,
    secure: bool = False,
) -> Immersion:
    """Immerse ``x+ = f(x, y[, w])``, ``u = g(x, y[, w])`` into a randomly encoded target algorithm.

    Parameters
    ----------
    f, g:
        State update and output, ``f(x, y)`` or ``f(x, y, w)`` with ``w`` public and unencoded.
        Any (nonlinear) numpy code; with ``backend="torch"`` they receive and return tensors.
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
        ``"dense"``, ``"block"`` (structured, for large dimensions), ``"auto"`` (dense up to
        512 immersed entries) or a :class:`Keys` object (drawn earlier, loaded, or user matrices;
        a :class:`~immersion.keys.ModularKeys` object with ``arithmetic="modular"``).
    block_size:
        Block size of structured keys (memory and time O(n * block_size)); default 32 for float
        keys, 16 for integer keys (each block is stored with its inverse).
    arithmetic, fraction_bits:
        ``"float"`` (default: float64 keys and Laplace/Gaussian noise, the options above) or
        ``"modular"`` (:mod:`immersion.coding.modular`): values cross the link as fixed-point
        integers ``round(v 2^fraction_bits)`` (default 32) modulo ``2^64`` with integer keys and
        noise uniform modulo ``2^64``; every element of ``y~`` and ``u~`` is uniform (per-element
        epsilon 0) and decoding is bit-exact against the fixed-point twin. The noise-design
        options above do not apply to it (a non-default value is refused); values whose
        fixed-point form would wrap are refused with an error naming the signal.
    tolerance:
        Largest acceptable estimated decode error (the probe-point estimate, not a bound);
        settings that cannot meet it raise :class:`PrecisionError` naming the smallest feasible
        epsilons. ``None`` disables the check.
        (Modular decoding is exact: every tolerance is met.)
    backend, device, dtype:
        ``"numpy"`` (float64 reference) or ``"torch"`` (``device="cpu"``/``"cuda"``,
        float32/float64).
    n_public, probe:
        Size of ``w`` for the shape probe, or an explicit probe point ``(x, y[, w])``
        (defaults to zeros). ``f`` and ``g`` are called once at that point to check shapes.
    rng, secure:
        Seed or Generator for keys and noise; ``secure=True`` draws from 256 bits of OS entropy.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.array([[0.9, 0.1], [0.0, 0.8]])
    >>> imm = immerse(lambda x, y: A @ x + np.array([0.0, 1.0]) * y[0], lambda x, y: x[:1] + y,
    ...               n_state=2, n_input=1, n_output=1, rng=0)
    >>> xt = imm.encode_state(np.array([1.0, -1.0]))
    >>> yt = imm.encode_input(np.array([0.5]))
    >>> u = imm.decode_output(imm.target.output(xt, yt), yt)
    >>> bool(abs(u[0] - 1.5) < 1e-9)
    True
    >>> x1 = imm.decode_state(imm.target.step(xt, yt))
    >>> bool(np.allclose(x1, A @ [1.0, -1.0] + [0.0, 0.5], atol=1e-9))
    True

    The same controller in modular arithmetic: uniform encodings, exact fixed-point decoding.

    >>> imm = immerse(lambda x, y: A @ x + np.array([0.0, 1.0]) * y[0], lambda x, y: x[:1] + y,
    ...               n_state=2, n_input=1, n_output=1, arithmetic="modular", fraction_bits=32,
    ...               rng=0)
    >>> xt, yt = imm.encode_state(np.array([1.0, -1.0])), imm.encode_input(np.array([0.5]))
    >>> yt.dtype.name, imm.decode_output(imm.target.output(xt, yt), yt).tolist()
    ('uint64', [1.5])
    """
    dims, targets, fraction_bits, block_size = validated_arithmetic_design(
        arithmetic=arithmetic,
        fraction_bits=fraction_bits,
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
        assert fraction_bits is not None
        return _immerse_modular(
            f,
            g,
            dims,
            keys=keys,
            block_size=block_size,
            fraction_bits=fraction_bits,
            backend=(backend, device, dtype),
            n_public=n_public,
            probe=probe,
            rng=rng,
            secure=secure,
        )
    if isinstance(keys, ModularKeys):
        raise InvalidArgumentError(
            "keys", "are integer keys (modular arithmetic): pass arithmetic='modular'"
        )
    if tolerance is not None:
        tolerance = v.positive_float("tolerance", tolerance)
    if n_public is not None:
        n_public = v.positive_int("n_public", n_public)
    be = make_backend(backend, dtype=dtype, device=device)
    key_rng, noise_rng = split_rng(rng, secure)

    f_checked = CheckedFunction(f, "f", dims["n_state"], uses_public(f, "f"), be)
    g_checked = CheckedFunction(g, "g", dims["n_output"], uses_public(g, "g"), be)
    point = probe_both(f_checked, g_checked, dims["n_state"], dims["n_input"], n_public, probe, be)
    input_gain = estimate_input_gain(f_checked, g_checked, point, be)

    design = FloatDesign(f_checked, g_checked, be, dims, targets, tolerance, input_gain, block_size)
    return design.immerse(keys, key_rng, noise_rng)


@dataclass(frozen=True, eq=False)
class FloatDesign:
    """What :func:`immerse` checked and measured once for float keys: enough to draw keys of the
    same design again without probing ``f`` and ``g`` (key rotation,
    :class:`~immersion.coding.rotation.RotatingImmersion`).

    Parameters
    ----------
    f, g : CheckedFunction
        The user's functions with their checks.
    backend : ArrayBackend
        The array backend.
    dims : dict
        The six dimensions.
    targets : NoiseTargets
        The noise design's targets (epsilons, deltas, sensitivities, law).
    tolerance : float or None
        The precision check's tolerance (None: no check).
    input_gain : float
        The amplification of input errors by ``f`` and ``g`` measured at the probe point.
    block_size : int
        Block size of block keys.
    """

    f: CheckedFunction
    g: CheckedFunction
    backend: ArrayBackend
    dims: dict[str, int]
    targets: NoiseTargets
    tolerance: float | None
    input_gain: float
    block_size: int

    def immerse(self, keys: Any, key_rng: Any, noise_rng: Any) -> Immersion:
        """The handle of keys of this design: ``keys`` is ``"auto"``, ``"dense"``, ``"block"``
        (drawn from ``key_rng``) or a :class:`Keys` object; the noise comes from ``noise_rng``.

        Parameters
        ----------
        keys : str or Keys
            As for :func:`immerse`.
        key_rng, noise_rng : numpy.random.Generator
            The streams of the keys and of the encoding noise.
        """
        designed_here = not (isinstance(keys, Keys) and keys.noise is not None)
        if isinstance(keys, Keys):
            drawn = _checked_user_keys(keys, self.dims)
        else:
            drawn = draw_geometry(keys, self.dims, self.block_size, key_rng)
        if designed_here:
            drawn = self.targets.apply(drawn)
        if self.tolerance is not None:
            refuse_infeasible_precision(
                drawn,
                self.backend,
                self.tolerance,
                self.targets if designed_here else None,
                self.input_gain,
            )
        target = TargetAlgorithm(f=self.f, g=self.g, keys=drawn, backend=self.backend)
        imm = Immersion(
            keys=drawn,
            target=target,
            backend=self.backend,
            noise_rng=noise_rng,
            input_gain=self.input_gain,
        )
        imm._design = self
        return imm


def _immerse_modular(
    f: Callable[..., Any],
    g: Callable[..., Any],
    dims: dict[str, int],
    *,
    keys: Any,
    block_size: int,
    fraction_bits: int,
    backend: tuple[Any, Any, Any],
    n_public: Any,
    probe: Any,
    rng: Any,
    secure: bool,
) -> Immersion:
    """:func:`immerse` with ``arithmetic="modular"`` (numpy: f and g run in float64)."""
    name, device, dtype = backend
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
    if n_public is not None:
        n_public = v.positive_int("n_public", n_public)
    be = make_backend("numpy")
    key_rng, noise_rng = split_rng(rng, secure)
    f_checked = CheckedFunction(f, "f", dims["n_state"], uses_public(f, "f"), be)
    g_checked = CheckedFunction(g, "g", dims["n_output"], uses_public(g, "g"), be)
    probe_both(f_checked, g_checked, dims["n_state"], dims["n_input"], n_public, probe, be)
    if isinstance(keys, Keys):
        raise InvalidArgumentError(
            "keys", "are float keys: draw integer keys with draw_keys(..., arithmetic='modular')"
        )
    if isinstance(keys, ModularKeys):
        drawn = _checked_user_keys(keys, dims)
    else:
        drawn = draw_geometry(keys, dims, block_size, key_rng, arithmetic="modular")
    target = ModularTarget(f=f_checked, g=g_checked, keys=drawn, fraction_bits=fraction_bits)
    return ModularImmersion(
        keys=drawn, target=target, noise_rng=noise_rng, fraction_bits=fraction_bits
    )


def _checked_user_keys(keys: Any, dims: dict[str, int]) -> Any:
    """Keys given by the user: they must match f and g's dimensions and pass validation."""
    expected = {k: dims[k] for k in ("n_state", "n_input", "n_output")}
    got = {k: keys.dims[k] for k in expected}
    if got != expected:
        raise InvalidArgumentError("keys", f"were made for {got}, but f/g have {expected}")
    keys.validate()
    return keys
