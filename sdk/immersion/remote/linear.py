"""Remote targets for linear controllers ``x+ = A x + B y``, ``u = C x + D y``: no plugin needed.

A handle made by :func:`~immersion.immerse_system` from a ``control.StateSpace`` or ``(A, B, C,
D)`` remembers its matrices (``controller_matrices``); remote mode then ships the controller as
data instead of naming a registered algorithm (an arbitrary ``f``, ``g`` is code, and no code
travels: it still needs a registered algorithm, see :mod:`immersion.plugins.hookspecs`).

* ``"linear"`` (float immersion): seed 002 eq. 17 with ``f``, ``g`` linear is itself linear,
  ``x~+ = (Pi2 A Pi2_left) x~ + (Pi2 B Pi1_left) y~`` and
  ``u~ = (Pi3 C Pi2_left) x~ + (Pi3 D Pi1_left + Pi4) y~``. The set-up carries these four
  encoded matrices only: no key, no left inverse, not ``A, B, C, D``.
* ``"linear-modular"`` (modular immersion): the fixed-point rounding of every value that crosses
  the link (``q(v) = round(v 2^f)``) is not linear modulo ``2^64``, so the products cannot be
  folded; the set-up carries what the in-process :class:`~immersion.coding.modular.ModularTarget`
  holds, minus ``N1_left``: the integer ``Pi1_left, Pi2, Pi2_left, Pi3``, the dense mask ``Pi4``
  and ``A, B, C, D``. The result is bit-identical to the in-process target.

The ``lwe`` coding needs nothing here: its target is built from public arrays already.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

#: The set-up arrays of the ``linear`` kind (float immersion).
LINEAR_ARRAYS = ("A_encoded", "B_encoded", "C_encoded", "D_encoded")
#: The set-up arrays of the ``linear-modular`` kind.
LINEAR_MODULAR_ARRAYS = ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4", "A", "B", "C", "D", "bits")


def is_linear(imm: Any) -> bool:
    """True for a handle that :func:`~immersion.immerse_system` made from a linear controller."""
    return getattr(imm, "controller_matrices", None) is not None


def _dense_keys(imm: Any) -> Any:
    keys = imm.keys
    if keys.kind != "dense":
        raise InvalidArgumentError(
            "keys", "remote mode ships dense target matrices; use keys='dense'"
        )
    return keys


def linear_arrays(imm: Any) -> dict[str, np.ndarray]:
    """User side: the four encoded matrices of a float linear controller (seed 002 eq. 17).

    Parameters
    ----------
    imm:
        A float :class:`~immersion.Immersion` from ``immerse_system`` of a linear controller.

    Returns
    -------
    dict
        ``A_encoded``, ``B_encoded``, ``C_encoded``, ``D_encoded`` (float64).
    """
    keys = _dense_keys(imm)
    A, B, C, D = imm.controller_matrices
    Pi2, Pi3 = keys.Pi2, keys.Pi3
    state_left, input_left = keys.Pi2_left, keys.Pi1_left
    return {
        "A_encoded": np.ascontiguousarray(Pi2 @ A @ state_left),
        "B_encoded": np.ascontiguousarray(Pi2 @ B @ input_left),
        "C_encoded": np.ascontiguousarray(Pi3 @ C @ state_left),
        "D_encoded": np.ascontiguousarray(Pi3 @ D @ input_left + keys.Pi4),
    }


def _finite_matrix(name: str, value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 2 or arr.dtype != np.float64 or not np.isfinite(arr).all():
        raise InvalidArgumentError(name, "expected a finite 2-D float64 matrix")
    return arr


class LinearTarget:
    """Cloud side of the ``linear`` kind: ``u~ = C~ x~ + D~ y~``, ``x~+ = A~ x~ + B~ y~``.

    Parameters
    ----------
    arrays:
        The four encoded matrices of :func:`linear_arrays` (shapes checked against each other).
    """

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        a, b, c, d = (_finite_matrix(name, arrays[name]) for name in LINEAR_ARRAYS)
        n_x, n_y = a.shape[1], b.shape[1]
        for name, arr, shape in (
            ("A_encoded", a, (n_x, n_x)),
            ("B_encoded", b, (n_x, n_y)),
            ("C_encoded", c, (c.shape[0], n_x)),
            ("D_encoded", d, (c.shape[0], n_y)),
        ):
            if arr.shape != shape:
                raise InvalidArgumentError(name, f"expected shape {shape}, got {arr.shape}")
        self._a, self._b, self._c, self._d = a, b, c, d
        self.n_state_encoded, self.n_input_encoded = n_x, n_y

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[np.ndarray, np.ndarray]:
        """One sample: ``(u~, x~+)``.

        Parameters
        ----------
        encoded_state, encoded_input:
            ``x~`` and ``y~`` (finite float64 vectors of the encoded sizes).
        """
        xt = _vector("encoded_state", encoded_state, self.n_state_encoded, np.float64)
        yt = _vector("encoded_input", encoded_input, self.n_input_encoded, np.float64)
        if not np.isfinite(xt).all() or not np.isfinite(yt).all():
            raise InvalidArgumentError("encoded_state", "x~ and y~ must be finite")
        return self._c @ xt + self._d @ yt, self._a @ xt + self._b @ yt


def _vector(name: str, value: Any, size: int, dtype: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (size,) or arr.dtype != dtype:
        raise InvalidArgumentError(
            name, f"expected {np.dtype(dtype).name} of shape ({size},), got {arr.shape}"
        )
    return arr


def linear_target(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> LinearTarget:
    """Server side of the ``linear`` kind (the header names nothing else)."""
    return LinearTarget(arrays)


def linear_modular_arrays(imm: Any) -> dict[str, np.ndarray]:
    """User side of the ``linear-modular`` kind: what a modular target holds, minus ``N1_left``.

    Parameters
    ----------
    imm:
        A :class:`~immersion.coding.modular.ModularImmersion` from ``immerse_system`` of a linear
        controller, with dense keys.

    Returns
    -------
    dict
        The integer ``Pi1_left, Pi2, Pi2_left, Pi3, Pi4`` (uint64), ``A, B, C, D`` (float64) and
        ``bits`` (the fraction bits, one entry).
    """
    keys = _dense_keys(imm)
    out = {
        name: np.ascontiguousarray(getattr(keys, name), dtype=np.uint64)
        for name in ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4")
    }
    out.update(zip("ABCD", (np.ascontiguousarray(m) for m in imm.controller_matrices), strict=True))
    out["bits"] = np.array([imm.fraction_bits], dtype=np.int64)
    return out


def linear_modular_target(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Any:
    """Server side of the ``linear-modular`` kind: a
    :class:`~immersion.coding.modular.ModularTarget` on the shipped integer matrices,
    ``f, g = (A, B), (C, D)``."""
    from ..backends import make_backend
    from ..coding.modular import FixedPointDecoder, FixedPointEncoder, ModularTarget
    from ..coding.target import CheckedFunction
    from ..coding.target_codes import TargetCodes
    from ..integer import MAX_FRACTION_BITS
    from ..keys.modular import MatrixProduct
    from ..systems import LinearMap

    ints = {}
    for name in ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4"):
        arr = np.asarray(arrays[name])
        if arr.ndim != 2 or arr.dtype != np.uint64:
            raise InvalidArgumentError(name, "expected a 2-D uint64 matrix")
        ints[name] = arr
    A, B, C, D = (_finite_matrix(name, arrays[name]) for name in "ABCD")
    bits = np.asarray(arrays["bits"])
    if bits.shape != (1,) or bits.dtype != np.int64 or not 0 <= int(bits[0]) <= MAX_FRACTION_BITS:
        raise InvalidArgumentError("bits", f"expected one integer in 0..{MAX_FRACTION_BITS}")
    n_x, n_y, n_u = A.shape[0], B.shape[1], C.shape[0]
    n_xt, n_yt, n_ut = ints["Pi2"].shape[0], ints["Pi1_left"].shape[1], ints["Pi3"].shape[0]
    for name, arr, shape in (
        ("A", A, (n_x, n_x)),
        ("B", B, (n_x, n_y)),
        ("C", C, (n_u, n_x)),
        ("D", D, (n_u, n_y)),
        ("Pi1_left", ints["Pi1_left"], (n_y, n_yt)),
        ("Pi2", ints["Pi2"], (n_xt, n_x)),
        ("Pi2_left", ints["Pi2_left"], (n_x, n_xt)),
        ("Pi3", ints["Pi3"], (n_ut, n_u)),
        ("Pi4", ints["Pi4"], (n_ut, n_yt)),
    ):
        if arr.shape != shape:
            raise InvalidArgumentError(name, f"expected shape {shape}, got {arr.shape}")
    fraction_bits = int(bits[0])
    backend = make_backend("numpy", dtype=None, device=None)
    codes = TargetCodes(
        n_xt,
        n_yt,
        n_ut,
        state_in=FixedPointDecoder(MatrixProduct(ints["Pi2_left"]), fraction_bits),
        state_out=FixedPointEncoder(MatrixProduct(ints["Pi2"]), fraction_bits, "f"),
        input_in=FixedPointDecoder(MatrixProduct(ints["Pi1_left"]), fraction_bits),
        output_out=FixedPointEncoder(MatrixProduct(ints["Pi3"]), fraction_bits, "g"),
        mask=MatrixProduct(ints["Pi4"]),
    )
    return ModularTarget.from_codes(
        f=CheckedFunction(LinearMap(A, B), "f", n_x, False, backend),
        g=CheckedFunction(LinearMap(C, D), "g", n_u, False, backend),
        codes=codes,
        fraction_bits=fraction_bits,
    )
