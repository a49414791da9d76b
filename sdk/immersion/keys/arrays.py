"""Every array that defines a code or a set of keys, by a stable name (files and fingerprints).

Its own module so that :mod:`immersion.keys.keys` (the fingerprint) and
:mod:`immersion.keys.store` (key files) both use it without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .codes import DenseCode, DenseMask
from .modular import ModularBlockCode, ModularDenseCode

if TYPE_CHECKING:
    from .keys import Keys

#: The three codes of a key set, in file order.
CODE_NAMES = ("input", "state", "output")


def code_arrays(code: Any) -> dict[str, np.ndarray]:
    """Every array that defines one code (dense or block, float or integer), by a stable name."""
    if isinstance(code, (ModularDenseCode, ModularBlockCode)):
        return code.arrays()
    if isinstance(code, DenseCode):
        return {"pi": code.pi, "pi_left": code.pi_left, "noise_basis": code.noise_basis}
    m = code.mix
    return {
        "blocks": m.blocks,
        "tail": m.tail,
        "householder": m.householder,
        "group_ids": m.group_ids,
        "row_perm": m.row_perm,
        "signal_pos": code.signal_pos,
        "noise_pos": code.noise_pos,
        "flat_pos": code.flat_pos,
        "signal_scale": np.array([code.signal_scale]),
    }


def key_arrays(keys: "Keys") -> dict[str, np.ndarray]:
    """Every array that defines ``keys``, by a stable name (used for saving and the fingerprint)."""
    out = {
        f"{name}.{k}": v
        for name in CODE_NAMES
        for k, v in code_arrays(getattr(keys, f"{name}_code")).items()
    }
    if isinstance(keys.mask, DenseMask):
        out["mask.pi4"] = keys.mask.pi4
    else:
        out.update(
            {
                "mask.beta": np.array([keys.mask.beta]),
                "mask.signs": keys.mask.signs,
                "mask.source": keys.mask.source,
            }
        )
    return out
