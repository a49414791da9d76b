"""The import path of the modular immersion that README.md documents (before issue 29's layout).

The code lives in :mod:`immersion.coding.modular`; new code imports from there.
"""

from .coding.modular import FixedPointTwin, ModularImmersion, ModularTarget

__all__ = ["FixedPointTwin", "ModularImmersion", "ModularTarget"]
