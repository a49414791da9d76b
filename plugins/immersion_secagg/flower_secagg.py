"""Flower's SecAgg+ as the summation step of seed 001: what it computes, at what precision and cost.

Seed 001 gets its differential privacy from the server seeing only ``x = sum_i x_i``. This module
runs that sum with the SecAgg+ that flwr 1.41 ships, on Flower's simulation runtime (Ray
backend): :func:`secagg_sum` (SecAgg+) and :func:`plain_sum` (the same run, the server sees every
update) return an :class:`AggregationRun` that a caller compares with the exact float64 sum
(:func:`exact_sums`). The wiring, the exact behaviour read from flwr's source, the measurements
and the limitations are in ``docs/notes/secagg_flower.md``; ``benchmarks/secagg_flower.py``
reproduces the measurements.

Notes
-----
SecAgg+ is a fixed-point sum: every coordinate is clipped to ``[-c, c]`` (silently), rounded
stochastically to a grid of step ``2c / T`` and summed modulo ``M``, so the sum of ``k`` users
has a worst-case error ``k * 2c / T`` (:func:`quantization_error_bound`) when nothing is clipped,
and needs ``k * T < M``. A user failing before it sends its masked vector halts the round. The
pairwise masks are expanded by numpy's Mersenne Twister from a 32-bit XOR fold of a base64 key,
2^28 seeds in all (``flwr/common/secure_aggregation/secaggplus_utils.py`` lines 83-100; the
audit's ``secagg-mask-seed`` searches them in about 2 minutes); the self mask's seed is 32 bytes
of ``os.urandom`` folded the same way, 2^32 seeds (``flwr/client/mod/secure_aggregation/
secaggplus_mod.py`` lines 376 and 468): not a secure deployment, and seed 001's
Flower engine uses the SDK's secure sum by default (:mod:`immersion_secagg.core_flower`). The
accountant of seed 001 (:mod:`immersion_secagg.accountant`) covers the exact real sum, not the
quantised one.

References
----------
J. Zhang, K. Psounis, "Differentially Private Federated Learning without Noise Addition: When is
it Possible?" (seed 001), Theorems 2 and 4. flwr 1.41:
``flwr/common/secure_aggregation/quantization.py``, ``flwr.client.mod.secaggplus_mod`` and
``flwr.server.workflow.SecAggPlusWorkflow``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
from immersion import OptionalDependencyError

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.client import Client
    from flwr.common import Config, FitRes, NDArrays, Parameters, Scalar
    from flwr.server import LegacyContext
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import FedAvg
    from flwr.serverapp import Grid

#: Stages of Flower's SecAgg+ at which :func:`secagg_sum` can make a user fail (``dropouts``).
STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")

#: ``updates(round, user, model)``: the user's update at the model the server broadcast this round.
Updates = Callable[[int, int, np.ndarray], np.ndarray]
#: ``step(model, total, contributors)``: the server's new model from the aggregate (FedSGD: a
#: gradient step).
Step = Callable[[np.ndarray, np.ndarray, list[int]], np.ndarray]


@dataclass
class AggregationRun:
    """What the ServerApp obtained, round by round.

    Parameters
    ----------
    secure : bool
        Whether the sum ran through SecAgg+ (:func:`secagg_sum`) or not (:func:`plain_sum`).
    sums : list of np.ndarray or None
        ``sums[t]``: the sum over ``contributors[t]`` (SecAgg+: the server's mean times the number
        of contributors), ``None`` if the round was halted.
    server_outputs : list of np.ndarray or None
        What the workflow handed to the strategy (SecAgg+: the mean; plain: the sum computed from
        the individual updates).
    contributors : list of list of int
        The users whose updates are in each round's sum.
    round_seconds : list of float
        ``round_seconds[t]``: the fit workflow of round ``t`` on the ServerApp (messages and
        crypto).
    models : list of np.ndarray
        The model after every round (training runs, with ``step``).
    total_seconds : float
        The whole ``run_simulation`` call, Ray start included.
    settings : dict
        The SecAgg+ settings used (empty for a plain run).
    """

    secure: bool
    sums: list[np.ndarray | None]
    server_outputs: list[np.ndarray | None]
    contributors: list[list[int]]
    round_seconds: list[float]
    models: list[np.ndarray] = field(default_factory=list)
    total_seconds: float = 0.0
    settings: dict[str, int | float | None] = field(default_factory=dict)


def quantization_error_bound(
    contributors: int, clipping_range: float, quantization_range: int
) -> float:
    """Worst-case per-coordinate error of a SecAgg+ sum of ``contributors`` users, nothing clipped.

    Each user's stochastic rounding moves a value by less than one step ``2c / T``; the sum of ``k``
    of them by less than ``k`` steps. A float64 margin (``64 eps k c``) covers the dequantisation.

    Parameters
    ----------
    contributors : int
        ``k``, the users in the sum.
    clipping_range : float
        ``c``: coordinates are clipped to ``[-c, c]``.
    quantization_range : int
        ``T``: ``[-c, c]`` is mapped onto the integers ``0..T``.

    Examples
    --------
    >>> round(float(quantization_error_bound(5, 8.0, 2**22)), 8)   # 5 steps of 2c/T = 3.8e-6
    1.907e-05
    """
    step = 2.0 * clipping_range / quantization_range
    return contributors * step + 64 * np.finfo(np.float64).eps * contributors * clipping_range


class FixedUpdates:
    """``updates(round, user, model)`` from an array of shape ``(rounds, users, ...)``.

    The updates do not depend on the model; the object pickles by value (Ray ships it).

    Parameters
    ----------
    values : np.ndarray
        ``values[t, user]`` is the update of ``user`` in round ``t`` (stored as float64).

    Examples
    --------
    >>> FixedUpdates(np.arange(6.0).reshape(3, 2, 1))(2, 1).tolist()
    [5.0]
    """

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, dtype=np.float64)

    def __call__(self, t: int, user: int, model: np.ndarray | None = None) -> np.ndarray:
        return self.values[t, user]


def _flwr() -> dict[str, Any]:
    try:
        from flwr import simulation
        from flwr.client import ClientApp, NumPyClient
        from flwr.client.mod import secaggplus_mod
        from flwr.server import LegacyContext, ServerApp, ServerConfig
        from flwr.server.strategy import FedAvg
        from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    except ImportError:
        raise OptionalDependencyError(
            "flwr[simulation]", "fl", "secure aggregation on Flower"
        ) from None
    return dict(
        simulation=simulation,
        ClientApp=ClientApp,
        NumPyClient=NumPyClient,
        secaggplus_mod=secaggplus_mod,
        LegacyContext=LegacyContext,
        ServerApp=ServerApp,
        ServerConfig=ServerConfig,
        FedAvg=FedAvg,
        DefaultWorkflow=DefaultWorkflow,
        SecAggPlusWorkflow=SecAggPlusWorkflow,
    )


# ------------------------------------------------------------------------------------------- client


class _ClientFn:
    """``client_fn(context)``: a NumPyClient whose ``fit`` returns the user's update.

    ``fit`` returns ``[updates(round, user, model)]`` with weight 1 (``num_examples = 1``).
    """

    def __init__(self, updates: Updates) -> None:
        self.updates = updates

    def __call__(self, context: Context) -> Client:
        NumPyClient, updates = _flwr()["NumPyClient"], self.updates
        user = int(context.node_config["partition-id"])

        class _User(NumPyClient):  # type: ignore[misc, valid-type]
            def fit(
                self, parameters: NDArrays, config: Config
            ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
                model = np.asarray(parameters[0], dtype=np.float64)
                update = np.ascontiguousarray(
                    updates(int(config["round"]), user, model), dtype=np.float64
                )
                return [update], 1, {"user": user}

        return _User().to_client()


def _dropout_mod(
    msg: Message,
    ctxt: Context,
    call_next: Callable[[Message, Context], Message],
    *,
    dropouts: Mapping[tuple[int, int], str],
) -> Message:
    """Fail (raise) when ``dropouts`` says this user drops at this round and stage.

    Placed in front of ``secaggplus_mod``.
    """
    user = int(ctxt.node_config["partition-id"])
    t = int(msg.metadata.group_id) - 1 if str(msg.metadata.group_id).isdigit() else -1
    stage = dropouts.get((t, user))
    if stage is not None and msg.metadata.message_type == "train":
        configs = msg.content.config_records.get("secaggplus_configs")
        current = (
            "fit" if configs is None else configs.get("stage")
        )  # plain runs: any stage drops at fit
        if configs is None or stage == current:
            raise RuntimeError(f"injected dropout: user {user}, round {t}, stage {current}")
    return call_next(msg, ctxt)


# ------------------------------------------------------------------------------------------- server


def _strategy(
    n_users: int, secure: bool, run: AggregationRun, initial: np.ndarray, step: Step | None
) -> FedAvg:
    FedAvg = _flwr()["FedAvg"]
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    class _Keep(FedAvg):  # type: ignore[misc, valid-type]
        """FedAvg that samples every user each round and keeps what reaches ``aggregate_fit``."""

        model: np.ndarray = np.zeros(1)

        def aggregate_fit(
            self,
            server_round: int,
            results: list[tuple[ClientProxy, FitRes]],
            failures: list[tuple[ClientProxy, FitRes] | BaseException],
        ) -> tuple[Parameters | None, dict[str, Scalar]]:
            t = server_round - 1
            users = sorted(int(res.metrics["user"]) for _, res in results)
            run.contributors[t] = users
            if not results:
                return None, {}
            if secure:  # every FitRes carries the same dequantised mean
                mean = parameters_to_ndarrays(results[0][1].parameters)[0]
                run.server_outputs[t], run.sums[t] = mean, mean * len(users)
            else:  # the server sees each update; sum in user order
                by_user = {
                    int(res.metrics["user"]): parameters_to_ndarrays(res.parameters)[0]
                    for _, res in results
                }
                summed = np.zeros_like(by_user[users[0]])
                for u in users:
                    summed = summed + by_user[u]
                run.server_outputs[t], run.sums[t] = summed, summed
            total = run.sums[t]
            if step is None or total is None:
                return ndarrays_to_parameters([self.model]), {}
            self.model = np.asarray(step(self.model, total, users), dtype=np.float64)
            run.models.append(self.model.copy())
            return ndarrays_to_parameters([self.model]), {}

    strategy = _Keep(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n_users,
        min_evaluate_clients=0,
        min_available_clients=n_users,
        accept_failures=True,
        initial_parameters=ndarrays_to_parameters([initial]),
        on_fit_config_fn=lambda server_round: {"round": server_round - 1},
    )
    strategy.model = np.asarray(initial, dtype=np.float64).copy()
    return strategy


def _timed(
    workflow: Callable[[Grid, LegacyContext], None], run: AggregationRun
) -> Callable[[Grid, LegacyContext], None]:
    def fit(grid: Grid, context: LegacyContext) -> None:
        tick = time.perf_counter()
        workflow(grid, context)
        run.round_seconds.append(time.perf_counter() - tick)

    return fit


def _run(
    updates: Updates,
    n_users: int,
    rounds: int,
    *,
    secure: bool,
    dropouts: Mapping[tuple[int, int], str],
    settings: dict[str, int | float | None],
    initial: np.ndarray | None = None,
    step: Step | None = None,
) -> AggregationRun:
    fl = _flwr()
    if n_users < 2 or rounds < 1:
        raise ValueError(
            f"need at least 2 users and 1 round, got {n_users} users and {rounds} rounds"
        )
    bad = {s for s in dropouts.values() if s not in (*STAGES, "fit")}
    if bad:
        raise ValueError(
            f"unknown dropout stages {sorted(bad)}; use one of {STAGES} (or 'fit' for plain runs)"
        )
    run = AggregationRun(
        secure=secure,
        sums=[None] * rounds,
        server_outputs=[None] * rounds,
        contributors=[[] for _ in range(rounds)],
        round_seconds=[],
        settings=dict(settings),
    )
    if secure:
        workflow = fl["SecAggPlusWorkflow"](max_weight=1.0, **settings)
    else:
        from flwr.server.workflow.default_workflows import default_fit_workflow as workflow

    start = np.zeros(1) if initial is None else np.asarray(initial, dtype=np.float64)
    server_app = fl["ServerApp"]()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        legacy = fl["LegacyContext"](
            context=context,
            config=fl["ServerConfig"](num_rounds=rounds),
            strategy=_strategy(n_users, secure, run, start, step),
        )
        fl["DefaultWorkflow"](fit_workflow=_timed(workflow, run))(grid, legacy)

    mods = [partial(_dropout_mod, dropouts=dict(dropouts))] if dropouts else []
    if secure:
        mods.append(fl["secaggplus_mod"])
    client_app = fl["ClientApp"](client_fn=_ClientFn(updates), mods=mods)
    tick = time.perf_counter()
    fl["simulation"].run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=n_users,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": min(n_users, os.cpu_count() or 1)},
        },
    )
    run.total_seconds = time.perf_counter() - tick
    if len(run.round_seconds) != rounds:
        raise RuntimeError(
            f"the Flower run ended after {len(run.round_seconds)} of {rounds} rounds "
            "(see the Flower log above)"
        )
    return run


def secagg_sum(
    updates: Updates,
    n_users: int,
    rounds: int,
    *,
    clipping_range: float = 8.0,
    quantization_range: int = 2**22,
    modulus_range: int = 2**32,
    num_shares: int | float | None = None,
    reconstruction_threshold: int | float | None = None,
    timeout: float | None = None,
    dropouts: Mapping[tuple[int, int], str] | None = None,
    initial: np.ndarray | None = None,
    step: Step | None = None,
) -> AggregationRun:
    """Sum ``updates(t, user)`` over the users with Flower's SecAgg+, for ``t < rounds``.

    Runs ``n_users`` virtual nodes on Flower's simulation runtime (Ray backend); the sum is
    SecAgg+'s fixed-point one (module docstring, ``docs/notes/secagg_flower.md``).

    Parameters
    ----------
    updates : callable
        ``updates(round, user, model)``: the user's update at the model the server broadcast,
        shipped to Ray's workers (a module-level function, a closure or :class:`FixedUpdates`).
    n_users : int
        Users (virtual nodes), at least 2.
    rounds : int
        Rounds, at least 1.
    clipping_range : float
        ``c``: every coordinate is clipped to ``[-c, c]`` (silently) before quantisation.
    quantization_range : int
        ``T``, an integer in ``(0, 2**31)``: ``[-c, c]`` is mapped onto ``0..T``.
    modulus_range : int
        ``M``, at most ``2**53``; needs ``n_users * T < M`` or the integer sum wraps around.
    num_shares : int or float, optional
        flwr's meaning: neighbours each user shares its secrets with, itself included; every user
        by default.
    reconstruction_threshold : int or float, optional
        Shares needed to rebuild a secret; a majority ``max(2, n_users // 2 + 1)`` by default.
        flwr rejects an integer threshold that is not below an integer ``num_shares``.
    timeout : float, optional
        flwr's per-stage timeout in seconds; without one a silent node blocks the round.
    dropouts : mapping, optional
        ``dropouts[(t, user)] = stage`` makes the user raise at that SecAgg+ stage (one of
        :data:`STAGES`) of round ``t``.
    initial : np.ndarray, optional
        The model the server broadcasts first (zeros of size 1 if not given).
    step : callable, optional
        ``step(model, sum, contributors)``: the server's model after each round (a federated
        training run); ``run.models`` keeps them.

    Returns
    -------
    AggregationRun
        The sums (the server's mean times the contributors; ``None`` for a halted round), the
        contributors and timings.
    """
    if not (isinstance(quantization_range, int) and 0 < quantization_range < 2**31):
        raise ValueError(
            "quantization_range must be an integer in (0, 2**31): the rounded values are cast to "
            "int32"
        )
    if n_users * quantization_range >= modulus_range:
        raise ValueError(
            f"n_users * quantization_range = {n_users * quantization_range} must be below "
            f"modulus_range = {modulus_range}, or the integer sum wraps around"
        )
    if modulus_range > 2**53:
        raise ValueError(
            "modulus_range must be at most 2**53 (the unmasked integer sum is dequantised in "
            "float64)"
        )
    if not clipping_range > 0:
        raise ValueError("clipping_range must be positive")
    # flwr wants an integer num_shares > 2 (1.0, a float, means every user), threshold below it
    shares = (n_users if n_users > 2 else 1.0) if num_shares is None else num_shares
    threshold = (
        max(2, n_users // 2 + 1) if reconstruction_threshold is None else reconstruction_threshold
    )
    settings = dict(
        num_shares=shares,
        reconstruction_threshold=threshold,
        clipping_range=float(clipping_range),
        quantization_range=int(quantization_range),
        modulus_range=int(modulus_range),
        timeout=timeout,
    )
    return _run(
        updates,
        n_users,
        rounds,
        secure=True,
        dropouts=dropouts or {},
        settings=settings,
        initial=initial,
        step=step,
    )


def plain_sum(
    updates: Updates,
    n_users: int,
    rounds: int,
    *,
    dropouts: Mapping[tuple[int, int], str] | None = None,
) -> AggregationRun:
    """The same Flower run without SecAgg+: the server receives every update and sums them.

    The baseline of :func:`secagg_sum`.

    Parameters
    ----------
    updates : callable
        ``updates(round, user, model)``, as for :func:`secagg_sum`.
    n_users : int
        Users (virtual nodes), at least 2.
    rounds : int
        Rounds, at least 1.
    dropouts : mapping, optional
        ``dropouts[(t, user)]`` (any stage name, or ``"fit"``) makes the user fail in round ``t``;
        it is left out.

    Returns
    -------
    AggregationRun
        The exact float64 sums over the users that answered, in user order.
    """
    return _run(updates, n_users, rounds, secure=False, dropouts=dropouts or {}, settings={})


def exact_sums(
    updates: Updates, n_users: int, rounds: int, contributors: list[list[int]] | None = None
) -> list[np.ndarray]:
    """The float64 sums computed locally, in user order, over ``contributors[t]`` if given.

    For updates that do not depend on the model (such as :class:`FixedUpdates`); a round with no
    contributor sums to zeros.
    """
    out = []
    for t in range(rounds):
        users = contributors[t] if contributors is not None else range(n_users)
        no_model = np.zeros(1)
        total = np.zeros_like(np.asarray(updates(t, 0, no_model), dtype=np.float64))
        for u in users:
            total = total + np.asarray(updates(t, u, no_model), dtype=np.float64)
        out.append(total)
    return out
