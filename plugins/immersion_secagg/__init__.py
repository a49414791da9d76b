"""Secure aggregation as a source of differential privacy (seed 001), and how to top it up.

Public API (imported on first use): the accountant (:func:`guarantee`, :class:`Setting`), the
users' updates and WF-NA noise (:func:`gaussian_sampling_update`, :func:`wfna_noise`), and the sum
through Flower's SecAgg+ (:func:`secagg_sum`, :func:`plain_sum`), and secure aggregation for any
Flower Message-API app (:class:`SecureAggregation` around the strategy,
:func:`secure_aggregation_mod` on the client).

Registers the federated schemes ``sgd-dp``, ``gsgd-dp`` and ``gd-dp`` (``immersion fl run``), the
command ``immersion dp secagg`` (the accountant of Theorems 2 and 4) and the audit's attack
``secagg-mask-seed`` (:mod:`.attacks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from immersion.lazy import lazy_attributes
from immersion.plugins.hookspecs import AttackSpec, CommandSpec, hookimpl
from immersion_fl.hookspecs import SchemeSpec

if TYPE_CHECKING:
    from .accountant import (
        Guarantee,
        Setting,
        epsilon_from_rdp,
        gd_guarantee,
        guarantee,
        rdp_theorem2,
        rdp_theorem4,
        sgd_guarantee,
    )
    from .flower_secagg import (
        AggregationRun,
        FixedUpdates,
        plain_sum,
        quantization_error_bound,
        secagg_sum,
    )
    from .message_budget import SecureSumBudget
    from .message_mod import secure_aggregation_mod
    from .message_strategy import SecureAggregation
    from .message_wire import PrivacyBudgetExceeded, SecureAggregationAborted
    from .updates import (
        clip_rows,
        full_gradient_update,
        gaussian_sampling_update,
        iid_sampling_update,
        isotropic_noise,
    )
    from .wfna import wfna_covariance, wfna_noise

__all__ = [
    "Setting",
    "Guarantee",
    "guarantee",
    "gd_guarantee",
    "sgd_guarantee",
    "rdp_theorem2",
    "rdp_theorem4",
    "epsilon_from_rdp",
    "clip_rows",
    "full_gradient_update",
    "iid_sampling_update",
    "gaussian_sampling_update",
    "isotropic_noise",
    "wfna_noise",
    "wfna_covariance",
    "secagg_sum",
    "plain_sum",
    "AggregationRun",
    "FixedUpdates",
    "quantization_error_bound",
    "SecureAggregation",
    "secure_aggregation_mod",
    "SecureAggregationAborted",
    "PrivacyBudgetExceeded",
    "SecureSumBudget",
]

_MODULE = [".accountant"] * 8 + [".updates"] * 5 + [".wfna"] * 2 + [".flower_secagg"] * 5
_MODULE += [".message_strategy", ".message_mod"] + [".message_wire"] * 2 + [".message_budget"]
__getattr__ = lazy_attributes(__name__, dict(zip(__all__, _MODULE, strict=True)))


@hookimpl
def immersion_register_commands() -> list[CommandSpec]:
    from .cli import dp_group

    return [CommandSpec("dp", dp_group, parent="")]


@hookimpl
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    from .engine import run_secagg
    from .options import DpSgdOptions

    return [
        SchemeSpec(
            name="sgd-dp",
            description="SGD + IID sampling + isotropic noise (seed 001)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
        SchemeSpec(
            name="gsgd-dp",
            description="Gaussian sampling + WF-NA noise (seed 001 Theorem 4)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
        SchemeSpec(
            name="gd-dp",
            description="full gradient + isotropic noise (seed 001)",
            options=DpSgdOptions,
            runner=run_secagg,
        ),
    ]


@hookimpl
def immersion_register_attacks() -> list[AttackSpec]:
    from . import attacks

    return [
        AttackSpec(
            "secagg-mask-seed",
            attacks.SCHEMES,
            attacks.run_secagg_mask_seed,
            "Flower SecAgg+ pairwise masks come from 2^28 Mersenne Twister seeds: the aggregator "
            "searches one and unmasks a user's update (mitigation: core-secure-sum)",
        )
    ]
