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
   :data:`MAX_ATTEMPTS` times;
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
from immersion.securesum.protocol import (
    SecureSumClient,
    reveal_requests,
    revealed_pairs,
    sum_words,
    unmask,
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


def complete_graph(members: list[int]) -> dict[int, list[int]]:
    """Every member is every other member's peer.

    Parameters
    ----------
    members:
        The round's clients.

    Examples
    --------
    >>> complete_graph([0, 2, 5])
    {0: [2, 5], 2: [0, 5], 5: [0, 2]}
    """
    return {k: [v for v in members if v != k] for k in members}


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

    def requests(self, contributors: Mapping[int, Any]) -> dict[int, list[int]]:
        """Which contributor must reveal its seeds with which dropped members.

        Parameters
        ----------
        contributors:
            The masked uploads received, by client.
        """
        gone = [k for k in self.members if k not in contributors]
        return reveal_requests(gone, self.graph, contributors)

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
        gone = [k for k in self.members if k not in masked]
        revealed = revealed_pairs(gone, self.graph, masked, seeds)
        total = unmask(sum_words([masked[k] for k in sorted(masked)]), revealed)
        everyone = sum(self.sizes[k] for k in self.members)
        contributing = sum(self.sizes[k] for k in masked)
        return total if contributing == everyone else total * (everyone / contributing)


def record_abort(
    round_t: int, attempt: int, silent: Mapping[int, str], aborted: list[dict[str, Any]]
) -> None:
    """Log and record an attempt given up because survivors did not reveal their seeds.

    Parameters
    ----------
    round_t, attempt:
        The round and the attempt (from 0).
    silent:
        The survivors that did not answer, with why.
    aborted:
        Where the record goes (``RunResult.aborted``).
    """
    reason = "; ".join(f"client {v} did not reveal its seeds ({why})" for v, why in silent.items())
    LOG.warning(
        "round %d aborted (attempt %d): %s; retrying with fresh keys", round_t, attempt + 1, reason
    )
    aborted.append(
        {"round": round_t, "attempt": attempt + 1, "reason": reason, "silent": sorted(silent)}
    )


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
    for attempt in range(MAX_ATTEMPTS):
        parties = {k: new_party(k, t) for k in members}  # step 1 (fresh keys each attempt)
        sec = SecureRound(
            t, members, dict(enumerate(sizes)), {k: p.public_bytes for k, p in parties.items()}
        )
        masked: dict[int, np.ndarray] = {}
        for k in members:
            if uploads.get(k) is None:
                continue  # failed after the key agreement: its masks are recovered below
            try:
                masked[k] = masked_upload(
                    parties[k], uploads[k], sec.weight(k), sec.publics, len(members)
                )
            except InvalidArgumentError as exc:  # out of the fixed-point range
                LOG.warning("round %d: client %d left out: %s", t, k, exc)
                dropped.append({"round": t, "client": k, "reason": str(exc)})
                uploads[k] = None
        if not masked:
            raise EveryClientFailedError(f"round {t}: every client failed; nothing to aggregate")
        asked = sec.requests(masked)
        silent = {v: "injected fault" for v in asked if plan.faults.get((v, t)) == "no-recovery"}
        if silent:
            record_abort(t, attempt, silent, aborted)
            members = [k for k in members if k in masked and k not in silent]
            continue
        seeds = {v: parties[v].reveal(ds, sec.publics) for v, ds in asked.items()}
        if observe is not None:
            observe(masked)
        total = torch.as_tensor(sec.total(masked, seeds), device=received.device)
        scheme.server_update(scheme.aggregator_code(total))
        return time.perf_counter() - start, sorted(masked)
    raise given_up(t)


def _torch() -> Any:
    import torch

    return torch
