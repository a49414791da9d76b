"""Secure aggregation for the SIFL schemes (``secure_aggregation=True``, ``--secure-aggregation``).

Without it the aggregator receives every encoded upload ``w~_i = Pi1 w_i + N1 r_t``; the round
noise ``N1 r_t`` is shared, so the difference of two uploads ``Pi1 (w_i - w_k)`` is noise-free
(``immersion audit``, attack ``shared-noise-difference``). With it, a round runs the core's secure
sum (:mod:`immersion.securesum.protocol`, HKDF label ``"immersion-sifl"``):

1. every client of the round makes a fresh X25519 key pair and advertises its public key;
2. each client trains as before (:func:`~immersion_fl.schemes.client_upload`), multiplies its
   upload by its weight ``a_i = |D_i| / sum over the round's members``, converts it to two-limb
   fixed point and adds one pairwise mask per other member (modulo 2^64);
3. the aggregator sums the masked words; if clients dropped out after step 1, every survivor
   reveals its mask seeds with them and the aggregator removes their masks; if a survivor does not
   answer, the round is retried with fresh keys among the others (as MP-DP does), at most
   :data:`MAX_ATTEMPTS` times (the core's one round driver,
   :func:`immersion.securesum.round.run_round`, runs these phases for both engines);
4. the weighted sum (renormalised over the contributors) goes through the scheme's
   ``aggregator_code`` (M2's right-side code, seed 000 eq. 31) and ``server_update`` unchanged.

The decoded model still equals FedAvg: the fixed point moves each weighted value by at most
``2^-61`` and the masks cancel exactly. What the aggregator learns: the weighted sum (as before)
and who contributed, not an upload. Not protected: a client's kit decodes the broadcast (attack
``client-decodes``), colluding clients learn the others' mean by subtraction, an upload cannot be
checked for NaN or range by the aggregator (a client refuses to mask a non-finite upload; a
malicious client can still corrupt the sum undetected), and without double masking an aggregator
must refuse an upload that arrives after it asked for that client's seeds (the engines do).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
from immersion import ImmersionError, InvalidArgumentError
from immersion.securesum.protocol import SecureSumClient
from immersion.securesum.round import (
    RoundOutcome,
    RoundRecords,
    RoundTransport,
    complete_graph,
    run_round,
)

from .faults import FaultPlan, run_client

if TYPE_CHECKING:
    import torch

    from ..scheme import AnyScheme
    from .client import Client

LOG = logging.getLogger("immersion.fl")

#: HKDF label of the pair seeds (separates them from MP-DP's and the audit's).
LABEL = "immersion-sifl"
#: Attempts of one round before it is given up (a survivor that does not reveal its seeds).
MAX_ATTEMPTS = 3


class SecureAggregationError(ImmersionError):
    """A round could not be unmasked: survivors kept failing to reveal their seeds."""


def new_party(index: int, round_t: int, private: bytes | None = None) -> SecureSumClient:
    """A client's key pair for one round (OS entropy unless ``private`` restores a saved key).

    Parameters
    ----------
    index:
        The client.
    round_t:
        The round.
    private:
        The raw private key a node kept between messages, or None for a fresh one.
    """
    return SecureSumClient(index, round_t, private_bytes=private, label=LABEL)


def masked_upload(
    party: SecureSumClient,
    upload: "torch.Tensor | np.ndarray",
    weight: float,
    publics: Mapping[int, bytes],
    n_summands: int,
) -> np.ndarray:
    """Step 2: ``weight * upload`` in fixed point, masked for every other member.

    Parameters
    ----------
    party:
        The client's key pair for the round.
    upload:
        Its upload (what it would send without secure aggregation).
    weight:
        ``a_i = |D_i| / sum of the members' |D_j|``.
    publics:
        Every member's public key.
    n_summands:
        The number of members (the fixed-point range check).

    Returns
    -------
    np.ndarray
        ``uint64``, two words per entry of the upload.
    """
    array = upload.detach().cpu().numpy() if hasattr(upload, "detach") else upload
    values = weight * np.asarray(array, dtype=np.float64)
    return party.mask(values, publics, n_summands=n_summands, argument="upload")


@dataclass
class SecureRound:
    """The aggregator's side of one attempt of a secure round.

    Parameters
    ----------
    round_t:
        The round.
    members:
        The clients that advertised a key (sorted).
    sizes:
        ``|D_i|`` of every client.
    publics:
        The members' public keys.
    """

    round_t: int
    members: list[int]
    sizes: Mapping[int, int]
    publics: dict[int, bytes]

    @property
    def graph(self) -> dict[int, list[int]]:
        """The peers of every member (complete graph)."""
        return complete_graph(self.members)

    def weight(self, index: int) -> float:
        """``|D_i|`` over the members' total.

        Parameters
        ----------
        index:
            A member.
        """
        return self.sizes[index] / sum(self.sizes[k] for k in self.members)

    def problem(self, words: Any, n_encoded: int) -> str | None:
        """Why a masked upload cannot be summed (shape, dtype), or None.

        Parameters
        ----------
        words:
            What a client sent.
        n_encoded:
            The length of an (unmasked) upload.
        """
        if not isinstance(words, np.ndarray) or words.dtype != np.uint64:
            return f"masked upload of type {type(words).__name__}, expected uint64 words"
        if words.shape != (2 * n_encoded,):
            return f"masked upload of shape {words.shape}, expected ({2 * n_encoded},)"
        return None

    def total(
        self, masked: Mapping[int, np.ndarray], seeds: Mapping[int, Mapping[int, bytes]]
    ) -> np.ndarray:
        """The weighted sum of the contributors' uploads, renormalised over them.

        Parameters
        ----------
        masked:
            The masked uploads received, by client.
        seeds:
            ``seeds[survivor][dropped]`` revealed for every request of :meth:`requests`.

        Returns
        -------
        np.ndarray
            ``sum_i a'_i w~_i`` with ``a'_i = |D_i| / sum over the contributors`` (float64).
        """
        outcome: RoundOutcome[np.ndarray, bytes] = RoundOutcome(
            0, self.members, self.publics, self.graph, dict(masked), dict(seeds)
        )
        total = outcome.unmask()
        everyone = sum(self.sizes[k] for k in self.members)
        contributing = sum(self.sizes[k] for k in masked)
        return total if contributing == everyone else total * (everyone / contributing)


def given_up(round_t: int) -> SecureAggregationError:
    """The error of a round aborted :data:`MAX_ATTEMPTS` times.

    Parameters
    ----------
    round_t:
        The round.
    """
    return SecureAggregationError(
        f"round {round_t}: secure aggregation aborted {MAX_ATTEMPTS} times; see the log for the "
        "clients that did not reveal their seeds"
    )


def local_round(
    scheme: "AnyScheme",
    clients: list["Client"],
    sizes: list[int],
    t: int,
    *,
    plan: FaultPlan,
    timeout_s: float | None,
    dropped: list[dict[str, Any]],
    aborted: list[dict[str, Any]],
    observe: Callable[[dict[int, np.ndarray]], None] | None = None,
) -> tuple[float, list[int]]:
    """One secure round of the in-process engine; returns its seconds and its contributors.

    Every client advertises a key pair, then trains and masks (a failing client is left out, as
    without secure aggregation, and its masks are recovered from its peers' seeds); a survivor
    with the fault ``no-recovery`` does not reveal, and the round is retried with fresh keys.

    Parameters
    ----------
    scheme:
        A scheme with ``secure_aggregation``.
    clients:
        Every client.
    sizes:
        Their ``|D_i|``.
    t:
        The round.
    plan:
        Faults to inject.
    timeout_s:
        Seconds a client may take.
    dropped, aborted:
        Where left-out clients and given-up attempts are recorded.
    observe:
        Called with the masked uploads of the attempt that is summed, by client: what the
        aggregator receives (``immersion audit`` looks at it).
    """
    from immersion_fl.runtime.federation import EveryClientFailedError

    torch = _torch()
    start = time.perf_counter()
    received = scheme.broadcast(t)
    by_index = {c.index: c for c in clients}
    members = sorted(by_index)
    uploads: dict[int, Any] = {}
    pool = ThreadPoolExecutor(max_workers=1) if timeout_s is not None else None
    try:
        for k in members:
            uploads[k] = run_client(
                k,
                t,
                partial(scheme.client_upload, by_index[k], received, t),
                plan=plan,
                timeout_s=timeout_s,
                expected_shape=scheme.upload_shape,
                dropped=dropped,
                pool=pool,
            )
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    transport = LocalSecureSum(t, uploads, dict(enumerate(sizes)), plan)
    outcome = run_round(
        transport,
        members,
        RoundRecords(t, dropped, aborted),
        max_attempts=MAX_ATTEMPTS,
        too_few=EveryClientFailedError,
        given_up=lambda: given_up(t),
    )
    if observe is not None:
        observe(outcome.uploads)
    sec = SecureRound(t, outcome.members, transport.sizes, outcome.publics)
    total = torch.as_tensor(sec.total(outcome.uploads, outcome.seeds), device=received.device)
    scheme.server_update(scheme.aggregator_code(total))
    return time.perf_counter() - start, outcome.contributors


class LocalSecureSum(RoundTransport[np.ndarray, bytes]):
    """The phases of :func:`local_round` as calls in this process.

    Parameters
    ----------
    round_t:
        The round.
    uploads:
        Every client's upload, None for one that failed (changed: None once it is refused).
    sizes:
        ``|D_i|`` of every client.
    plan:
        Faults to inject (``no-recovery``: a survivor does not reveal).
    """

    def __init__(
        self, round_t: int, uploads: dict[int, Any], sizes: dict[int, int], plan: FaultPlan
    ) -> None:
        self.round_t, self.uploads, self.sizes, self.plan = round_t, uploads, sizes, plan
        self.parties: dict[int, SecureSumClient] = {}

    def advertise(self, attempt: int, members: list[int]) -> dict[int, bytes | str]:
        """Fresh key pairs (each attempt), their public keys."""
        self.parties = {k: new_party(k, self.round_t) for k in members}
        return {k: p.public_bytes for k, p in self.parties.items()}

    def upload(
        self, attempt: int, members: list[int], publics: Mapping[int, bytes], graph: Any
    ) -> dict[int, np.ndarray | str]:
        """Every upload weighted and masked (a failed client is absent: recorded already)."""
        sec = SecureRound(self.round_t, members, self.sizes, dict(publics))
        out: dict[int, np.ndarray | str] = {}
        for k in members:
            if self.uploads.get(k) is None:
                continue  # failed after the key agreement: its masks are recovered
            try:
                out[k] = masked_upload(
                    self.parties[k], self.uploads[k], sec.weight(k), sec.publics, len(members)
                )
            except InvalidArgumentError as exc:  # out of the fixed-point range
                out[k] = str(exc)
                self.uploads[k] = None
        return out

    def reveal(
        self, attempt: int, asked: Mapping[int, list[int]], publics: Mapping[int, bytes]
    ) -> dict[int, dict[int, bytes] | str]:
        """The survivors' seeds with their dropped peers (``no-recovery``: refused)."""
        return {
            v: "injected fault"
            if self.plan.faults.get((v, self.round_t)) == "no-recovery"
            else self.parties[v].reveal(ds, publics)
            for v, ds in asked.items()
        }


def _torch() -> Any:
    import torch

    return torch
