"""The import path of the server that README.md documents (before issue 29's layout).

The code lives in :mod:`immersion.remote.server` (also exported by :mod:`immersion.remote`).
"""

from .remote.server import Service

__all__ = ["Service"]
