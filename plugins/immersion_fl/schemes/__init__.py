"""Federated schemes: plain FedAvg and the immersion-coded SIFL variants (seeds 000 and 003),
one module each (:mod:`.fedavg`, :mod:`.sifl_m1`, :mod:`.sifl_m2`, :mod:`.sifl_rm`; their integer
codings in :mod:`.modular`), what a client holds in :mod:`.kit` and the options in :mod:`.options`.

Each scheme splits a round into what the server broadcasts, what a client uploads, what the
aggregator forwards and what the server keeps. ``global_model`` is the decoded model a key holder
would see (used to evaluate accuracy and to compare with FedAvg).

* ``fedavg``: the reference.
* ``sifl-m1`` (seed 000 Algorithm 1): ``w~ = Pi1 w + N1 r`` with fresh ``r`` each round; clients
  run the target optimizer (decode once, train, lift the change); the server decodes the aggregate.
* ``sifl-m2`` (seed 000 Algorithm 2): the aggregator adds a right-side code ``Pi2`` (1 x p) and
  noise ``R2 N2``; the server decodes ``Pi1`` only and re-encodes the p columns; clients recover
  ``w~ = w' Pi2^R``.
* ``sifl-rm`` (seed 003): the same algebra as M1 with the random-matrix key shape of that paper
  (``m = n + 1``: one noise column, ``M = Pi1_left``, ``G = Pi1``) and a fresh offset each round
  (unit scale: the paper gives neither a scale nor a DP analysis, so no epsilon is reported).

Options: :class:`SiflOptions` (one object for the three). ``client_noise=True`` (all three SIFL
schemes) adds to each upload fresh noise of the client's own in ``ker(Pi1_left) = range(N1)``
(:func:`kernel_noise`): the server's decode (eq. 21; eq. 25 in M2, column by column) removes it
exactly, and the difference of two uploads is no longer noise-free (the round noise ``N1 r_t`` is
shared, THREAT_MODEL.md). It does not protect against a holder of any client kit.

References
----------
Seed 000 (SIFL), Algorithms 1-2, eqs. 19-21, 25-33, Theorems 1-2, Remark 3 and section 7; seed 003
(random-matrix SIFL).
"""

from __future__ import annotations

from .fedavg import FedAvg, fedavg_scheme
from .kit import NOISE_ARRAYS, ClientKit, client_upload, kernel_noise, lift_change
from .options import DENSE_KEY_BYTES, KEY_KINDS, NOISE_LAWS, SiflOptions
from .sifl_m1 import SiflM1, sifl_m1_scheme
from .sifl_m2 import SiflM2, sifl_m2_scheme
from .sifl_rm import sifl_rm_scheme

__all__ = [
    "DENSE_KEY_BYTES",
    "KEY_KINDS",
    "NOISE_ARRAYS",
    "NOISE_LAWS",
    "ClientKit",
    "FedAvg",
    "SiflM1",
    "SiflM2",
    "SiflOptions",
    "client_upload",
    "fedavg_scheme",
    "kernel_noise",
    "lift_change",
    "sifl_m1_scheme",
    "sifl_m2_scheme",
    "sifl_rm_scheme",
]
