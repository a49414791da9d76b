"""Hidden gains: the controller's coefficients encrypted too (RLWE/BFV through TenSEAL).

With :mod:`immersion.lwe`'s default the cloud multiplies ciphertexts by a public integer matrix
``M``, so it learns the controller's gains. Here each row of ``M`` is encrypted once, at set-up,
under the user's BFV key (Microsoft SEAL through TenSEAL, extra ``baselines``; ``N = 8192`` with
SEAL's default coefficient modulus, 128 bits by the HE standard), and every sample the plant
sends its whole recent history ``v = [y_q(k), u_q(k-1), window]`` as one packed BFV ciphertext.
The cloud computes ``acc = <M_row, v>`` as a ciphertext-by-ciphertext product with a rotation sum
(TenSEAL's ``dot``) and returns it; the user decrypts ``acc`` exactly (BFV is exact modulo its
plaintext modulus ``t``, chosen above ``2 acc_max``) and finishes as the fixed-point twin does, so
``u`` is again bit-identical to the twin.

Each sample's ciphertexts are fresh (the plant re-encrypts the history it knows), so the depth
is one product per sample over any horizon; the cloud keeps no state but the encrypted gains.
It is slow next to the public-gains coding (tens of milliseconds per sample here, against
CDSL's 1.9 ms with RLWE and 6.8 ms with RGSW in its own logs, hardware not stated).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import finite_array
from ..errors import InvalidArgumentError, OptionalDependencyError
from .convert import HistoryForm, LinearController
from .fixed_point import (
    FixedPointDesign,
    FixedPointTwin,
    WrapAroundError,
    design,
    quantize,
    shift_window,
)

#: BFV ring dimension (SEAL's default coefficient modulus for it gives 128-bit security).
POLY_DEGREE = 8192
#: SEAL's largest plaintext modulus: accumulators must stay below ``2^(PLAIN_BITS - 2)``.
PLAIN_BITS = 60


def _tenseal() -> Any:
    try:
        import tenseal
    except ImportError:
        raise OptionalDependencyError(
            "tenseal", "baselines", "encrypt_controller_and_gains"
        ) from None
    return tenseal


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for ``n < 3.3e24`` (the first 13 primes as bases)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def batching_prime(bits: int, degree: int = POLY_DEGREE) -> int:
    """The smallest prime ``t = 1 mod 2 degree`` with at least ``bits`` bits (BFV batching).

    Examples
    --------
    >>> t = batching_prime(40)
    >>> t.bit_length(), t % 16384
    (40, 1)
    """
    k = -(-(1 << (bits - 1)) // (2 * degree))
    while not _is_prime(k * 2 * degree + 1):
        k += 1
    return k * 2 * degree + 1


class HiddenGainsTarget:
    """The cloud: encrypted rows of ``M`` and the public BFV context (no secret key).

    ``output(xt, yt)`` returns the encrypted accumulators; ``step`` only advances the header (the
    plant sends the whole history every sample). Words are uint8 arrays: an 8-byte sample index,
    then serialised ciphertexts (their lengths in a small index).

    Parameters
    ----------
    context:
        The serialised public BFV context (public, relinearisation and Galois keys).
    rows:
        Serialised encryptions of the rows of ``M``.
    n_input, n_output:
        Sizes of ``y`` and ``u``.
    """

    coding = "lwe"
    hide_gains = True

    def __init__(self, context: bytes, rows: list[bytes], n_input: int, n_output: int) -> None:
        self._context_bytes, self._row_bytes = context, rows
        self.n_input, self.n_output = n_input, n_output
        self._context: Any = None
        self._rows: list[Any] = []

    def _load(self) -> None:
        if self._context is None:
            ts = _tenseal()
            self._context = ts.context_from(self._context_bytes)
            if self._context.is_private():
                raise InvalidArgumentError("context", "the cloud's context must hold no secret key")
            self._rows = [ts.bfv_vector_from(self._context, row) for row in self._row_bytes]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_context", "_rows")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _context=None, _rows=[])

    def output(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """``<M_row, v>`` for every output row, as serialised BFV ciphertexts.

        Parameters
        ----------
        encoded_state, encoded_input:
            The header and the plant's encrypted history of the same sample.

        Returns
        -------
        numpy.ndarray
            uint8 message with one ciphertext per output.
        """
        self._load()
        step = _step(encoded_state, "encoded_state")
        if _step(encoded_input, "encoded_input") != step:
            raise InvalidArgumentError("encoded_input", "is for another sample than the state")
        ts = _tenseal()
        (history,) = _unpack(np.asarray(encoded_input, dtype=np.uint8), 1)
        v = ts.bfv_vector_from(self._context, history)
        return _pack(step, [v.dot(row).serialize() for row in self._rows])

    def step(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """The next sample's header (no encrypted state: the history comes with each input).

        Parameters
        ----------
        encoded_state, encoded_input:
            The header and the input of the same sample.

        Returns
        -------
        numpy.ndarray
        """
        step = _step(encoded_state, "encoded_state")
        if _step(encoded_input, "encoded_input") != step:
            raise InvalidArgumentError("encoded_input", "is for another sample than the state")
        return _pack(step + 1, [])

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(output, step)`` of one sample.

        Parameters
        ----------
        encoded_state, encoded_input:
            The header and the input of the same sample.

        Returns
        -------
        tuple of numpy.ndarray
        """
        return self.output(encoded_state, encoded_input), self.step(encoded_state, encoded_input)


def _pack(step: int, blobs: list[bytes]) -> np.ndarray:
    head = np.array([step, len(blobs), *(len(b) for b in blobs)], dtype="<u8").tobytes()
    return np.frombuffer(head + b"".join(blobs), dtype=np.uint8).copy()


def _unpack(words: np.ndarray, count: int) -> list[bytes]:
    raw = words.tobytes()
    lengths = np.frombuffer(raw[16 : 16 + 8 * count], dtype="<u8").tolist()
    if int(np.frombuffer(raw[8:16], dtype="<u8")[0]) != count or 16 + 8 * count + sum(
        lengths
    ) != len(raw):
        raise InvalidArgumentError("encoded", "damaged message (lengths do not match)")
    out, offset = [], 16 + 8 * count
    for length in lengths:
        out.append(raw[offset : offset + length])
        offset += length
    return out


def _step(value: Any, name: str) -> int:
    arr = np.asarray(value)
    if arr.dtype != np.uint8 or arr.ndim != 1 or arr.size < 16:
        raise InvalidArgumentError(name, "expected the uint8 message of a hide_gains loop")
    return int(np.frombuffer(arr[:8].tobytes(), dtype="<u8")[0])


class HiddenGainsImmersion:
    """User side of hidden gains: the same loop and twin as :class:`LweImmersion`.

    Build it with :func:`encrypt_controller_and_gains`.

    Parameters
    ----------
    controller, history:
        The controller and its history form.
    input_range, output_range:
        Bounds on ``|y|`` and ``|u|`` per component.
    fractional_bits:
        ``(f_y, f_u, f_c)`` or None (chosen so that ``|acc| < 2^58``).
    """

    coding = "lwe"
    hide_gains = True

    def __init__(
        self,
        *,
        controller: LinearController,
        history: HistoryForm,
        input_range: np.ndarray,
        output_range: np.ndarray,
        fractional_bits: tuple[int, int, int] | None = None,
    ) -> None:
        ts = _tenseal()
        self.controller, self.history = controller, history
        self.n_state, self.n_input, self.n_output = (
            controller.n_state,
            controller.n_input,
            controller.n_output,
        )
        self.input_range, self._input_range = input_range, input_range.tolist()
        self.design: FixedPointDesign = design(
            history,
            input_range=input_range,
            output_range=output_range,
            modulus_bits=PLAIN_BITS,
            error_bound=0,  # BFV decrypts exactly: only |acc| < t / 2 matters
            fractional_bits=fractional_bits,
        )
        self.plain_modulus = batching_prime(max(self.design.acc_bound, 1).bit_length() + 2)
        context = ts.context(
            ts.SCHEME_TYPE.BFV, poly_modulus_degree=POLY_DEGREE, plain_modulus=self.plain_modulus
        )
        context.generate_galois_keys()
        context.generate_relin_keys()
        self._context = context
        rows = [ts.bfv_vector(context, list(row)).serialize() for row in self.design.matrix]
        public = context.copy()
        public.make_context_public()
        self.target = HiddenGainsTarget(
            public.serialize(save_galois_keys=True, save_relin_keys=True),
            rows,
            self.n_input,
            self.n_output,
        )
        self._step = 0
        self._window: list[int] = []
        self._u_prev: list[int] = []
        self._initial: list[list[int]] = []
        self._pending: tuple[int, list[int]] | None = None

    def __reduce__(self) -> Any:
        raise TypeError("a hide_gains handle holds the BFV secret key; it is not pickled")

    def encode_state(self, x0: Any = None) -> np.ndarray:
        """Start a run from controller state ``x0`` (default 0).

        Parameters
        ----------
        x0:
            Initial controller state, or None for zeros.

        Returns
        -------
        numpy.ndarray
            The (stateless) cloud's header: uint8 message of sample 0.
        """
        fp = self.design
        x0 = np.zeros(self.n_state) if x0 is None else x0
        self._initial = fp.initial_terms(finite_array("x0", x0, last_dim=self.n_state, ndim=1))
        self._window, self._u_prev = [0] * fp.n_window, [0] * fp.n_feedback
        self._step, self._pending = 0, None
        return _pack(0, [])

    def encode_input(self, y: Any) -> np.ndarray:
        """Encrypt ``[y_k, u_(k-1), window]`` as one packed BFV ciphertext.

        Parameters
        ----------
        y:
            The measurement, within ``input_range``.

        Returns
        -------
        numpy.ndarray
            uint8 message: the sample index and the serialised ciphertext.
        """
        ts = _tenseal()
        if self._pending is not None:
            raise InvalidArgumentError("y", "call decode_output once per sample first")
        values = finite_array("y", y, last_dim=self.n_input, ndim=1).tolist()
        for j, (v, bound) in enumerate(zip(values, self._input_range, strict=True)):
            if abs(v) > bound:
                raise WrapAroundError(f"input_range: y[{j}] = {v:.6g} is outside +-{bound:.6g}")
        fresh = quantize(values, self.design.frac_input) + self._u_prev
        history = ts.bfv_vector(self._context, fresh + self._window)
        self._pending = (self._step, fresh)
        return _pack(self._step, [history.serialize()])

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> np.ndarray:
        """Decrypt the accumulators exactly and finish as the twin does: ``u``.

        Parameters
        ----------
        encoded_output:
            The cloud's ``target.output(xt, yt)``.
        encoded_input:
            The ``yt`` it was computed from.

        Returns
        -------
        numpy.ndarray
            ``u``, bit-identical to :meth:`fixed_point_twin`'s.
        """
        ts = _tenseal()
        if self._pending is None or _step(encoded_input, "encoded_input") != self._pending[0]:
            raise InvalidArgumentError("encoded_input", "is not the input encoded last")
        if _step(encoded_output, "encoded_output") != self._pending[0]:
            raise InvalidArgumentError("encoded_output", "answers another sample")
        blobs = _unpack(np.asarray(encoded_output, dtype=np.uint8), self.n_output)
        t = self.plain_modulus
        acc = []
        for blob in blobs:
            value = int(ts.bfv_vector_from(self._context, blob).decrypt()[0]) % t
            acc.append(value - t if value > t // 2 else value)
        fp, k = self.design, self._step
        u_q = fp.finish(acc, self._initial[k] if k < fp.window else None)
        fresh = self._pending[1]
        self._window = shift_window(self._window, fresh, fp.n_input, fp.n_output, fp.window)
        if fp.window:
            self._u_prev = u_q
        self._step, self._pending = k + 1, None
        return fp.to_float(u_q)

    def fixed_point_twin(self) -> FixedPointTwin:
        """The same integer controller without encryption."""
        return FixedPointTwin(self.design)

    def __repr__(self) -> str:
        return (
            f"HiddenGainsImmersion(n_state={self.n_state}, BFV N={POLY_DEGREE}, "
            f"t={self.plain_modulus.bit_length()} bits)"
        )


def encrypt_controller_and_gains(
    sys: Any,
    *,
    input_range: Any = None,
    output_range: Any = None,
    fractional_bits: tuple[int, int, int] | None = None,
) -> HiddenGainsImmersion:
    """Encrypt an LTI controller's signals **and** gains (``hide_gains=True`` of issue 18).

    Same conversion, scales and twin as :func:`immersion.lwe.encrypt_controller`, but the cloud
    gets ``M`` encrypted under BFV (module docstring). SEAL draws the keys from OS entropy.

    Parameters
    ----------
    sys, input_range, output_range, fractional_bits:
        As for :func:`immersion.lwe.encrypt_controller`.

    Returns
    -------
    HiddenGainsImmersion

    Examples
    --------
    Key generation takes seconds (Galois keys at N = 8192), so this runs in
    ``tests/test_lwe_hidden.py`` rather than here:

    >>> imm = encrypt_controller_and_gains(([[1.0]], [[0.05]], [[1.0]], [[2.0]]),
    ...                                    input_range=10.0, output_range=100.0)  # doctest: +SKIP
    >>> xt, yt = imm.encode_state(), imm.encode_input([1.0])  # doctest: +SKIP
    >>> imm.decode_output(imm.target.output(xt, yt), yt)  # doctest: +SKIP
    array([2.])
    """
    from .convert import history_form, linear_controller
    from .fixed_point import ranges

    controller = linear_controller(sys)
    return HiddenGainsImmersion(
        controller=controller,
        history=history_form(controller),
        input_range=ranges("input_range", input_range, controller.n_input),
        output_range=ranges("output_range", output_range, controller.n_output),
        fractional_bits=fractional_bits,
    )
