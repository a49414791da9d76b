"""``immerse(f, g)``: the affine immersion of seed 002 (Proposition 1, eqs. 16-18; Corollary 1).

User side: :class:`Immersion` (keys, encoder, decoder, report). Cloud side:
:class:`TargetAlgorithm`, which carries only what eq. 17 needs.
"""
from __future__ import annotations

import math
import secrets
from typing import Any, Callable, Literal

import numpy as np

from . import _validation as v
from .backends import ArrayBackend, make_backend
from .errors import InvalidArgumentError
from .keys import Keys
from .privacy import PrivacyReport, design_noise, privacy_report
from .privacy.precision import refuse_infeasible_precision
from .probing import estimate_input_gain, probe_both, uses_public
from .target import CheckedFunction, TargetAlgorithm

#: Largest immersed dimension for which ``keys="auto"`` draws dense keys.
AUTO_DENSE_LIMIT = 512


class Immersion:
    """User-side handle: secret keys, encoder, decoder and the privacy/precision report.

    Created by :func:`immerse`; ``imm.target`` is what goes to the cloud.
    """

    def __init__(self, *, keys: Keys, target: TargetAlgorithm, backend: ArrayBackend,
                 noise_rng: np.random.Generator, sensitivity_input: float, sensitivity_output: float,
                 delta_input: float, delta_output: float, input_gain: float = 1.0) -> None:
        self.keys, self.target, self.backend = keys, target, backend
        self.n_state, self.n_input, self.n_output = (keys.state_code.n_signal, keys.input_code.n_signal,
                                                     keys.output_code.n_signal)
        self._noise = backend.noise_stream(noise_rng)
        self._input_enc = keys.input_code.noisy_encoder(backend)
        self._state_enc = keys.state_code.encoder(backend)
        self._state_dec = keys.state_code.decoder(backend)
        self._output_dec = keys.output_code.decoder(backend)
        self._mask = keys.mask.operator(keys.input_code, keys.output_code, backend)  # type: ignore[arg-type]
        self._report_args = dict(sensitivity_input=sensitivity_input, sensitivity_output=sensitivity_output,
                                 delta_input=delta_input, delta_output=delta_output,
                                 unit_roundoff=backend.unit_roundoff, dtype=backend.dtype_name,
                                 input_gain=input_gain)
        self._report: PrivacyReport | None = None

    def _array(self, name: str, value: Any, last_dim: int) -> Any:
        return v.backend_array(self.backend, name, value, last_dim=last_dim)

    def encode_state(self, state: Any) -> Any:
        """``x~0 = Pi2 x0`` (seed 002: the state starts on the manifold, without noise)."""
        return self._state_enc(self._array("state", state, self.n_state))

    def encode_input(self, y: Any) -> Any:
        """``y~ = Pi1 y + N1 s`` with fresh noise ``s`` on every call (eq. 16); ``y`` may be batched."""
        arr = self._array("y", y, self.n_input)
        s_shape = tuple(arr.shape[:-1]) + (self.keys.input_code.n_noise,)
        assert self.keys.noise_scale is not None
        draw = self._noise.laplace if self.keys.noise_kind == "laplace" else self._noise.normal
        return self._input_enc(arr, draw(s_shape, self.keys.noise_mean, self.keys.noise_scale))

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> Any:
        """``u = Pi3_left (u~ - Pi4 y~)`` (eq. 18), with the ``y~`` the output was computed from."""
        ut = self._array("encoded_output", encoded_output, self.target.n_output_encoded)
        yt = self._array("encoded_input", encoded_input, self.target.n_input_encoded)
        return self._output_dec(ut - self._mask(yt))

    def decode_state(self, encoded_state: Any) -> Any:
        """``x = Pi2_left x~``."""
        return self._state_dec(self._array("encoded_state", encoded_state, self.target.n_state_encoded))

    def report(self) -> PrivacyReport:
        """Per-element epsilon recomputed from the drawn keys, and the predicted decode error."""
        if self._report is None:
            self._report = privacy_report(self.keys, **self._report_args)  # type: ignore[arg-type]
        return self._report

    def __repr__(self) -> str:
        return f"Immersion({self.keys!r}, backend={self.backend.name}/{self.backend.dtype_name})"


def _resolve_rng(rng: Any, secure: bool) -> np.random.Generator:
    if secure:
        if rng is not None:
            raise InvalidArgumentError("rng", "pass either rng or secure=True, not both")
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(secrets.randbits(256))))
    if rng is None or isinstance(rng, (int, np.integer, np.random.SeedSequence)):
        if isinstance(rng, (int, np.integer)) and rng < 0:
            raise InvalidArgumentError("rng", f"expected a non-negative seed, got {rng}")
        return np.random.default_rng(rng)
    if isinstance(rng, np.random.Generator):
        return rng
    raise InvalidArgumentError("rng", f"expected None, an int seed or a numpy Generator, got {type(rng).__name__}")


def immerse(f: Callable[..., Any], g: Callable[..., Any], n_state: int, n_input: int, n_output: int, *,
            extra_state: int = 1, extra_input: int = 2, extra_output: int = 2,
            epsilon_input: float = 1e-3, epsilon_output: float = 1e-3,
            sensitivity_input: float = 1.0, sensitivity_output: float = 1.0,
            noise: Literal["laplace", "gaussian"] = "laplace", delta_input: float | None = None,
            delta_output: float | None = None, noise_mean: float = 0.0,
            keys: Literal["auto", "dense", "block"] | Keys = "auto", block_size: int = 32,
            tolerance: float | None = 1e-6, backend: str = "numpy", device: str | None = None,
            dtype: str | None = None, n_public: int | None = None, probe: tuple[Any, ...] | None = None,
            rng: Any = None, secure: bool = False) -> Immersion:
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
        512 immersed entries) or a :class:`Keys` object (drawn earlier, loaded, or user matrices).
    block_size:
        Block size of structured keys (memory and time O(n * block_size)).
    tolerance:
        Largest acceptable predicted decode error; settings that cannot meet it raise
        :class:`PrecisionError` naming the smallest feasible epsilons. ``None`` disables the check.
    backend, device, dtype:
        ``"numpy"`` (float64 reference) or ``"torch"`` (``device="cpu"``/``"cuda"``, float32/float64).
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
    """
    n_state = v.positive_int("n_state", n_state)
    n_input = v.positive_int("n_input", n_input)
    n_output = v.positive_int("n_output", n_output)
    extra = {name: v.positive_int(name, val) for name, val in
             (("extra_state", extra_state), ("extra_input", extra_input), ("extra_output", extra_output))}
    epsilon_input = v.positive_float("epsilon_input", epsilon_input)
    epsilon_output = v.positive_float("epsilon_output", epsilon_output)
    sensitivity_input = v.positive_float("sensitivity_input", sensitivity_input)
    sensitivity_output = v.positive_float("sensitivity_output", sensitivity_output)
    noise = v.one_of("noise", noise, ("laplace", "gaussian"))  # type: ignore[assignment]
    if noise == "laplace":
        for name, val in (("delta_input", delta_input), ("delta_output", delta_output)):
            if val not in (None, 0, 0.0):
                raise InvalidArgumentError(name, "Laplace noise gives pure DP (delta = 0); use noise='gaussian'")
        delta_in, delta_out = 0.0, 0.0
    else:
        delta_in = v.probability("delta_input", 1e-5 if delta_input is None else delta_input)
        delta_out = v.probability("delta_output", 1e-5 if delta_output is None else delta_output)
    try:
        noise_mean_f = float(noise_mean)
    except (TypeError, ValueError):
        raise InvalidArgumentError("noise_mean", f"expected a finite number, got {noise_mean!r}") from None
    if not math.isfinite(noise_mean_f):
        raise InvalidArgumentError("noise_mean", f"expected a finite number, got {noise_mean!r}")
    block_size = v.positive_int("block_size", block_size)
    if tolerance is not None:
        tolerance = v.positive_float("tolerance", tolerance)
    if n_public is not None:
        n_public = v.positive_int("n_public", n_public)
    be = make_backend(backend, dtype=dtype, device=device)
    gen = _resolve_rng(rng, secure)
    key_rng, noise_rng = gen.spawn(2)

    f_checked = CheckedFunction(f, "f", n_state, uses_public(f, "f"), be)
    g_checked = CheckedFunction(g, "g", n_output, uses_public(g, "g"), be)
    point = probe_both(f_checked, g_checked, n_state, n_input, n_public, probe, be)
    input_gain = estimate_input_gain(f_checked, g_checked, point, be)

    drawn = _draw_or_check_keys(keys, n_state, n_input, n_output, extra, block_size, key_rng)
    design = dict(noise=noise, delta_input=delta_in if noise == "gaussian" else None,
                  delta_output=delta_out if noise == "gaussian" else None,
                  sensitivity_input=sensitivity_input, sensitivity_output=sensitivity_output, noise_mean=noise_mean_f)
    if drawn.noise_scale is None:
        drawn = design_noise(drawn, epsilon_input=epsilon_input, epsilon_output=epsilon_output, **design)  # type: ignore[arg-type]
        if tolerance is not None:
            refuse_infeasible_precision(drawn, be, tolerance, epsilon_input, epsilon_output, design, input_gain)
    elif tolerance is not None:
        refuse_infeasible_precision(drawn, be, tolerance, None, None, design, input_gain)
    target = TargetAlgorithm(f=f_checked, g=g_checked, keys=drawn, backend=be)
    return Immersion(keys=drawn, target=target, backend=be, noise_rng=noise_rng,
                     sensitivity_input=sensitivity_input, sensitivity_output=sensitivity_output,
                     delta_input=delta_in, delta_output=delta_out, input_gain=input_gain)


def _draw_or_check_keys(keys: Any, n_state: int, n_input: int, n_output: int, extra: dict[str, int],
                        block_size: int, rng: np.random.Generator) -> Keys:
    if isinstance(keys, Keys):
        expected = {"n_state": n_state, "n_input": n_input, "n_output": n_output}
        got = {k: keys.dims[k] for k in expected}
        if got != expected:
            raise InvalidArgumentError("keys", f"were made for {got}, but f/g have {expected}")
        keys.validate()
        return keys
    kind = v.one_of("keys", keys, ("auto", "dense", "block"))
    if kind == "auto":
        largest = max(n_state + extra["extra_state"], n_input + extra["extra_input"], n_output + extra["extra_output"])
        kind = "dense" if largest <= AUTO_DENSE_LIMIT else "block"
    drawn = Keys.draw(n_state=n_state, n_input=n_input, n_output=n_output, kind=kind,  # type: ignore[arg-type]
                      block_size=block_size, rng=rng, **extra)
    drawn.validate()
    return drawn
