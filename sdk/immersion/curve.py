"""The import path of the CurveZMQ keys that README.md documents (before issue 29's layout).

The code lives in :mod:`immersion.remote.curve` (also exported by :mod:`immersion.remote`).
"""

from .remote.curve import new_curve_keys

__all__ = ["new_curve_keys"]
