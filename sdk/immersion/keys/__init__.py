"""Secret keys: dense and block-structured codes, validation, save/load."""
from .codes import DenseCode, DenseMask, StructuredCode, StructuredMask
from .keys import Keys
from .stats import RowStats
from .store import load_keys, save_keys

__all__ = ["Keys", "DenseCode", "StructuredCode", "DenseMask", "StructuredMask", "RowStats",
           "load_keys", "save_keys"]
