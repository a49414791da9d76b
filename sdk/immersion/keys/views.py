"""Shapes and dense views shared by the float and the integer keys (one definition for both).

A code holds either explicit matrices (:class:`ExplicitShape`: ``pi``, ``pi_left``,
``noise_basis``) or positions inside a structured transform (:class:`PositionedShape`:
``signal_pos``, ``noise_pos`` and a ``mix`` with a ``size``); keys hold three codes
(:class:`KeyViews`: ``input_code``, ``state_code``, ``output_code``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ExplicitShape:
    """Sizes and dense views of a code given by explicit matrices."""

    pi: np.ndarray
    pi_left: np.ndarray
    noise_basis: np.ndarray

    @property
    def n_signal(self) -> int:
        return int(self.pi.shape[1])

    @property
    def n_total(self) -> int:
        return int(self.pi.shape[0])

    @property
    def n_noise(self) -> int:
        return int(self.noise_basis.shape[1])

    def dense_pi(self) -> np.ndarray:
        return self.pi

    def dense_pi_left(self) -> np.ndarray:
        return self.pi_left

    def dense_noise_basis(self) -> np.ndarray:
        return self.noise_basis


class PositionedShape:
    """Sizes of a code given by signal and noise positions in a structured transform."""

    mix: Any
    signal_pos: np.ndarray
    noise_pos: np.ndarray

    @property
    def n_signal(self) -> int:
        return int(self.signal_pos.shape[0])

    @property
    def n_total(self) -> int:
        return int(self.mix.size)

    @property
    def n_noise(self) -> int:
        return int(self.noise_pos.shape[0])


class KeyViews:
    """Dense views ``Pi1 .. Pi3_left``, ``N1``, the key kind and the dimensions of three codes."""

    input_code: Any
    state_code: Any
    output_code: Any

    @property
    def Pi1(self) -> np.ndarray:
        return self.input_code.dense_pi()

    @property
    def Pi1_left(self) -> np.ndarray:
        return self.input_code.dense_pi_left()

    @property
    def N1(self) -> np.ndarray:
        return self.input_code.dense_noise_basis()

    @property
    def Pi2(self) -> np.ndarray:
        return self.state_code.dense_pi()

    @property
    def Pi2_left(self) -> np.ndarray:
        return self.state_code.dense_pi_left()

    @property
    def Pi3(self) -> np.ndarray:
        return self.output_code.dense_pi()

    @property
    def Pi3_left(self) -> np.ndarray:
        return self.output_code.dense_pi_left()

    @property
    def kind(self) -> str:
        return str(self.input_code.kind)

    @property
    def dims(self) -> dict[str, int]:
        return {
            "n_state": self.state_code.n_signal,
            "n_input": self.input_code.n_signal,
            "n_output": self.output_code.n_signal,
            "extra_state": self.state_code.n_noise,
            "extra_input": self.input_code.n_noise,
            "extra_output": self.output_code.n_noise,
        }
