"""Client faults: leave a failing client out of the round with a logged reason (DESIGN.md).

A client may raise, run past ``timeout_s``, or return an upload of the wrong shape or with
NaN/inf. The round completes with the others; weights are renormalised over them (for SIFL this
keeps ``sum of weights = 1``, which the offset cancellation needs, seed 000 eq. 16).

``FaultPlan`` injects such faults on purpose (tests, demos): ``{(client, round): kind}`` with kind
in ``raise``, ``timeout``, ``malformed`` (NaN), ``wrong-shape``.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from immersion import InvalidArgumentError

if TYPE_CHECKING:
    import torch

LOG = logging.getLogger("immersion.fl")
FAULT_KINDS = (
    "raise",
    "timeout",
    "malformed",
    "wrong-shape",
    "no-recovery",
)  # no-recovery: a survivor does not reveal its seeds (mpdp, secure aggregation)


@dataclass(frozen=True)
class FaultPlan:
    """Faults to inject, by (client index, round).

    Parameters
    ----------
    faults:
        ``{(client, round): kind}`` with kind in ``FAULT_KINDS``.
    """

    faults: dict[tuple[int, int], str] = field(default_factory=dict)

    @classmethod
    def parse(cls, items: tuple[str, ...] | list[str]) -> "FaultPlan":
        """From ``CLIENT:ROUND:KIND`` strings (the CLI's ``--inject-fault``).

        Parameters
        ----------
        items:
            The strings.
        """
        out = {}
        for item in items:
            parts = item.split(":")
            if (
                len(parts) != 3
                or parts[2] not in FAULT_KINDS
                or not (parts[0].isdigit() and parts[1].isdigit())
            ):
                raise InvalidArgumentError(
                    "inject_fault",
                    f"{item!r}: expected CLIENT:ROUND:KIND with KIND in {', '.join(FAULT_KINDS)}",
                )
            out[(int(parts[0]), int(parts[1]))] = parts[2]
        return cls(out)

    def apply(self, client: int, round_t: int, work: Callable[[], Any], timeout_s: float) -> Any:
        """Run ``work`` as the client would, with the planned fault, if any.

        Parameters
        ----------
        client, round_t:
            Who runs it, and when.
        work:
            The client's work (returns its upload).
        timeout_s:
            The round's time limit (a ``timeout`` fault sleeps past it).
        """
        kind = self.faults.get((client, round_t))
        if kind == "raise":
            raise RuntimeError(f"injected fault: client {client} crashed")
        if kind == "timeout":
            time.sleep(timeout_s + 0.2)
        upload = work()
        if (
            kind == "malformed"
        ):  # a float copy with a NaN (integer uploads then have the wrong type)
            upload = (
                np.array(upload, dtype=np.float64)
                if isinstance(upload, np.ndarray)
                else upload.clone()
            )
            upload[0] = math.nan
        elif kind == "wrong-shape":
            upload = upload[:-1]
        return upload


def upload_problem(
    upload: "torch.Tensor | np.ndarray", expected_shape: tuple[int, ...], dtype: Any = None
) -> str | None:
    """Why an upload cannot be aggregated, or None if it can.

    Parameters
    ----------
    upload:
        A client's upload: a float tensor, or a ``uint64`` array (integer schemes).
    expected_shape:
        The scheme's upload shape.
    dtype:
        The numpy dtype integer uploads must have (None: a float tensor is expected).
    """
    shape = tuple(getattr(upload, "shape", ()))
    if shape != expected_shape:
        return f"wrong shape {shape}, expected {expected_shape}"
    if isinstance(upload, np.ndarray):
        if dtype is None or upload.dtype != dtype:
            return f"an array of {upload.dtype}, expected {dtype or 'a float tensor'}"
        return None
    if dtype is not None:
        return f"a {type(upload).__name__}, expected a {np.dtype(dtype)} array"
    if not bool(upload.isfinite().all()):
        return "contains NaN or inf"
    return None


def run_client(
    index: int,
    round_t: int,
    work: Callable[[], Any],
    *,
    plan: FaultPlan,
    timeout_s: float | None,
    expected_shape: tuple[int, ...],
    dropped: list[dict[str, Any]],
    pool: ThreadPoolExecutor | None,
    expected_dtype: Any = None,
) -> Any:
    """One client's upload, or None (logged and recorded in ``dropped``) if it failed.

    Parameters
    ----------
    index, round_t:
        The client and the round.
    work:
        The client's work (returns its upload).
    plan:
        Faults to inject.
    timeout_s:
        Seconds the client may take (None: no limit).
    expected_shape:
        The scheme's upload shape.
    dropped:
        Where a failure is recorded.
    pool:
        The executor that enforces ``timeout_s`` (None without a limit).
    expected_dtype:
        The numpy dtype of integer uploads (None: float tensors).
    """
    limit = math.inf if timeout_s is None else timeout_s
    try:
        if pool is None:
            upload = plan.apply(index, round_t, work, limit)
        else:
            upload = pool.submit(plan.apply, index, round_t, work, limit).result(timeout=timeout_s)
    except FutureTimeout:
        reason = f"timed out after {timeout_s:g} s"
        upload = None
    except Exception as exc:  # noqa: BLE001 - any client failure leaves it out of the round
        reason = f"raised {type(exc).__name__}: {exc}"
        upload = None
    else:
        reason = upload_problem(upload, expected_shape, expected_dtype) or ""
        if reason:
            upload = None
    if upload is None:
        LOG.warning("round %d: client %d left out: %s", round_t, index, reason)
        dropped.append({"round": round_t, "client": index, "reason": reason})
    return upload
