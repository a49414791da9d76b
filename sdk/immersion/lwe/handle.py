"""The user's side of the LWE coding: the same loop as ``immerse``, on LWE ciphertexts.

    xt = imm.encode_state(x0)                              # user: starts an encrypted run
    yt = imm.encode_input(y)                               # user: y and the last applied u
    u = imm.decode_output(imm.target.output(xt, yt), yt)   # cloud, then user
    xt = imm.target.step(xt, yt)                           # cloud

The history form needs the applied ``u`` back in the cloud, encrypted: ``encode_input`` packs
``u_(k-1)`` (decoded by this handle one sample earlier) next to ``y_k``, so the loop is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._validation import finite_array
from ..errors import ImmersionError, InvalidArgumentError
from .convert import HistoryForm, LinearController
from .encryption import EncryptionStream
from .fixed_point import FixedPointDesign, FixedPointTwin, WrapAroundError, quantize
from .keys import LweSecretKey
from .params import LweParameters
from .report import LweReport, lwe_report
from .target import HEADER, LweTarget


class CiphertextIntegrityError(ImmersionError):
    """A decrypted output is not a multiple of ``L`` once its noise is removed: the cloud's reply
    was altered.

    Stop the loop. The check depends on the alteration only (the user removes the noise exactly),
    so its outcome tells a tampering cloud nothing about the key; an alteration by a multiple of
    ``L`` passes it (integrity is not protected, THREAT_MODEL.md).
    """


class _Run:
    """One encrypted run: its public seed, the sample index, and the pads of the cloud's state."""

    def __init__(
        self, seed: bytes, stream: EncryptionStream, n_window: int, n_feedback: int
    ) -> None:
        self.seed = seed
        self.header: list[int] = np.frombuffer(seed, dtype="<u8").tolist() + [0]
        self.stream = stream
        self.window_pads = [0] * n_window
        self.u_prev = [0] * n_feedback
        self.initial: list[list[int]] = []
        self.pending: tuple[list[int], list[int]] | None = None  # (header of y~, its pads)

    @property
    def step(self) -> int:
        return int(self.header[2])


class LweImmersion:
    """User-side handle of an LWE-encrypted linear controller (:func:`encrypt_controller`).

    ``imm.target`` (:class:`LweTarget`) is what goes to the cloud; this object keeps the secret
    key, the pads (``<a, s> + e``) of the cloud's ciphertexts and the last applied ``u``. Build
    it with :func:`immersion.lwe.encrypt_controller`.

    Parameters
    ----------
    key:
        The secret key (:class:`~immersion.lwe.keys.LweSecretKey`).
    controller, history, design:
        The controller, its history form and its fixed-point design.
    input_range, output_range:
        Bounds on ``|y|`` and ``|u|`` per component.
    prg:
        Expander of the public vectors (``"aes128-ctr"`` or ``"shake128"``).
    """

    coding = "lwe"

    def __init__(
        self,
        *,
        key: LweSecretKey,
        controller: LinearController,
        history: HistoryForm,
        design: FixedPointDesign,
        input_range: np.ndarray,
        output_range: np.ndarray,
        prg: str,
    ) -> None:
        self._key = key
        self.params: LweParameters = key.params
        self.controller, self.history, self.design = controller, history, design
        self.input_range, self.output_range = input_range, output_range
        self._input_range = input_range.tolist()
        self.prg = prg
        self.target = LweTarget.from_design(design, self.params.modulus_bits)
        self.ring = self.target.ring
        self.n_state, self.n_input, self.n_output = (
            controller.n_state,
            controller.n_input,
            controller.n_output,
        )
        self._per_sample = self.n_input + self.target.n_feedback
        self._scale_bits = design.noise_bits
        self._runs = 0
        self._run: _Run | None = None

    # ------------------------------------------------------------ the loop
    def encode_state(self, x0: Any = None) -> np.ndarray:
        """Start an encrypted run from controller state ``x0`` (default 0): the cloud's state.

        The cloud's state is the (empty) encrypted history; ``x0`` acts through ``H F_R^k x0`` in
        the first ``N`` samples, added on this side after decryption: it never leaves the user.

        Parameters
        ----------
        x0:
            Initial controller state ``(n_state,)``, or None for zeros.

        Returns
        -------
        numpy.ndarray
            uint64 words: the header ``[seed_lo, seed_hi, 0]`` and the empty window.
        """
        x0 = np.zeros(self.n_state) if x0 is None else x0
        x0 = finite_array("x0", x0, last_dim=self.n_state, ndim=1)
        initial = self.design.initial_terms(x0)
        seed = self._key.episode_seed(self._runs)
        self._runs += 1
        stream = EncryptionStream(self._key, self.ring, seed, self.prg, self._per_sample)
        run = _Run(seed, stream, self.design.n_window, self.target.n_feedback)
        run.initial = initial
        self._run = run
        empty = self.ring.pack([0] * self.design.n_window)  # the empty history: trivial zeros
        return np.concatenate([np.array(run.header, dtype=np.uint64), empty])

    def encode_input(self, y: Any) -> np.ndarray:
        """Encrypt ``y_k`` and the last applied ``u_(k-1)``: the header and ``b`` words of each.

        Parameters
        ----------
        y:
            The measurement ``(n_input,)``, within ``input_range``.

        Returns
        -------
        numpy.ndarray
            uint64 words: header, then the ``b`` words of ``y_k`` and ``u_(k-1)``.
        """
        run = self._started()
        if run.pending is not None:
            raise InvalidArgumentError(
                "y",
                "the previous encoded input has no decoded output yet: call decode_output(u~, y~) "
                "once per sample before encoding the next input (the applied u is fed back)",
            )
        values = finite_array("y", y, last_dim=self.n_input, ndim=1).tolist()
        for j, (v, bound) in enumerate(zip(values, self._input_range, strict=True)):
            if abs(v) > bound:
                raise WrapAroundError(
                    f"input_range: y[{j}] = {v:.6g} is outside the declared range +-{bound:.6g}; "
                    "encrypted, it could wrap around the modulus"
                )
        messages = quantize(values, self.design.frac_input) + run.u_prev
        pads = run.stream.take(self._per_sample)
        shift, mask = self._scale_bits, self.ring.mask
        body = [(p + (m << shift)) & mask for p, m in zip(pads, messages, strict=True)]
        run.pending = (list(run.header), pads)
        return np.array(run.header + self.ring.limb_list(body), dtype=np.uint64)

    def decode_output(self, encoded_output: Any, encoded_input: Any) -> np.ndarray:
        """Decrypt ``u~`` (computed from ``encoded_input``): subtract its pad, noise included,
        divide by ``L``, rescale: ``u``.

        Bit-identical to :meth:`fixed_point_twin`'s ``u``. Raises :class:`CiphertextIntegrityError`
        if what is left is not a multiple of ``L`` (an altered reply) and
        :class:`~immersion.lwe.WrapAroundError` if ``u`` leaves ``output_range``.

        Parameters
        ----------
        encoded_output:
            The cloud's ``target.output(xt, yt)``.
        encoded_input:
            The ``yt`` it was computed from (the one this handle encoded last).

        Returns
        -------
        numpy.ndarray
            ``u`` ``(n_output,)``.
        """
        run = self._started()
        target, ring = self.target, self.ring
        u_words = target.words("encoded_output", encoded_output, target.n_output_encoded).tolist()
        header = target.words("encoded_input", encoded_input, target.n_input_encoded)[
            :HEADER
        ].tolist()
        if run.pending is None or header != run.pending[0]:
            raise InvalidArgumentError(
                "encoded_input", "is not the input this handle encoded last (one decode per sample)"
            )
        if u_words[:HEADER] != header:
            raise InvalidArgumentError(
                "encoded_output", "answers another sample than encoded_input (headers differ)"
            )
        pads = run.pending[1]
        expected = target.combine(pads, run.window_pads)
        shift, low = self._scale_bits, (1 << self._scale_bits) - 1
        acc = []
        for b, m in zip(ring.unpack(u_words[HEADER:]), expected, strict=True):
            phase = ring.centered(b - m)  # L acc exactly: the noise is in the pad
            if phase & low:
                raise CiphertextIntegrityError(
                    "encoded_output: it is not a multiple of L once its noise is removed; the "
                    "cloud's reply was altered (stop the loop)"
                )
            acc.append(phase >> shift)
        k = run.step
        u_q = self.design.finish(acc, run.initial[k] if k < self.design.window else None)
        run.window_pads = target.shift(run.window_pads, pads)
        if target.n_feedback:
            run.u_prev = u_q
        run.header[2] = k + 1
        run.pending = None
        return self.design.to_float(u_q)

    def _started(self) -> _Run:
        if self._run is None:
            raise InvalidArgumentError(
                "encode_state", "start a run with encode_state(x0) before encoding inputs"
            )
        return self._run

    # ------------------------------------------------------------ reports and twins
    def fixed_point_twin(self) -> FixedPointTwin:
        """The same integer controller without encryption (its ``u`` equals the decoded ``u``)."""
        return FixedPointTwin(self.design)

    def report(self) -> LweReport:
        """Parameters (with their table), bits budget, precision bound and bytes per sample."""
        t = self.target
        return lwe_report(
            self.params,
            self.design,
            input_range=self.input_range,
            output_range=self.output_range,
            residual=self.history.residual,
            sizes=(t.n_input_encoded, t.n_output_encoded, t.n_state_encoded),
            prg=self.prg,
        )

    def __repr__(self) -> str:
        p = self.params
        level = f"{p.security_bits}-bit" if p.security_bits else "no security claim"
        return (
            f"LweImmersion(n_state={self.n_state}, n_input={self.n_input}, "
            f"n_output={self.n_output}, "
            f"n={p.dimension}, q=2^{p.modulus_bits}, {level}, key {self._key.fingerprint})"
        )
