"""Secret keys: dense and block-structured codes (float and modulo 2^64), validation, save/load."""

from .arrays import code_arrays
from .codes import DenseCode, DenseMask, StructuredCode, StructuredMask
from .keys import Keys, NoiseLaw, draw_code
from .modular import (
    ModularBlockCode,
    ModularDenseCode,
    ModularKeys,
    ModularMask,
    draw_modular_code,
)
from .stats import RowStats
from .store import code_from_arrays, load_keys, save_keys

__all__ = [
    "Keys",
    "NoiseLaw",
    "draw_code",
    "ModularKeys",
    "ModularDenseCode",
    "ModularBlockCode",
    "ModularMask",
    "draw_modular_code",
    "DenseCode",
    "StructuredCode",
    "DenseMask",
    "StructuredMask",
    "RowStats",
    "load_keys",
    "save_keys",
    "code_arrays",
    "code_from_arrays",
]
