"""MP-DP: bidirectional privacy in federated learning by model perturbation (seed 004).

The server trains a bias-free ReLU MLP that clients only ever see perturbed (MP_Server,
Algorithm 1); clients compute one gradient on it plus the corrections Psi and Phi (LMT), add
distributed DP noise whose pairwise parts cancel in the sum (DDP_Client, Algorithm 2, with
pairwise seeds from X25519 key agreement); the server aggregates and recovers the true
aggregate gradient (MU_Server, Algorithm 3, Eq. 22).

Public API (imported on first use): :func:`perturb` / :func:`recover` (MP_Server, MU_Server),
:func:`local_model_training` (LMT), the MLP helpers and :func:`calibrate` (Theorems 10, 11).

Registers the federated scheme ``mpdp`` (``immersion fl run --scheme mpdp``) and the audit attacks
``mpdp-output-mask`` and ``gradient-inversion`` (``immersion audit``;
:mod:`immersion_mpdp.attacks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from immersion.lazy import lazy_attributes
from immersion.plugins.hookspecs import AttackSpec, hookimpl
from immersion_fl.hookspecs import FlowerHooks, SchemeSpec

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.serverapp import Grid
    from immersion_fl.config import RunConfig
    from immersion_fl.runtime.faults import FaultPlan

    from .calibration import Calibration, calibrate
    from .engine import MpdpResult, TrainingDivergedError
    from .lmt import LocalResult, local_model_training
    from .mlp import forward, init_weights, mse_gradient, one_hot
    from .perturbation import PerturbedModel, ServerKeys, draw_keys, perturb, recover

__all__ = [
    "perturb",
    "recover",
    "draw_keys",
    "PerturbedModel",
    "ServerKeys",
    "local_model_training",
    "LocalResult",
    "init_weights",
    "forward",
    "mse_gradient",
    "one_hot",
    "calibrate",
    "Calibration",
    "TrainingDivergedError",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(
            ["perturb", "recover", "draw_keys", "PerturbedModel", "ServerKeys"], ".perturbation"
        ),
        **dict.fromkeys(["local_model_training", "LocalResult"], ".lmt"),
        **dict.fromkeys(["init_weights", "forward", "mse_gradient", "one_hot"], ".mlp"),
        **dict.fromkeys(["calibrate", "Calibration"], ".calibration"),
        "TrainingDivergedError": ".engine",
    },
)


@hookimpl
def immersion_register_fl_schemes() -> list[SchemeSpec]:
    from .options import MpdpOptions
    from .runner import run_mpdp

    return [
        SchemeSpec(
            name="mpdp",
            description="MP-DP: perturbed MLP + distributed DP noise (seed 004 Algorithms 1-4)",
            options=MpdpOptions,
            runner=run_mpdp,
            flower=FlowerHooks(server=_flower_server, client=_flower_client),
        )
    ]


def _flower_server(
    grid: Grid,
    cfg: RunConfig,
    *,
    plan: FaultPlan,
    progress: Callable[[str], None] | None,
) -> MpdpResult:
    from .flower_engine import serve

    return serve(grid, cfg, plan=plan, progress=progress)


def _flower_client(msg: Message, context: Context) -> Message:
    from .flower_engine import client_train

    return client_train(msg, context)


@hookimpl
def immersion_register_attacks() -> list[AttackSpec]:
    from .attacks import run_gradient_inversion, run_output_mask

    return [
        AttackSpec(
            "mpdp-output-mask",
            ("mpdp",),
            run_output_mask,
            "a client regresses the output mask out of W_hat (least-squares r) and gets the "
            "model's function",
        ),
        AttackSpec(
            "gradient-inversion",
            ("fedavg", "mpdp"),
            run_gradient_inversion,
            "DLG on a one-image client: FedSGD gradient, MP-DP upload (noise off / epsilon 1), "
            "Phi clear / masked sum",
        ),
    ]
