"""The cloud side in another process or machine: ``immersion serve`` and its clients.

:mod:`.client`: :class:`RemoteTarget`, a target algorithm that sends encoded vectors to a server.
:mod:`.server`: :class:`Service` (``immersion serve``). :mod:`.wire`: the protocol and the bounded
npz reader. :mod:`.kinds` and :mod:`.linear`: the kinds of target a server sets up from public
arrays. :mod:`.curve`: CurveZMQ key pairs (:func:`new_curve_keys`). :mod:`.process`: a server as a
child process. pyzmq (extra ``remote``) is imported only when a socket is opened.
"""

from .client import RemoteTarget
from .curve import new_curve_keys
from .server import Service

__all__ = ["RemoteTarget", "Service", "new_curve_keys"]
