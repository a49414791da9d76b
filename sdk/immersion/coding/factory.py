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

from ..backends import ArrayBackend, make_backend
from ..errors import InvalidArgumentError
from ..keys import Keys, ModularKeys
from ..privacy.precision import refuse_infeasible_precision
from .design import Design, NoiseTargets, design_from
from .handle import Immersion
from .keygen import split_rng
from .modular import ModularImmersion, ModularTarget
from .probing import estimate_input_gain, probe_both, uses_public
from .target import CheckedFunction, TargetAlgorithm

__all__ = ["Design", "Immersion", "FloatDesign", "TargetAlgorithm", "draw_keys", "immerse"]


def immerse(
    f: Callable[..., Any],
    g: Callable[..., Any],
    n_state: int | None = None,
    n_input: int | None = None,
    n_output: int | None = None,
    *,
    design: Design | None = None,
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
        Dimensions of x, y and u (required unless ``design`` is given).
    design:
        A :class:`Design`: the dimensions and every option from ``extra_state`` to ``n_public``
        in one validated value (the keyword options then stay unset; ``keys`` may still be a
        :class:`Keys` object). ``immerse(f, g, design=Design(n, m, p, **options))`` equals
        ``immerse(f, g, n, m, p, **options)`` bit for bit.
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

    The options as one value, checked once, reusable for keys and handles alike:

    >>> from immersion import Design
    >>> design = Design(2, 1, 1, epsilon_input=1e-2)
    >>> imm = immerse(lambda x, y: A @ x + np.array([0.0, 1.0]) * y[0], lambda x, y: x[:1] + y,
    ...               design=design, rng=0)
    >>> imm.keys.fingerprint == draw_keys(design=design, rng=0).fingerprint
    True
    """
    material = keys if isinstance(keys, (Keys, ModularKeys)) else None
    design = design_from(
        design,
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
        epsilon_input=epsilon_input,
        epsilon_output=epsilon_output,
        sensitivity_input=sensitivity_input,
        sensitivity_output=sensitivity_output,
        noise=noise,
        delta_input=delta_input,
        delta_output=delta_output,
        noise_mean=noise_mean,
        keys="auto" if material is not None else keys,
        block_size=block_size,
        arithmetic=arithmetic,
        fraction_bits=fraction_bits,
        tolerance=tolerance,
        backend=backend,
        device=device,
        dtype=dtype,
        n_public=n_public,
    )
    if design.arithmetic == "modular":
        return _immerse_modular(f, g, design, material, probe=probe, rng=rng, secure=secure)
    if isinstance(material, ModularKeys):
        raise InvalidArgumentError(
            "keys", "are integer keys (modular arithmetic): pass arithmetic='modular'"
        )
    be = make_backend(design.backend, dtype=design.dtype, device=design.device)
    key_rng, noise_rng = split_rng(rng, secure)
    f_checked, g_checked, point = _checked_functions(f, g, design, probe, be)
    input_gain = estimate_input_gain(f_checked, g_checked, point, be)
    measured = FloatDesign(f_checked, g_checked, be, design, input_gain)
    return measured.immerse(material, key_rng, noise_rng)


def draw_keys(
    n_state: int | None = None,
    n_input: int | None = None,
    n_output: int | None = None,
    *,
    design: Design | None = None,
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
    that ``immerse(..., rng=s)`` would draw, and ``draw_keys(design=d, rng=s)`` those of
    ``immerse(f, g, design=d, rng=s)``. Save them with :func:`save_keys` and pass them to
    ``immerse(..., keys=...)`` later (their noise law is then used as is).
    ``arithmetic="modular"`` draws integer keys invertible modulo 2^64
    (:class:`~immersion.keys.ModularKeys`; the noise options do not apply). Modular keys take
    no ``fraction_bits``: the fixed-point scale is not part of the keys, it is set when they are
    used, ``immerse(..., keys=keys, arithmetic="modular", fraction_bits=f)`` (default 32).

    Parameters
    ----------
    n_state, n_input, n_output:
        Dimensions of x, y and u (required unless ``design`` is given).
    design:
        A :class:`Design` holding the dimensions and every option below (its ``fraction_bits``,
        ``tolerance`` and backend do not concern the keys); the options then stay unset.
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
    >>> draw_keys(design=Design(3, 1, 1, epsilon_input=1e-2), rng=0).fingerprint == keys.fingerprint
    True
    """
    design = design_from(
        design,
        n_state=n_state,
        n_input=n_input,
        n_output=n_output,
        extra_state=extra_state,
        extra_input=extra_input,
        extra_output=extra_output,
        epsilon_input=epsilon_input,
        epsilon_output=epsilon_output,
        sensitivity_input=sensitivity_input,
        sensitivity_output=sensitivity_output,
        noise=noise,
        delta_input=delta_input,
        delta_output=delta_output,
        noise_mean=noise_mean,
        keys=keys,
        block_size=block_size,
        arithmetic=arithmetic,
    )
    key_rng, _ = split_rng(rng, secure)
    return design.draw(key_rng)


@dataclass(frozen=True, eq=False)
class FloatDesign:
    """A float :class:`Design` checked and measured once against ``f`` and ``g``: enough to draw
    keys of the same design again without probing ``f`` and ``g`` (key rotation,
    :class:`~immersion.coding.rotation.RotatingImmersion`).

    Parameters
    ----------
    f, g : CheckedFunction
        The user's functions with their checks.
    backend : ArrayBackend
        The array backend (built from ``design``).
    design : Design
        The dimensions and options (``arithmetic="float"``).
    input_gain : float
        The amplification of input errors by ``f`` and ``g`` measured at the probe point.
    """

    f: CheckedFunction
    g: CheckedFunction
    backend: ArrayBackend
    design: Design
    input_gain: float

    @property
    def dims(self) -> dict[str, int]:
        """The six dimensions."""
        return self.design.dims

    @property
    def targets(self) -> NoiseTargets:
        """The noise design's targets (epsilons, deltas, sensitivities, law)."""
        targets = self.design.targets
        assert targets is not None  # a float design
        return targets

    @property
    def tolerance(self) -> float | None:
        """The precision check's tolerance (None: no check)."""
        return self.design.tolerance

    def immerse(self, keys: Keys | None, key_rng: Any, noise_rng: Any) -> Immersion:
        """The handle of ``keys``, or of keys of this design drawn from ``key_rng`` (None); the
        noise comes from ``noise_rng``.

        Parameters
        ----------
        keys : Keys or None
            Keys given by the user (their noise law, if any, is kept), or None.
        key_rng, noise_rng : numpy.random.Generator
            The streams of the keys and of the encoding noise.
        """
        designed_here = not (isinstance(keys, Keys) and keys.noise is not None)
        if isinstance(keys, Keys):
            drawn = _checked_user_keys(keys, self.dims)
            if designed_here:
                drawn = self.targets.apply(drawn)
        else:
            drawn = self.design.draw(key_rng)
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


def _checked_functions(
    f: Callable[..., Any], g: Callable[..., Any], design: Design, probe: Any, be: ArrayBackend
) -> tuple[CheckedFunction, CheckedFunction, Any]:
    """``f`` and ``g`` wrapped with their checks and called once at the probe point."""
    f_checked = CheckedFunction(f, "f", design.n_state, uses_public(f, "f"), be)
    g_checked = CheckedFunction(g, "g", design.n_output, uses_public(g, "g"), be)
    point = probe_both(
        f_checked, g_checked, design.n_state, design.n_input, design.n_public, probe, be
    )
    return f_checked, g_checked, point


def _immerse_modular(
    f: Callable[..., Any],
    g: Callable[..., Any],
    design: Design,
    keys: Any,
    *,
    probe: Any,
    rng: Any,
    secure: bool,
) -> Immersion:
    """:func:`immerse` with ``arithmetic="modular"`` (numpy: f and g run in float64)."""
    be = make_backend("numpy")
    key_rng, noise_rng = split_rng(rng, secure)
    f_checked, g_checked, _ = _checked_functions(f, g, design, probe, be)
    if isinstance(keys, Keys):
        raise InvalidArgumentError(
            "keys", "are float keys: draw integer keys with draw_keys(..., arithmetic='modular')"
        )
    drawn = design.draw(key_rng) if keys is None else _checked_user_keys(keys, design.dims)
    assert isinstance(drawn, ModularKeys)  # Design.draw under arithmetic="modular"
    bits = design.fraction_bits
    assert bits is not None  # resolved by Design under arithmetic="modular"
    target = ModularTarget(f=f_checked, g=g_checked, keys=drawn, fraction_bits=bits)
    return ModularImmersion(keys=drawn, target=target, noise_rng=noise_rng, fraction_bits=bits)


def _checked_user_keys(keys: Any, dims: dict[str, int]) -> Any:
    """Keys given by the user: they must match f and g's dimensions and pass validation."""
    expected = {k: dims[k] for k in ("n_state", "n_input", "n_output")}
    got = {k: keys.dims[k] for k in expected}
    if got != expected:
        raise InvalidArgumentError("keys", f"were made for {got}, but f/g have {expected}")
    keys.validate()
    return keys
