"""``immerse(f, g)``: the affine immersion of seed 002 (Proposition 1, eqs. 16-18; Corollary 1).

User side: :class:`Immersion` (keys, encoder, decoder, report). Cloud side:
:class:`TargetAlgorithm`, which carries only what eq. 17 needs.
"""
from __future__ import annotations

import inspect
import math
import secrets
from typing import Any, Callable, Literal

import numpy as np

from . import _validation as v
from .backends import ArrayBackend, make_backend
from .errors import InvalidArgumentError, NonFiniteError, PrecisionError
from .keys import Keys
from .privacy import PrivacyReport, design_noise, predict_decode_error, privacy_report

#: Largest immersed dimension for which ``keys="auto"`` draws dense keys.
AUTO_DENSE_LIMIT = 512


def _uses_public(fn: Callable[..., Any], name: str) -> bool:
    """True if ``fn`` takes a third positional argument ``w`` (public, unencoded)."""
    if not callable(fn):
        raise InvalidArgumentError(name, f"expected a callable {name}(x, y) or {name}(x, y, w), got {fn!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 3 or len(positional) < 2:
        raise InvalidArgumentError(name, f"must take (x, y) or (x, y, w); its signature is {inspect.signature(fn)}")
    return len(positional) >= 3


class _Checked:
    """Calls a user function and checks its result's shape and finiteness (names the function)."""

    def __init__(self, fn: Callable[..., Any], name: str, n_out: int, uses_public: bool, backend: ArrayBackend) -> None:
        self.fn, self.name, self.n_out, self.uses_public, self._backend = fn, name, n_out, uses_public, backend

    def __call__(self, x: Any, y: Any, w: Any) -> Any:
        out = self.fn(x, y, w) if self.uses_public else self.fn(x, y)
        if not self._backend.is_array(out):
            out = self._backend.asarray(np.asarray(out, dtype=np.float64))
        shape = tuple(out.shape)
        if shape != (self.n_out,):
            if self.n_out == 1 and shape in ((), (1, 1)):
                out = out.reshape((1,))
            else:
                raise InvalidArgumentError(self.name, f"returned shape {shape}, expected ({self.n_out},)")
        if not self._backend.all_finite(out):
            raise NonFiniteError(self.name, "returned NaN or inf")
        return out

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__


class TargetAlgorithm:
    """The cloud-side algorithm of seed 002 eq. 17 (and Corollary 1 for two time scales).

    ``step``: ``x~+ = Pi2 f(Pi2_left x~, Pi1_left y~, w)``;
    ``output``: ``u~ = Pi3 g(Pi2_left x~, Pi1_left y~, w) + Pi4 y~``.
    Holds no ``N1``, no ``Pi3_left`` and no noise generator (it pickles without them).
    """

    def __init__(self, *, f: _Checked, g: _Checked, keys: Keys, backend: ArrayBackend) -> None:
        self._f, self._g, self.backend = f, g, backend
        self.n_state_encoded = keys.state_code.n_total
        self.n_input_encoded = keys.input_code.n_total
        self.n_output_encoded = keys.output_code.n_total
        self._state_in = keys.state_code.decoder(backend)
        self._state_out = keys.state_code.encoder(backend)
        self._input_in = keys.input_code.decoder(backend)
        self._output_out = keys.output_code.encoder(backend)
        self._mask = keys.mask.operator(keys.input_code, keys.output_code, backend)  # type: ignore[arg-type]

    @property
    def uses_public(self) -> bool:
        """True if ``f`` or ``g`` takes the public signal ``w``."""
        return self._f.uses_public or self._g.uses_public

    def _vector(self, name: str, value: Any, size: int) -> Any:
        if self.backend.is_array(value) and not isinstance(value, np.ndarray):   # a tensor of this backend
            arr = value
        else:
            arr = self.backend.asarray(v.finite_array(name, value))
        if tuple(arr.shape) != (size,):
            raise InvalidArgumentError(name, f"expected an encoded vector of shape ({size},), got {tuple(arr.shape)}")
        if not self.backend.all_finite(arr):
            raise NonFiniteError(name, "contains NaN or inf")
        return arr

    def _check_public(self, w: Any) -> None:
        if w is None and self.uses_public:
            raise InvalidArgumentError("w", "f or g takes a public signal w; pass it as the third argument")
        if w is not None and not self.uses_public:
            raise InvalidArgumentError("w", "neither f nor g takes a public signal w; drop the third argument")

    def step(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """One step of the target dynamics; call it T times on one ``encoded_input`` for two time scales."""
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        return self._state_out(self._f(self._state_in(xt), self._input_in(yt), w))

    def output(self, encoded_state: Any, encoded_input: Any, w: Any = None) -> Any:
        """The encoded output ``u~`` of the current state and input."""
        self._check_public(w)
        xt = self._vector("encoded_state", encoded_state, self.n_state_encoded)
        yt = self._vector("encoded_input", encoded_input, self.n_input_encoded)
        return self._output_out(self._g(self._state_in(xt), self._input_in(yt), w)) + self._mask(yt)


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
        if self.backend.is_array(value) and not isinstance(value, np.ndarray):   # a tensor of this backend
            arr = value
            if arr.ndim == 0 or arr.shape[-1] != last_dim:
                raise InvalidArgumentError(name, f"expected shape (..., {last_dim}), got {tuple(arr.shape)}")
            if not self.backend.all_finite(arr):
                raise NonFiniteError(name, "contains NaN or inf")
            return self.backend.asarray(arr)
        return self.backend.asarray(v.finite_array(name, value, last_dim=last_dim))

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


def _probe(fn: _Checked, x: Any, y: Any, w: Any) -> None:
    try:
        fn(x, y, w)
    except (InvalidArgumentError, NonFiniteError):
        raise
    except Exception as exc:  # the user's code failed on the probe point: say where
        raise InvalidArgumentError(fn.name, f"raised {type(exc).__name__} when probed at "
                                   f"(x={x!r}, y={y!r}): {exc}; pass probe=(x, y[, w]) with a valid point") from exc


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

    f_checked = _Checked(f, "f", n_state, _uses_public(f, "f"), be)
    g_checked = _Checked(g, "g", n_output, _uses_public(g, "g"), be)
    point = _probe_both(f_checked, g_checked, n_state, n_input, n_public, probe, be)
    input_gain = _estimate_input_gain(f_checked, g_checked, point, be)

    drawn = _draw_or_check_keys(keys, n_state, n_input, n_output, extra, block_size, key_rng)
    design = dict(noise=noise, delta_input=delta_in if noise == "gaussian" else None,
                  delta_output=delta_out if noise == "gaussian" else None,
                  sensitivity_input=sensitivity_input, sensitivity_output=sensitivity_output, noise_mean=noise_mean_f)
    if drawn.noise_scale is None:
        drawn = design_noise(drawn, epsilon_input=epsilon_input, epsilon_output=epsilon_output, **design)  # type: ignore[arg-type]
        if tolerance is not None:
            _check_precision(drawn, be, tolerance, epsilon_input, epsilon_output, design, input_gain)
    elif tolerance is not None:
        _check_precision(drawn, be, tolerance, None, None, design, input_gain)
    target = TargetAlgorithm(f=f_checked, g=g_checked, keys=drawn, backend=be)
    return Immersion(keys=drawn, target=target, backend=be, noise_rng=noise_rng,
                     sensitivity_input=sensitivity_input, sensitivity_output=sensitivity_output,
                     delta_input=delta_in, delta_output=delta_out, input_gain=input_gain)


def _probe_both(f: _Checked, g: _Checked, n_state: int, n_input: int, n_public: int | None,
                probe: tuple[Any, ...] | None, be: ArrayBackend) -> list[Any]:
    """Call f and g once to check their output shapes (done when ``immerse`` is called)."""
    needs_w = f.uses_public or g.uses_public
    if probe is None:
        if needs_w and n_public is None:
            raise InvalidArgumentError("n_public", "f or g takes a public signal w: give n_public (its length) "
                                       "or probe=(x, y, w)")
        point = [be.zeros((n_state,)), be.zeros((n_input,)),
                 be.zeros((n_public,)) if needs_w and n_public is not None else None]
    else:
        if not isinstance(probe, tuple) or len(probe) not in (2, 3):
            raise InvalidArgumentError("probe", "expected a tuple (x, y) or (x, y, w)")
        point = [be.asarray(v.finite_array("probe[0]", probe[0], ndim=1, last_dim=n_state)),
                 be.asarray(v.finite_array("probe[1]", probe[1], ndim=1, last_dim=n_input)),
                 probe[2] if len(probe) == 3 else None]
        if needs_w and point[2] is None:
            raise InvalidArgumentError("probe", "f or g takes w: give probe=(x, y, w)")
    _probe(f, *point)
    _probe(g, *point)
    return point


#: Random sign directions and relative step of the input-gain probe.
GAIN_PROBES, GAIN_STEP = 3, 1e-6


def _estimate_input_gain(f: _Checked, g: _Checked, point: list[Any], be: ArrayBackend) -> float:
    """How much ``f`` and ``g`` amplify a small random error in ``y`` (max-norm ratio, >= 1).

    Decoding errors of ``y~`` look like small random vectors; this measures the response to a
    few random-sign perturbations by finite differences at the probe point, times 2 for safety.
    """
    x, y, w = point
    rng = np.random.default_rng(0)
    base_f, base_g = be.to_numpy(f(x, y, w)), be.to_numpy(g(x, y, w))
    step = GAIN_STEP * max(1.0, float(np.abs(be.to_numpy(y)).max()))
    gain = 1.0
    for _ in range(GAIN_PROBES):
        direction = be.asarray(rng.choice([-1.0, 1.0], size=int(y.shape[0])) * step)
        try:
            moved_f, moved_g = be.to_numpy(f(x, y + direction, w)), be.to_numpy(g(x, y + direction, w))
        except Exception:  # noqa: BLE001 - f or g undefined next to the probe point: keep the gain so far
            continue
        gain = max(gain, float(np.abs(moved_f - base_f).max()) / step, float(np.abs(moved_g - base_g).max()) / step)
    return 2.0 * gain


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


#: The suggested epsilons aim at tolerance / SUGGESTION_MARGIN, so that they still work for a
#: fresh key draw (the worst row of new keys differs a little from this draw's).
SUGGESTION_MARGIN = 2.0


def _check_precision(keys: Keys, be: ArrayBackend, tolerance: float, epsilon_input: float | None,
                     epsilon_output: float | None, design: dict[str, Any], input_gain: float) -> None:
    """Refuse settings whose predicted decode error exceeds ``tolerance`` (seed002 notes section 5)."""
    unit_roundoff, dtype = be.unit_roundoff, be.dtype_name

    def predicted_at(factor: float) -> float:
        assert epsilon_input is not None and epsilon_output is not None
        scaled = design_noise(keys, epsilon_input=epsilon_input * factor, epsilon_output=epsilon_output * factor,
                              **design)
        return predict_decode_error(scaled, unit_roundoff, input_gain=input_gain).decode_error_bound

    predicted = predict_decode_error(keys, unit_roundoff, input_gain=input_gain).decode_error_bound
    if predicted <= tolerance:
        return
    if epsilon_input is None or epsilon_output is None:
        raise PrecisionError(
            f"tolerance: these keys' noise gives a predicted decode error {predicted:.3g} in {dtype}, above "
            f"tolerance {tolerance:.3g}", smallest_feasible_epsilon_input=math.nan,
            smallest_feasible_epsilon_output=math.nan)
    goal = tolerance / SUGGESTION_MARGIN
    floor = predicted_at(1e15)          # noise negligible: what rounding alone costs
    if floor >= goal:
        raise PrecisionError(
            f"tolerance: no epsilon can meet tolerance {tolerance:.3g} in {dtype}: even negligible noise leaves a "
            f"predicted rounding error of {floor:.3g}. Raise tolerance"
            f"{' or use float64' if dtype != 'float64' else ''}.",
            smallest_feasible_epsilon_input=math.nan, smallest_feasible_epsilon_output=math.nan)
    factor = predicted / goal
    for _ in range(60):   # the error is (noise term)/factor + floor: converges geometrically
        error = predicted_at(factor)
        if error <= goal:
            break
        factor *= (error - floor) / (goal - floor) * 1.01
    raise PrecisionError(
        f"tolerance: epsilon_input={epsilon_input:.3g}, epsilon_output={epsilon_output:.3g} need noise so large "
        f"that the predicted decode error in {dtype} is {predicted:.3g} > tolerance {tolerance:.3g}. The smallest "
        f"feasible epsilons at this ratio are about epsilon_input={epsilon_input * factor:.3g}, "
        f"epsilon_output={epsilon_output * factor:.3g} (with a {SUGGESTION_MARGIN:g}x margin for a fresh key draw), "
        f"or raise tolerance{', or use float64' if dtype != 'float64' else ''}.",
        smallest_feasible_epsilon_input=epsilon_input * factor, smallest_feasible_epsilon_output=epsilon_output * factor)
