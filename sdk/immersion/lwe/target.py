"""The cloud side of the LWE coding: one public integer matrix and a 0/1 shift, on ciphertext words.

An LWE ciphertext of ``m`` under the secret ``s`` is ``(b, a)`` with ``b = <a, s> + e + L m mod q``.
Integer linear maps act on the ``b`` words and on the ``a`` vectors separately, and the ``a`` of
every ciphertext here is a public function of the run's seed (uplink ciphertexts: expanded from
the seed; the cloud's own: the same integer combinations of those). So the cloud computes on ``b``
words only: what it holds and sends are LWE ciphertexts with their public part left implicit,
which anyone may expand (:func:`immersion.lwe.public_part`).

Words on the wire are uint64 arrays: a header ``[seed_lo, seed_hi, step]`` (public: the run's
seed and the sample index) followed by the ``b`` words (``limbs`` per element of ``Z_q``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .fixed_point import FixedPointDesign, shift_window
from .ring import Ring

#: Header words: the run's public seed (two words) and the sample index.
HEADER = 3


class LweTarget:
    """What the cloud runs: ``u~ = M [y~_k, u~_(k-1), window]`` and the window shift.

    Holds the public integer matrix ``M`` (:class:`~immersion.lwe.fixed_point.FixedPointDesign`),
    the window layout and the modulus; no key, no error, no float coefficient. Pickles as is.
    ``output(xt, yt)``, ``step(xt, yt)`` and ``advance(xt, yt) = (output, step)``, as
    :class:`immersion.TargetAlgorithm`.

    Parameters
    ----------
    matrix:
        Rows of integers: ``acc = M [y_k, u_(k-1), window]``.
    n_input, n_output, window:
        Sizes of ``y``, ``u`` and the history window ``N``.
    modulus_bits:
        ``log2 q``.
    """

    coding = "lwe"

    def __init__(
        self,
        *,
        matrix: Any,
        n_input: int,
        n_output: int,
        window: int,
        modulus_bits: int,
    ) -> None:
        self.ring = Ring(modulus_bits)
        self.n_input, self.n_output, self.window = n_input, n_output, window
        self.n_feedback = n_output if window else 0
        self.n_window = window * n_input + max(window - 1, 0) * n_output
        rows = tuple(tuple(int(c) for c in row) for row in matrix)
        cols = n_input + self.n_feedback + self.n_window
        if len(rows) != n_output or any(len(row) != cols for row in rows):
            raise InvalidArgumentError("matrix", f"expected {n_output} rows of {cols} integers")
        self.matrix = rows
        limbs = self.ring.limbs
        self.n_input_encoded = HEADER + (n_input + self.n_feedback) * limbs
        self.n_state_encoded = HEADER + self.n_window * limbs
        self.n_output_encoded = HEADER + n_output * limbs

    @classmethod
    def from_design(cls, fp: FixedPointDesign, modulus_bits: int) -> LweTarget:
        """The target of a fixed-point design.

        Parameters
        ----------
        fp:
            The design (its integer matrix and sizes).
        modulus_bits:
            ``log2 q``.

        Returns
        -------
        LweTarget
        """
        return cls(
            matrix=fp.matrix,
            n_input=fp.n_input,
            n_output=fp.n_output,
            window=fp.window,
            modulus_bits=modulus_bits,
        )

    # ------------------------------------------------------------ public description
    def public_arrays(self) -> dict[str, np.ndarray]:
        """What a remote cloud needs, integers only: ``M`` modulo ``q`` as words, and the sizes."""
        ring = self.ring
        flat = [c & ring.mask for row in self.matrix for c in row]
        sizes = [self.n_input, self.n_output, self.window, ring.bits]
        return {"matrix": ring.pack(flat), "sizes": np.array(sizes, dtype=np.int64)}

    @classmethod
    def from_public_arrays(cls, arrays: dict[str, np.ndarray]) -> LweTarget:
        """Inverse of :meth:`public_arrays` (what ``immersion serve`` builds).

        Parameters
        ----------
        arrays:
            ``{"matrix": uint64 words, "sizes": [n_input, n_output, window, modulus_bits]}``.

        Returns
        -------
        LweTarget
        """
        try:
            n_input, n_output, window, bits = (int(v) for v in arrays["sizes"])
            ring = Ring(bits)
            words = np.asarray(arrays["matrix"])
            if words.dtype != np.uint64 or words.ndim != 1:
                raise ValueError("matrix words must be a 1-D uint64 array")
            flat = [ring.centered(v) for v in ring.unpack(words)]
        except (KeyError, ValueError, TypeError, InvalidArgumentError) as exc:
            raise InvalidArgumentError("setup", f"not an LWE target description ({exc})") from None
        if min(n_input, n_output) < 1 or window < 0:
            raise InvalidArgumentError("setup", f"bad sizes {arrays['sizes'].tolist()}")
        cols = n_input + (n_output if window else 0) + window * n_input
        cols += max(window - 1, 0) * n_output
        if len(flat) != n_output * cols:
            raise InvalidArgumentError("setup", "the matrix size does not match the sizes")
        rows = [flat[i * cols : (i + 1) * cols] for i in range(n_output)]
        return cls(
            matrix=rows, n_input=n_input, n_output=n_output, window=window, modulus_bits=bits
        )

    # ------------------------------------------------------------ the target algorithm
    def words(self, name: str, value: Any, size: int) -> np.ndarray:
        """``value`` as a uint64 array of ``size`` words, or an error naming ``name``.

        Parameters
        ----------
        name, value, size:
            The argument's name, its value and the expected number of words.

        Returns
        -------
        numpy.ndarray
        """
        if type(value) is np.ndarray and value.dtype == np.uint64 and value.shape == (size,):
            return value
        arr = np.asarray(value)
        if arr.dtype != np.uint64 or arr.shape != (size,):
            raise InvalidArgumentError(
                name,
                f"expected a uint64 array of shape ({size},) (header and ciphertext words), "
                f"got {arr.dtype} {arr.shape}",
            )
        return arr

    def _checked(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        xt = self.words("encoded_state", encoded_state, self.n_state_encoded)
        yt = self.words("encoded_input", encoded_input, self.n_input_encoded)
        if xt[:HEADER].tobytes() != yt[:HEADER].tobytes():
            raise InvalidArgumentError(
                "encoded_input",
                f"is for run/sample {yt[:HEADER].tolist()}, the state is at "
                f"{xt[:HEADER].tolist()}: each encoded input is used once, in order",
            )
        return xt, yt

    def combine(self, fresh: list[int], window: list[int]) -> list[int]:
        """``M [fresh, window] mod q`` (the user applies the same map to the masks).

        Parameters
        ----------
        fresh, window:
            Ring elements ``[y_k, u_(k-1)]`` and the window.

        Returns
        -------
        list[int]
        """
        return self.ring.combine(self.matrix, fresh + window)

    def shift(self, window: Any, fresh: Any, width: int = 1) -> Any:
        """The state update: a 0/1 shift of the window (``width`` words per element).

        Parameters
        ----------
        window, fresh:
            The window and ``[y_k, u_(k-1)]`` (words or ring elements).
        width:
            Entries per element (the limbs of a wide ring element).

        Returns
        -------
        The shifted window, of the type of ``window``.
        """
        return shift_window(window, fresh, self.n_input, self.n_output, self.window, width)

    def output(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """``u~``: the header of ``y~`` and the ``b`` words of ``M [y~, u~_prev, window]``.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~`` (uint64 words) of the same sample.

        Returns
        -------
        numpy.ndarray (``advance``: a pair)
        """
        xt, yt = self._checked(encoded_state, encoded_input)
        return self._output(xt.tolist(), yt.tolist())

    def _output(self, xt: list[int], yt: list[int]) -> np.ndarray:
        ring = self.ring
        body = self.combine(ring.unpack(yt[HEADER:]), ring.unpack(xt[HEADER:]))
        return np.array(yt[:HEADER] + ring.limb_list(body), dtype=np.uint64)

    def step(self, encoded_state: Any, encoded_input: Any) -> np.ndarray:
        """``x~+``: the window shifted by one sample (header: the next sample).

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~`` (uint64 words) of the same sample.

        Returns
        -------
        numpy.ndarray (``advance``: a pair)
        """
        xt, yt = self._checked(encoded_state, encoded_input)
        return self._step(xt.tolist(), yt.tolist())

    def _step(self, xt: list[int], yt: list[int]) -> np.ndarray:
        header = [yt[0], yt[1], yt[2] + 1]
        window = self.shift(xt[HEADER:], yt[HEADER:], self.ring.limbs)
        return np.array(header + window, dtype=np.uint64)

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(output, step)`` of one sample, checking the arguments once.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~`` (uint64 words) of the same sample.

        Returns
        -------
        numpy.ndarray (``advance``: a pair)
        """
        xt, yt = self._checked(encoded_state, encoded_input)
        xs, ys = xt.tolist(), yt.tolist()
        return self._output(xs, ys), self._step(xs, ys)

    def __repr__(self) -> str:
        return (
            f"LweTarget(n_input={self.n_input}, n_output={self.n_output}, window={self.window}, "
            f"q=2^{self.ring.bits})"
        )
