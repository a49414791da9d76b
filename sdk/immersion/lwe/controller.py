"""An encrypted linear controller that the cloud runs: RLWE coefficients times RLWE signals.

The controller's input-output history form (:mod:`.convert`; Lee, Lee, Kim, Shim, arXiv
2307.03451, CDSL ``ctrRLWE``)

    u_k = sum_{j=0..W} Phi_j v_(k-j),   v_k = [y_k; u_(k-1)],   Phi_j = [Theta_y,j  Theta_u,j+1]

is quantised (``Phi^_j = round(2^f_c Phi_j)``, ``v^ = round(2^f_v v)``) and packed without
rotations: the input ``v^`` is the polynomial ``sum_c v^_c X^c``; row ``r`` of ``Phi^_j`` is
``sum_c Phi^_j[r, c] X^(r n_v + n_v - 1 - c)``, so coefficient ``r n_v + n_v - 1`` of the product
is the row's dot product with ``v^`` (the other products land elsewhere).

Who does what, every sample:

* **cloud** (:class:`ControllerTarget`): holds the ``W + 1`` coefficient ciphertexts (set up once)
  and the ciphertexts of the last ``W`` inputs (its state); multiplies and adds: ``W + 1``
  ciphertext products into one degree-2 ciphertext; never decrypts, never sees a gain;
* **plant** (:class:`EncryptedController`): encrypts ``v_k`` (one ciphertext; the part that does
  not depend on ``v``, an encryption of zero, can be computed ahead), decrypts ``n_u + 2``
  coefficients of the reply, checks the tag, rounds ``u``. Its work and bytes per sample do not
  depend on the controller's order or history, except a dot product of ``2 (W + 1) n_v``
  integers for the tag.

**Exactness.** The decoded ``u`` is bit for bit that of :class:`FixedPointTwin` (the same
integers without encryption) as long as the noise bound holds, which the design proves for every
sample (worst case, errors clipped at 19): no bootstrapping, and nothing grows with time since
every product involves fresh ciphertexts.

**Integrity.** Two secret check rows ``C_ij = sum_r rho_ir Phi^_j[r] + kappa_ij (mod t)``
(``rho``, ``kappa`` uniform modulo the prime ``t``) ride in the same ciphertexts, so the honest
reply carries ``sum_r rho_ir U_r + sum_j kappa_ij v^_(k-j)``, which the plant checks before ``u``
leaves :meth:`EncryptedController.decode_output`. A reply the cloud altered in any way expressible
through the ciphertexts it holds (offsets, scalings, replays, mixes of samples, products of its
ciphertexts) passes both checks with probability at most ``(3 / t)^2`` (Schwartz-Zippel over
``F_t``, degree at most 3 in the secret tag); bit flips and replies of another key decrypt to
values that pass with probability about ``t^-2``.
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from ..coding.keygen import warn_seeded_key
from ..errors import ImmersionError, InvalidArgumentError
from ..validation import finite_array
from . import kernels
from .convert import HistoryForm
from .params import ERROR_BOUND, HE_STANDARD_SOURCE, HE_STANDARD_TERNARY
from .rlwe import Encryptor, RlweSecretKey, expand_uniform
from .rns import PRIME_BITS, RnsRing, ntt_primes, previous_prime

#: Secret check rows packed beside the controller's rows (integrity, module docstring).
CHECK_ROWS = 2
#: Ring degrees tried, fastest first, when the precision asks for more.
DEGREES = (4096, 8192)


class WrapAroundError(ImmersionError, ValueError):
    """A value lies outside the range the design proved correct (``input_range``,
    ``output_range``): past it a ciphertext could wrap around its modulus."""


class CiphertextIntegrityError(ImmersionError):
    """The cloud's reply fails the secret check rows: it was altered, replayed, or belongs to
    another sample or key. ``u`` is withheld and the handle retired: set up again with fresh keys.
    """


@lru_cache(maxsize=8)
def ring_for(degree: int, primes: tuple[int, ...]) -> RnsRing:
    """One :class:`RnsRing` per parameter set and process (its tables take a moment to build)."""
    return RnsRing(degree, primes)


# ---------------------------------------------------------------------- the design
@dataclass(frozen=True)
class ControllerDesign:
    """Parameters and proven bounds of one encrypted controller.

    Parameters
    ----------
    degree, primes:
        Ring degree ``N`` and the RNS primes of ``Q``.
    plaintext_modulus:
        ``t``, a prime: the controller's integers live modulo ``t``.
    security_bits:
        HE-standard level the ``(N, log2 Q)`` pair reaches, or None (no claim; tests).
    coefficient_bits, signal_bits:
        ``f_c`` and ``f_v``: ``Phi^ = round(2^f_c Phi)``, ``v^ = round(2^f_v v)``.
    window:
        ``W``: past inputs the cloud keeps.
    n_input, n_output:
        ``n_y``, ``n_u``.
    signal_bounds:
        Largest ``|v^_c|`` per input slot (from the ranges).
    message_bound:
        Largest ``|U_r|`` over the real rows (must stay below ``t / 2``).
    noise_bound:
        Worst-case size of a decrypted coefficient (message plus noise; below ``Q / 2``).
    step_error_bound:
        Per output: largest ``|u - u_float|`` in one step from the same past (absolute).
    output_range:
        The ranges the precision refers to.
    prg:
        Expander of the public ``a`` of ciphertexts.
    """

    degree: int
    primes: tuple[int, ...]
    plaintext_modulus: int
    security_bits: int | None
    coefficient_bits: int
    signal_bits: int
    window: int
    n_input: int
    n_output: int
    signal_bounds: tuple[int, ...]
    message_bound: int
    noise_bound: int
    step_error_bound: tuple[float, ...]
    output_range: tuple[float, ...]
    prg: str = "aes128-ctr"

    @property
    def n_slots(self) -> int:
        """``n_v = n_y + n_u``: entries of one input ``v_k``."""
        return self.n_input + self.n_output

    @property
    def rows(self) -> int:
        """Rows packed in the coefficient polynomials: the controller's and the check rows."""
        return self.n_output + CHECK_ROWS

    @property
    def read_positions(self) -> tuple[int, ...]:
        """Coefficients of the reply that hold the rows' results."""
        return tuple(r * self.n_slots + self.n_slots - 1 for r in range(self.rows))

    @property
    def modulus(self) -> int:
        return math.prod(self.primes)

    @property
    def noise_margin_bits(self) -> float:
        """``log2(Q / 2) - log2(noise bound)``: the proven headroom of every decryption."""
        return math.log2(self.modulus / 2) - math.log2(self.noise_bound)

    @property
    def precision(self) -> float:
        """The largest one-step error relative to ``output_range`` (what ``precision=`` asks)."""
        return max(e / r for e, r in zip(self.step_error_bound, self.output_range, strict=True))

    @property
    def bytes_up(self) -> int:
        """Plant to cloud per sample: a 16-byte seed and ``b`` (``L N`` residues, 4 bytes)."""
        return 16 + 4 * len(self.primes) * self.degree

    @property
    def bytes_down(self) -> int:
        """Cloud to plant per sample: ``c0`` at the read coefficients, ``c1`` and ``c2``."""
        return 4 * len(self.primes) * (self.rows + 2 * self.degree)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "degree": self.degree,
            "modulus_bits": round(math.log2(self.modulus), 2),
            "primes": list(self.primes),
            "plaintext_modulus": self.plaintext_modulus,
            "plaintext_modulus_bits": round(math.log2(self.plaintext_modulus), 2),
            "security_bits": self.security_bits,
            "coefficient_bits": self.coefficient_bits,
            "signal_bits": self.signal_bits,
            "window": self.window,
            "noise_margin_bits": round(self.noise_margin_bits, 2),
            "precision": self.precision,
            "step_error_bound": list(self.step_error_bound),
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "source": HE_STANDARD_SOURCE if self.security_bits else None,
        }


def history_matrices(history: HistoryForm) -> list[np.ndarray]:
    """``Phi_j = [Theta_y,j  Theta_u,j+1]`` for ``j = 0..W`` (``Theta_u,W+1 = 0``)."""
    n_u = history.n_output
    out = []
    for j in range(history.window + 1):
        tu = history.theta_u[j] if j < history.window else np.zeros((n_u, n_u))
        out.append(np.hstack([history.theta_y[j], tu]))
    return out


def _quantise(matrix: np.ndarray, bits: int) -> list[list[int]]:
    return [[math.floor(math.ldexp(float(x), bits) + 0.5) for x in row] for row in matrix]


def _candidate(
    phis: list[np.ndarray], ranges: np.ndarray, n_input: int, t: int, signal_bits: int
) -> tuple[int, list[list[list[int]]], list[int], int, list[float]] | None:
    """The largest ``f_c`` for ``t`` and ``f_v``: ``(f_c, Phi^, V^, M, error bound per row)``."""
    bounds = [math.ceil(math.ldexp(float(v), signal_bits)) for v in ranges]
    size = float(sum(np.abs(p) @ np.array(bounds, dtype=np.float64) for p in phis).max())
    if size == 0:
        return None
    f_c = max(0, math.floor(math.log2((t / 2) / size)) + 1)
    while f_c >= 0:
        quant = [_quantise(p, f_c) for p in phis]
        rows = [
            sum(abs(q[r][c]) * bounds[c] for q in quant for c in range(len(bounds)))
            for r in range(len(quant[0]))
        ]
        if max(rows) < t // 2:
            break
        f_c -= 1
    else:
        return None
    half = math.ldexp(1.0, -signal_bits - 1)
    errors = []
    for r in range(len(quant[0])):
        err = half  # the final rounding of u
        for p, q in zip(phis, quant, strict=True):
            for c in range(len(bounds)):
                err += abs(math.ldexp(q[r][c], -f_c) - float(p[r, c])) * (float(ranges[c]) + half)
                if c < n_input:  # y is rounded; the fed-back u is already on the grid
                    err += abs(float(p[r, c])) * half
        errors.append(err)
    return f_c, quant, bounds, max(rows), errors


def _noise_bound(degree: int, t: int, quant: list[list[list[int]]], bounds: list[int]) -> int:
    """Worst case of a decrypted coefficient at a read position (module docstring of
    :mod:`.rlwe`): per product ``m_Phi m_v + t (m_Phi e_v + e_Phi m_v) + t^2 e_Phi e_v``."""
    b = ERROR_BOUND
    s_v = sum(bounds)
    n_v = len(bounds)
    total = 0
    for q in quant:
        phi_l1 = sum(abs(x) for row in q for x in row) + CHECK_ROWS * n_v * (t // 2)
        message = (t // 2) * s_v  # a check row's coefficients are below t / 2
        total += message + t * b * (phi_l1 + s_v) + t * t * degree * b * b
    return total


def design_controller(
    history: HistoryForm,
    *,
    input_range: np.ndarray,
    output_range: np.ndarray,
    precision: float,
    security_bits: int | None,
    degree: int | None = None,
    n_primes: int | None = None,
    prg: str = "aes128-ctr",
) -> ControllerDesign:
    """Choose ``N``, ``Q``, ``t``, ``f_c`` and ``f_v`` for a requested precision, or refuse.

    For each ring degree (4096, then 8192, or ``degree``) the modulus is the most the HE standard
    allows at ``security_bits`` (25-bit primes), ``t`` the largest prime whose worst-case noise
    fits below ``Q / 2``, and ``(f_c, f_v)`` the split with the smallest proven one-step error
    whose messages stay below ``t / 2``. The first degree that reaches ``precision`` is taken;
    refused with the smallest precision reachable.
    """
    phis = history_matrices(history)
    ranges = np.concatenate([input_range, output_range]).astype(np.float64)
    n_y, n_u = history.n_input, history.n_output
    rows = n_u + CHECK_ROWS
    if security_bits is None and (degree is None or n_primes is None):
        raise InvalidArgumentError(
            "security_bits", "None (no security claim) needs an explicit degree and n_primes"
        )
    degrees = (degree,) if degree is not None else DEGREES
    best: ControllerDesign | None = None
    for n in degrees:
        if rows * (n_y + n_u) > n:
            continue
        if security_bits is not None:
            table = HE_STANDARD_TERNARY.get(security_bits)
            if table is None:
                raise InvalidArgumentError(
                    "security_bits", f"expected one of {sorted(HE_STANDARD_TERNARY)} or None"
                )
            count = table[n] // PRIME_BITS
        else:
            count = int(n_primes)  # type: ignore[arg-type]
        primes = ntt_primes(n, count)
        modulus = math.prod(primes)
        found = _best_for_ring(phis, ranges, n_y, n, primes, modulus, history.window)
        if found is None:
            continue
        f_c, f_v, t, bounds, message, noise, errors = found
        candidate = ControllerDesign(
            degree=n,
            primes=primes,
            plaintext_modulus=t,
            security_bits=security_bits,
            coefficient_bits=f_c,
            signal_bits=f_v,
            window=history.window,
            n_input=n_y,
            n_output=n_u,
            signal_bounds=tuple(bounds),
            message_bound=message,
            noise_bound=noise,
            step_error_bound=tuple(errors),
            output_range=tuple(float(r) for r in output_range),
            prg=prg,
        )
        if candidate.precision <= precision:
            return candidate
        if best is None or candidate.precision < best.precision:
            best = candidate
    if best is None:
        raise InvalidArgumentError(
            "sys",
            f"no ring of degree {degrees} holds this controller's {rows} rows of {n_y + n_u} "
            "slots with a noise margin",
        )
    raise InvalidArgumentError(
        "precision",
        f"{precision:g} cannot be reached for this controller "
        f"{f'at {security_bits}-bit security' if security_bits else 'in this ring'}: the "
        "smallest proven one-step error is "
        f"{best.precision:.2e} of output_range (N = {best.degree}, log2 Q = "
        f"{math.log2(best.modulus):.0f}, t ~ 2^{math.log2(best.plaintext_modulus):.1f}, "
        f"f_c = {best.coefficient_bits}, f_v = {best.signal_bits}); ask for at least that, "
        "or narrow input_range / output_range",
    )


def _best_for_ring(
    phis: list[np.ndarray],
    ranges: np.ndarray,
    n_y: int,
    degree: int,
    primes: tuple[int, ...],
    modulus: int,
    window: int,
) -> tuple[int, int, int, list[int], int, int, list[float]] | None:
    terms = len(phis)
    # t^2 N B^2 (W + 1) dominates the noise: start just below it and halve until all of it fits
    t_bits = int((math.log2(modulus / 2) - math.log2(terms * degree * ERROR_BOUND**2)) / 2)
    output_ranges = ranges[n_y:]
    while t_bits > 8:
        t = previous_prime(2**t_bits)
        best = None
        for f_v in range(1, 62):
            found = _candidate(phis, ranges, n_y, t, f_v)
            if found is None:
                continue
            f_c, quant, bounds, message, errors = found
            score = max(e / r for e, r in zip(errors, output_ranges, strict=True))
            if best is None or score < best[0]:
                best = (score, f_c, f_v, quant, bounds, message, errors)
        if best is not None:
            _, f_c, f_v, quant, bounds, message, errors = best
            noise = _noise_bound(degree, t, quant, bounds)
            if noise < modulus // 2:
                return f_c, f_v, t, bounds, message, noise, errors
        t_bits -= 1
    return None


# ---------------------------------------------------------------------- packing
def _row_polynomials(design: ControllerDesign, quant_rows: list[list[int]]) -> list[int]:
    """Coefficients (length ``N``) of one packed coefficient polynomial from its rows."""
    n_v = design.n_slots
    coeffs = [0] * design.degree
    for r, row in enumerate(quant_rows):
        for c, value in enumerate(row):
            coeffs[r * n_v + n_v - 1 - c] = value
    return coeffs


def _encrypt_polynomial(
    key: RlweSecretKey, t: int, coeffs: Sequence[int], index: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(b, a)`` in NTT form of a polynomial with (large) integer coefficients (set-up only)."""
    ring = key.ring
    residues = np.array([[c % q for c in coeffs] for q in ring.primes], dtype=np.uint64)
    _, b0, a = key.zero(index, t)
    return ring.add(b0, ring.ntt_residues(residues)), a


# ---------------------------------------------------------------------- the cloud
class ControllerTarget:
    """Cloud side: the encrypted coefficients, and one sample's products (no secret inside).

    Wire formats (uint32 arrays): input ``[seed (4 words), b (L N)]``; output ``[c0 at the read
    coefficients (rows L), c1 (L N), c2 (L N)]``; state ``[b, a]`` of the last ``W`` inputs
    (``W 2 L N``), newest first.

    Parameters
    ----------
    design:
        The design (its ring and sizes; the cloud's copy carries no scale or range).
    theta_b, theta_a:
        The ``W + 1`` coefficient ciphertexts, ``(W + 1, L, N)`` uint64 in NTT form.
    """

    coding = "lwe"

    def __init__(self, design: ControllerDesign, theta_b: np.ndarray, theta_a: np.ndarray) -> None:
        self.design = design
        self.theta_b, self.theta_a = theta_b, theta_a
        self._last: tuple[bytes, np.ndarray] | None = None  # the last input's seed and a
        self._prepared: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def ring(self) -> RnsRing:
        return ring_for(self.design.degree, self.design.primes)

    @property
    def n_input_encoded(self) -> int:
        return 4 + len(self.design.primes) * self.design.degree

    @property
    def n_state_encoded(self) -> int:
        return self.design.window * 2 * len(self.design.primes) * self.design.degree

    @property
    def n_output_encoded(self) -> int:
        d = self.design
        return len(d.primes) * (d.rows + 2 * d.degree)

    def _input(self, encoded_input: Any) -> tuple[bytes, np.ndarray]:
        words = np.asarray(encoded_input)
        if words.dtype != np.uint32 or words.shape != (self.n_input_encoded,):
            raise InvalidArgumentError(
                "encoded_input",
                f"expected {self.n_input_encoded} uint32 words, got {words.dtype} {words.shape}",
            )
        shape = (len(self.design.primes), self.design.degree)
        return words[:4].tobytes(), words[4:].reshape(shape)

    def _state(self, encoded_state: Any) -> np.ndarray:
        words = np.asarray(encoded_state)
        if words.dtype != np.uint32 or words.shape != (self.n_state_encoded,):
            raise InvalidArgumentError(
                "encoded_state",
                f"expected {self.n_state_encoded} uint32 words, got {words.dtype} {words.shape}",
            )
        d = self.design
        return words.reshape(d.window, 2, len(d.primes), d.degree)

    def _expand(self, seed: bytes) -> np.ndarray:
        """``a`` of an input ciphertext, uint32 (the last one is kept: output and step share
        it)."""
        if self._last is None or self._last[0] != seed:
            self._last = (seed, expand_uniform(self.ring, seed, self.design.prg))
        return self._last[1]

    def _operands(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The coefficient ciphertexts as the kernels read them (centred int32) and the
        readers (int32): set-up work, done once."""
        if self._prepared is None:
            q = self.ring.q[:, 0]
            readers = self.ring.readers(self.design.read_positions).astype(np.int32)
            self._prepared = (
                kernels.centred(self.theta_b, q),
                kernels.centred(self.theta_a, q),
                readers,
            )
        return self._prepared

    def output(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """The degree-2 ciphertext of ``u_k``: ``sum_j Phi_j (x) v_(k-j)`` (W + 1 products).

        Parameters
        ----------
        encoded_state:
            The window of the last ``W`` input ciphertexts (wire format above).
        encoded_input:
            This sample's input ciphertext.
        """
        seed, b = self._input(encoded_input)
        window = self._state(encoded_state)
        a = self._expand(seed)
        theta_b, theta_a, readers = self._operands()
        # c0 read at the rows' coefficients (rows, L), then c1 and c2: the wire's words
        return kernels.products(theta_b, theta_a, b, a, window, readers, self.ring.q[:, 0])

    def step(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """The next state: the input joins the window, the oldest leaves.

        Parameters
        ----------
        encoded_state, encoded_input:
            As in :meth:`output`.
        """
        seed, b = self._input(encoded_input)
        window = self._state(encoded_state)
        if not self.design.window:
            return window.reshape(-1)
        out = np.empty_like(window)
        out[0, 0], out[0, 1] = b, self._expand(seed)
        out[1:] = window[:-1]
        return out.reshape(-1)

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(output, next state)`` of one sample (the service's entry point).

        Parameters
        ----------
        encoded_state, encoded_input:
            As in :meth:`output`.
        """
        return self.output(encoded_state, encoded_input), self.step(encoded_state, encoded_input)

    def public_arrays(self) -> dict[str, np.ndarray]:
        """What a remote cloud needs: the ring, the sizes and the coefficient ciphertexts (no key,
        no gain, scale, range or plaintext modulus)."""
        d = self.design
        header = np.array([d.degree, d.window, d.n_input, d.n_output], dtype=np.int64)
        return {
            "header": header,
            "primes": np.array(d.primes, dtype=np.int64),
            "prg": np.frombuffer(d.prg.encode(), dtype=np.uint8),
            "theta_b": self.theta_b.astype(np.uint32),
            "theta_a": self.theta_a.astype(np.uint32),
        }

    @classmethod
    def from_public_arrays(cls, arrays: dict[str, np.ndarray]) -> ControllerTarget:
        """Rebuild the target from :meth:`public_arrays` (checked; the bounds are not needed).

        Parameters
        ----------
        arrays:
            What :meth:`public_arrays` returned (a set-up received by the cloud).
        """
        from .keys import PRGS

        try:
            prg = np.asarray(arrays["prg"], dtype=np.uint8).tobytes().decode()
            if prg not in PRGS:
                raise ValueError(f"unknown expander {prg!r}")
            degree, window, n_y, n_u = (int(x) for x in arrays["header"])
            primes = tuple(int(q) for q in arrays["primes"])
            theta_b = np.asarray(arrays["theta_b"], dtype=np.uint64)
            theta_a = np.asarray(arrays["theta_a"], dtype=np.uint64)
            ring_for(degree, primes)  # checks the primes and the degree
            shape = (window + 1, len(primes), degree)
            if theta_b.shape != shape or theta_a.shape != shape:
                raise ValueError(f"coefficient ciphertexts of shape {theta_b.shape}, not {shape}")
            if (n_u + CHECK_ROWS) * (n_y + n_u) > degree or min(n_y, n_u) < 1:
                raise ValueError("the rows do not fit the ring")
        except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError("setup", f"malformed controller set-up ({exc})") from None
        # the cloud needs the sizes only: no scale, range or plaintext modulus is sent
        design = ControllerDesign(
            degree, primes, 0, None, 0, 0, window, n_y, n_u, (), 0, 0, (), (), prg
        )
        target = cls(design, theta_b, theta_a)
        target._operands()  # set-up work, not the first sample's
        return target

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_last": None, "_prepared": None}  # caches are rebuilt

    def __repr__(self) -> str:
        d = self.design
        return (
            f"ControllerTarget(N={d.degree}, log2 Q={math.log2(d.modulus):.0f}, W={d.window}, "
            f"{d.n_output} outputs, encrypted coefficients)"
        )


# ---------------------------------------------------------------------- the plant
@dataclass
class _Run:
    """One encrypted run: the inputs sent (for the tag), the last ``u^``, the awaited seed."""

    inputs: list[list[int]]
    u_prev: list[int]
    pending: bytes | None = None
    failed: str | None = None
    seconds: dict[str, float] = field(default_factory=lambda: {"encrypt": 0.0, "decrypt": 0.0})


class FixedPointTwin:
    """The same integers without encryption: ``U = sum_j Phi^_j v^_(k-j)``, ``u^ = round(U /
    2^f_c)``, ``u = u^ 2^-f_v`` (what :meth:`EncryptedController.decode_output` must equal).

    Parameters
    ----------
    design:
        The controller's design (scales, window).
    quant:
        The quantised ``Phi^_j``, one list of rows per lag.
    """

    def __init__(self, design: ControllerDesign, quant: list[list[list[int]]]) -> None:
        self.design, self._quant = design, quant
        self._inputs: list[list[int]] = []
        self._u_prev = [0] * design.n_output

    def output(self, y: Any) -> np.ndarray:
        """``u_k`` for measurement ``y_k`` (the twin feeds its own ``u`` back).

        Parameters
        ----------
        y:
            The measurement ``y_k``.
        """
        d = self.design
        v = [math.floor(math.ldexp(float(x), d.signal_bits) + 0.5) for x in y] + self._u_prev
        self._inputs = [v] + self._inputs[: d.window]
        totals = [
            sum(
                sum(a * b for a, b in zip(self._quant[j][r], past, strict=True))
                for j, past in enumerate(self._inputs)
            )
            for r in range(d.n_output)
        ]
        self._u_prev = [_round_shift(x, d.coefficient_bits) for x in totals]
        return np.array([math.ldexp(float(u), -d.signal_bits) for u in self._u_prev])


def _round_shift(x: int, bits: int) -> int:
    """``round(x / 2^bits)``, halves up (integers only)."""
    return (x + (1 << (bits - 1))) >> bits if bits else x


class EncryptedController:
    """Plant side of an encrypted controller: keys, encryption, decryption, the integrity check.

    Made by :func:`immersion.lwe.encrypt_controller`. The loop is the one of every coding::

        xt = ctrl.encode_state()                                  # plant: a run starts at rest
        yt = ctrl.encode_input(y)                                 # plant: y_k and u_(k-1)
        u = ctrl.decode_output(ctrl.target.output(xt, yt), yt)    # cloud, then plant
        xt = ctrl.target.step(xt, yt)                             # cloud

    Parameters
    ----------
    design:
        The design (ring, scales, proven bounds).
    key:
        The secret key.
    quant:
        The quantised coefficients (for the twin; never used per sample).
    history:
        The history form (for the report's residual and ``x0``'s size).
    target:
        The cloud's part, handed over once.
    input_range, output_range:
        The promised bounds on ``|y|`` and ``|u|``.
    tag:
        The check rows' secrets ``(rho, kappa)``.
    """

    coding = "lwe"

    def __init__(
        self,
        design: ControllerDesign,
        key: RlweSecretKey,
        quant: list[list[list[int]]],
        history: HistoryForm,
        target: ControllerTarget,
        input_range: np.ndarray,
        output_range: np.ndarray,
        tag: tuple[list[list[int]], list[list[list[int]]]],
    ) -> None:
        self.design, self._key, self.target = design, key, target
        self._quant, self._history = quant, history
        self.input_range, self.output_range = input_range, output_range
        self._rho, self._kappa = tag
        self._kappa_flat = [[k for lag in rows for k in lag] for rows in self._kappa]
        self._encryptor = Encryptor(key, design.plaintext_modulus, range(design.n_slots))
        self._readers = key.ring.readers(design.read_positions).astype(np.int32)
        self._run: _Run | None = None
        self._tampered: str | None = None  # set by the first failed check: the key is retired
        self._u_bound = design.signal_bounds[design.n_input :]

    # -- the loop
    def encode_state(self, x0: Any = None) -> np.ndarray:
        """Start a run with the controller at rest; the cloud's state is the empty window.

        Parameters
        ----------
        x0:
            None or zero: the history form starts from rest (a non-zero initial state would
            need its response ``H F_R^k x0`` added, which is controller work).
        """
        if x0 is not None:
            x = finite_array("x0", x0)
            if x.shape != (self._history.n_state,):
                raise InvalidArgumentError(
                    "x0", f"expected shape ({self._history.n_state},), got {x.shape}"
                )
            if np.any(x != 0):
                raise InvalidArgumentError(
                    "x0",
                    "coding='lwe' starts the controller at rest (x0 = 0); a non-zero initial "
                    "state is not supported (let the controller settle from rest)",
                )
        if self._tampered:
            raise CiphertextIntegrityError(
                f"this handle saw a tampered reply ({self._tampered}); set up again with fresh "
                "keys (encrypt_controller): reusing the key would let a tampering cloud learn "
                "one bit per attempt"
            )
        d = self.design
        self._run = _Run(inputs=[], u_prev=[0] * d.n_output)
        return np.zeros(self.target.n_state_encoded, dtype=np.uint32)

    def precompute(self, count: int) -> None:
        """Compute ``count`` encryptions of zero ahead (the offline part of encryption).

        Parameters
        ----------
        count:
            How many.
        """
        self._encryptor.precompute(count)

    def encode_input(self, y: Any) -> np.ndarray:
        """Encrypt ``v_k = [y_k; u_(k-1)]`` (range-checked) as one ciphertext.

        Parameters
        ----------
        y:
            The measurement ``y_k``, within ``input_range``.
        """
        run = self._started()
        d = self.design
        values = finite_array("y", y).reshape(-1)
        if values.shape != (d.n_input,):
            raise InvalidArgumentError("y", f"expected {d.n_input} values, got {values.shape}")
        if np.any(np.abs(values) > self.input_range):
            raise WrapAroundError(
                f"y = {values.tolist()} is outside input_range {self.input_range.tolist()}"
            )
        tick = time.perf_counter()
        v = [math.floor(math.ldexp(float(x), d.signal_bits) + 0.5) for x in values] + run.u_prev
        ct = self._encryptor.encrypt(v)
        run.inputs = [v] + run.inputs[: d.window]
        run.pending = ct.seed
        words = np.empty(4 + ct.b.size, dtype=np.uint32)
        words[:4] = np.frombuffer(ct.seed, dtype=np.uint32)
        words[4:] = ct.b.reshape(-1)
        run.seconds["encrypt"] += time.perf_counter() - tick
        return words

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> np.ndarray:
        """Decrypt ``u_k``, check the tag, round; raise instead of returning a wrong ``u``.

        Parameters
        ----------
        encoded_output:
            The cloud's reply to ``encoded_input``.
        encoded_input:
            The input this handle encoded last.
        """
        run = self._started()
        d = self.design
        if run.failed:
            raise CiphertextIntegrityError(f"the run was stopped: {run.failed}")
        yt = np.asarray(encoded_input)
        if run.pending is None or yt.dtype != np.uint32 or yt[:4].tobytes() != run.pending:
            raise InvalidArgumentError(
                "encoded_input", "is not the input this handle encoded last (decode it first)"
            )
        tick = time.perf_counter()
        ut = np.asarray(encoded_output)
        if ut.dtype != np.uint32 or ut.shape != (self.target.n_output_encoded,):
            return self._fail(run, f"a reply of {ut.dtype} {ut.shape}, not the expected form")
        L, n, rows = len(d.primes), d.degree, d.rows
        c0 = ut[: rows * L].reshape(rows, L).astype(np.uint64)
        c1 = ut[rows * L : rows * L + L * n].reshape(L, n)
        c2 = ut[rows * L + L * n :].reshape(L, n)
        values = None
        if not np.any(c0 >= self._key.ring.q[:, 0]):
            values = self._key.decrypt(c0, c1, c2, self._readers)
        if values is None:
            return self._fail(run, "a reply word is not a residue")
        t = d.plaintext_modulus
        mod_t = [((x + t // 2) % t) - t // 2 for x in values]  # centred modulo t
        totals = mod_t[: d.n_output]
        history = [x for past in run.inputs for x in past]  # v_k, v_(k-1), ... flattened
        for i in range(CHECK_ROWS):
            expected = sum(map(operator.mul, self._rho[i], totals))
            expected += sum(map(operator.mul, self._kappa_flat[i], history))
            if (mod_t[d.n_output + i] - expected) % t:
                return self._fail(run, "the reply fails the secret check rows")
        u_hat = [_round_shift(x, d.coefficient_bits) for x in totals]
        if any(abs(u) > b for u, b in zip(u_hat, self._u_bound, strict=True)):
            self._run = None
            raise WrapAroundError(
                f"u = {[math.ldexp(float(u), -d.signal_bits) for u in u_hat]} left output_range "
                f"{self.output_range.tolist()}; the proven bounds no longer hold (run stopped)"
            )
        run.u_prev, run.pending = u_hat, None
        run.seconds["decrypt"] += time.perf_counter() - tick
        return np.array([math.ldexp(float(u), -d.signal_bits) for u in u_hat])

    def _fail(self, run: _Run, reason: str) -> np.ndarray:
        run.failed = self._tampered = reason
        raise CiphertextIntegrityError(reason)

    def _started(self) -> _Run:
        if self._run is None:
            raise InvalidArgumentError(
                "encode_state", "start a run with encode_state() before encoding inputs"
            )
        return self._run

    # -- references and reports
    def fixed_point_twin(self) -> FixedPointTwin:
        """A fresh twin on the same integers (bit-identical ``u``, sample by sample)."""
        return FixedPointTwin(self.design, self._quant)

    def report(self) -> dict[str, Any]:
        """The design, its proven bounds, the bytes per sample and who does what.

        ``precision`` and ``step_error_bound`` are one-step bounds (same past), not closed-loop
        ones: ``precision_scope`` says so in words.
        """
        out = self.design.as_dict()
        out.update(
            {
                "coding": "lwe",
                "scheme": "RLWE (BGV), encrypted coefficients x encrypted signals, history form",
                "gains": "encrypted (the cloud never sees a coefficient)",
                "integrity_rows": CHECK_ROWS,
                "integrity_forgery_bound": (3 / self.design.plaintext_modulus) ** CHECK_ROWS,
                "history_residual": self._history.residual,
                "precision_scope": PRECISION_SCOPE,
                "numba": kernels.available(),
                "key_fingerprint": self._key.fingerprint,
            }
        )
        return out

    def __repr__(self) -> str:
        d = self.design
        return (
            f"EncryptedController(N={d.degree}, log2 Q={math.log2(d.modulus):.0f}, "
            f"W={d.window}, precision={d.precision:.1e}, key={self._key.fingerprint})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("the plant's handle holds the secret key and is not pickled")


#: What ``precision`` and ``step_error_bound`` bound, and what they do not (in the report).
PRECISION_SCOPE = (
    "precision and step_error_bound bound ONE sample: |u - u_float| for the float controller "
    "fed the same past y and u (the quantised coefficients and signals; the decryption is exact, "
    "bit for bit the fixed-point twin's). They do not bound a closed loop against the plain "
    "float loop: there each sample's error feeds back through the plant and the controller's "
    "history and accumulates (e.g. 2.0e-5 proven, 3.7e-5 measured over 2,000 samples in "
    "control_demos/encrypted_lqg.py); measure that drift with the twin or the plain loop, or "
    "ask for a finer precision"
)


def encrypt_history(
    history: HistoryForm,
    *,
    input_range: np.ndarray,
    output_range: np.ndarray,
    precision: float = 1e-4,
    security_bits: int | None = 128,
    degree: int | None = None,
    n_primes: int | None = None,
    rng: Any = None,
    secure: bool = False,
    prg: str = "auto",
) -> EncryptedController:
    """Design, key, tag and encrypted coefficients for a history form (set-up, on the plant).

    The only time the plant touches the controller's coefficients: it quantises and encrypts
    them, then hands :attr:`EncryptedController.target` to the cloud.
    """
    from .keys import resolve_prg

    prg = resolve_prg(prg)
    design = design_controller(
        history,
        input_range=input_range,
        output_range=output_range,
        precision=precision,
        security_bits=security_bits,
        degree=degree,
        n_primes=n_primes,
        prg=prg,
    )
    ring = ring_for(design.degree, design.primes)
    warn_seeded_key(rng, "lwe")
    key = RlweSecretKey.generate(ring, rng=rng, secure=secure, prg=prg)
    phis = history_matrices(history)
    quant = [_quantise(p, design.coefficient_bits) for p in phis]
    t = design.plaintext_modulus
    tag_words = key._stream(
        b"tag", 0, 32 * CHECK_ROWS * (design.n_output + (history.window + 1) * design.n_slots)
    )
    draws = iter(
        int.from_bytes(tag_words[i : i + 32], "little") % t for i in range(0, len(tag_words), 32)
    )
    rho = [[next(draws) for _ in range(design.n_output)] for _ in range(CHECK_ROWS)]
    kappa = [
        [[next(draws) for _ in range(design.n_slots)] for _ in range(history.window + 1)]
        for _ in range(CHECK_ROWS)
    ]
    theta_b = np.empty((history.window + 1, len(design.primes), design.degree), dtype=np.uint64)
    theta_a = np.empty_like(theta_b)
    for j, q in enumerate(quant):
        checks = [
            [
                _centred(
                    sum(rho[i][r] * q[r][c] for r in range(design.n_output)) + kappa[i][j][c], t
                )
                for c in range(design.n_slots)
            ]
            for i in range(CHECK_ROWS)
        ]
        coeffs = _row_polynomials(design, q + checks)
        theta_b[j], theta_a[j] = _encrypt_polynomial(key, t, coeffs, index=2**62 + j)
    target = ControllerTarget(design, theta_b, theta_a)
    return EncryptedController(
        design, key, quant, history, target, input_range, output_range, (rho, kappa)
    )


def ranges(name: str, value: Any, size: int) -> np.ndarray:
    """A positive finite bound per component (a scalar applies to all), naming ``name``."""
    if value is None:
        raise InvalidArgumentError(
            name,
            "is required: the largest magnitude the signal can take (it sizes the fixed-point "
            "scales and proves that no ciphertext wraps around its modulus)",
        )
    try:
        arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (size,)).copy()
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            name, f"expected a positive number or {size} of them ({exc})"
        ) from None
    arr = finite_array(name, arr)
    if (arr <= 0).any():
        raise InvalidArgumentError(name, f"expected positive bounds on |value|, got {arr.tolist()}")
    return arr


def _centred(x: int, t: int) -> int:
    x %= t
    return x - t if x > t // 2 else x
