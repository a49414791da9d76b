"""Flower's SecAgg+ as the summation step of seed 001: what it computes, at what precision and cost.

Seed 001 gets its differential privacy from the server seeing only ``x = sum_i x_i``. This module runs
that sum with the SecAgg+ that flwr 1.41 ships, on Flower's simulation runtime (Ray backend), so a
caller can compare what the server obtains with the exact float64 sum.

API: :func:`secagg_sum` (SecAgg+) and :func:`plain_sum` (the same Flower run without SecAgg+; the
server sees every update) take ``updates(round, user, model) -> np.ndarray`` (called on the virtual
node whose partition id is ``user``, ``round`` counted from 0, ``model`` the array the server
broadcast; with ``initial`` and ``step`` it is a training run) and return an :class:`AggregationRun`:
per round the **sum** over the users that contributed (``sums``; ``None`` if the round was
halted), the server's raw output (``server_outputs``: the *mean* for SecAgg+), who contributed, and
timings. :func:`quantization_error_bound` is the guaranteed error of a SecAgg+ sum without clipping.

How it is wired (flwr 1.41): SecAgg+ exists only for the legacy API. The ServerApp wraps its
``Context`` in a ``LegacyContext`` with a :class:`~flwr.server.strategy.FedAvg` subclass that keeps
what reaches ``aggregate_fit``, and runs ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))``;
the ClientApp is ``ClientApp(client_fn, mods=[secaggplus_mod])`` with a ``NumPyClient`` whose ``fit``
returns ``[updates(round, user, model)]``, ``num_examples = 1`` and its partition id as a metric. The
Message-API ``@app.train()`` functions of :mod:`immersion_fl.flower_engine` cannot be used: the mod
reads and writes the legacy ``FitRes`` records. Dropouts are injected by a mod in front of
``secaggplus_mod`` that raises at a chosen stage (``dropouts={(round, user): stage}``).

Exact behaviour (read from ``flwr/common/secure_aggregation/quantization.py``, the mod and the
workflow), with ``c = clipping_range``, ``T = quantization_range``, ``M = modulus_range``:

* a user multiplies its update by ``round(num_examples / max_weight * T) / T`` (exactly 1 here:
  ``num_examples = max_weight = 1``), **clips every coordinate to [-c, c]** (silently, no count is
  reported), maps it to ``(x + c) T / (2c)`` in ``[0, T]`` and rounds it **stochastically** to an
  integer (up with probability equal to the fractional part, numpy's global unseeded generator: the
  rounding is unbiased), adds its private mask and pairwise masks mod ``M`` and sends that;
* the server sums mod ``M``, removes the masks, and returns ``(sum_q * 2c / T - k c) / k`` for the
  ``k`` users that sent a masked vector: the **mean** over the contributors, never the sum.
  :func:`secagg_sum` multiplies it by ``k`` to give the sum;
* so without clipping the error of the sum is, per coordinate, ``|err| < k * 2c / T`` (hard bound)
  with mean 0 and standard deviation at most ``sqrt(k) * c / T``; a coordinate with ``|x_i| > c``
  is replaced by ``+-c`` first (a bias of ``|x_i| - c``, unbounded);
* it needs ``k * T < M`` (else the integer sum wraps around mod ``M`` and the result is garbage,
  without any error) and ``T < 2**31`` (the rounded values are cast to int32); :func:`secagg_sum`
  refuses other settings. flwr's docstring says ``M`` must be less than ``2**32`` (its default is
  ``2**32``); ``M = 2**40`` with ``T = 2**30`` ran correctly here (int64 arithmetic, and the unmasked
  sum, below ``2**53``, is exact in float64), which gives a 256 times finer step.

``updates`` is shipped to Ray's workers with every message (cloudpickle): a module-level function
of an importable module, a lambda or closure, or :class:`FixedUpdates` (precomputed values) all work.

Measured (2 CPU cores, Ray's workers limited to ``min(n_users, os.cpu_count())``; 5 users, 650
float64 values ``+-U(0.1, 1)`` each (RMS of the sum 1.36), 3 rounds; :func:`_measure`):

* defaults ``c = 8``, ``T = 2**22``, ``M = 2**32`` (step ``2c/T = 3.8e-6``): error of the sum over
  3 x 650 coordinates max 1.34e-5, RMS 3.5e-6 (bound ``5 * 3.8e-6 = 1.9e-5``; the RMS matches the
  prediction ``sqrt(5/6) * 3.8e-6`` for uniform fractional parts), i.e. ~2.6e-6 of the sum's RMS;
* ``c = 1``, ``T = 2**22``: max 1.45e-6, RMS 4.3e-7 (bound 2.4e-6);
* ``c = 1``, ``T = 2**30``, ``M = 2**40``: max 5.5e-9, RMS 1.7e-9 (bound 9.3e-9);
* clipping, ``c = 0.5`` (about half the values beyond it): max error 1.65, RMS 0.49, no warning;
* dropouts (``num_shares = 5``, ``reconstruction_threshold = 3``, user 2 fails in round 1): at
  ``collect_masked_vectors`` (before sending its masked vector) the round aggregates users
  {0, 1, 3, 4} (its pairwise masks are rebuilt from shares; error as without dropout); at ``unmask``
  (after sending it) the round aggregates all 5, its private mask rebuilt from the others' shares;
  at ``setup`` or ``share_keys`` the round is **halted** (no aggregate, ``sums[1] is None``): the
  other nodes' ``unmask`` raises ``KeyError`` (they hold no share of the dead node's key) and the
  server then lacks shares. The next round runs normally. Two stage-2 dropouts with threshold 3
  aggregate the other three; three halt the round (2 active neighbours < 3). With threshold 4, one
  stage-2 dropout still aggregates (4 active neighbours). A plain run leaves a failing user out;
* time, one run each, same updates: a round after the first (the first includes starting Ray's
  workers, 9-14 s) takes 0.104 s plain (one message round trip) and 0.55 s with SecAgg+ defaults
  (four round trips, X25519 agreements and one mask expansion per neighbour): **ratio ~5.3**
  (SecAgg+ rounds ranged 0.40-0.87 s over the 11 SecAgg+ runs, so 4-8x). The whole
  ``run_simulation`` call: 16.4 s plain vs 16.9 s SecAgg+ (ratio 1.03; Ray's start dominates).

Not to be relied on (limitations):

* precision: a fixed-point sum with ``k * 2c / T`` worst-case error; float64 exactness is lost;
  clipping to ``[-c, c]`` is silent and unbounded in error; ``k * T < M`` caps the number of users
  (1023 with the defaults);
* a user that fails at ``setup`` or ``share_keys`` halts the whole round (no aggregate) instead of
  being left out; only failures at ``collect_masked_vectors`` and ``unmask`` are tolerated, within the
  threshold. Without ``timeout`` a silent node blocks the round forever;
* the server learns ``k`` and which users dropped (as any secure aggregation does);
* each mask is expanded by ``np.random.RandomState`` (Mersenne Twister, not a cryptographic
  generator) seeded with a **32-bit** XOR fold of the 32-byte secret (``pseudo_rand_gen``), drawn
  from ``[0, M - 2]`` (``randint(0, M - 1)``: slightly non-uniform mod ``M``). The secrecy of a mask
  thus rests on a 32-bit seed and a predictable generator, not on the X25519 agreement; we have not
  tried an attack, but this is not a secure deployment. The rounding uses numpy's global generator;
* the DP accounting of seed 001 (:mod:`immersion_secagg.accountant`) is for the *exact real* sum
  ``x = sum_i x_i``. SecAgg+ releases ``sum_i Q(clip(x_i))``, where ``Q`` is the user's stochastic
  rounding. That is a per-user map applied *before* summation, so the release is **not** a function
  of ``x`` (plus independent randomness): it depends on the individual ``x_i`` (through which
  coordinates were clipped and, at the scale of the step, through each fractional part). The
  post-processing theorem therefore does not carry the accountant's epsilon over to what the
  server sees, and the per-user maps cannot help either: seed 001 gives no DP for a single ``x_i``.
  Strictly, the accountant's numbers describe an idealised mechanism. What is true: if no
  coordinate is clipped, the release is ``x + E`` with ``|E| < k 2c/T`` per coordinate, ``E`` of mean
  zero and of variance ``sum_i f_i (1 - f_i) (2c/T)^2`` (``f_i`` the fractional parts), so when the
  Gaussian / WF-NA noise has a standard deviation far above the step ``2c/T`` (3.8e-6 with the
  defaults) the deviation from the analysed mechanism is tiny, but it is data dependent and not
  accounted for. For the accountant this means: (1) choose ``c`` so that clipping of a noisy update is a negligible tail
  event; its probability ``p`` (over the noise, for every data set) would add ``p`` to ``delta``, but
  only on top of a guarantee for the unclipped quantised sum, which (3) still lacks; (2) use
  ``Setting.users = k`` (the contributors actually in the sum, which dropouts reduce), not the
  number invited; (3) a rigorous statement needs an analysis of the discretised mechanism
  (distributed discrete Gaussian / Skellam-type analyses do this for noise added on the integer
  lattice, with modular wrap-around); we have not done it for Theorems 2 and 4.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping

import numpy as np
from immersion import OptionalDependencyError

#: Stages of Flower's SecAgg+ at which :func:`secagg_sum` can make a user fail (``dropouts``).
STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")

#: ``updates(round, user, model)``: the user's update at the model the server broadcast this round.
Updates = Callable[[int, int, np.ndarray], np.ndarray]
#: ``step(model, total, contributors)``: the server's new model from the aggregate (FedSGD: a gradient step).
Step = Callable[[np.ndarray, np.ndarray, list[int]], np.ndarray]


@dataclass
class AggregationRun:
    """What the ServerApp obtained, round by round.

    ``sums[t]``: the sum over ``contributors[t]`` (SecAgg+: the server's mean times the number of
    contributors), ``None`` if the round was halted; ``server_outputs[t]``: what the workflow handed to
    the strategy (SecAgg+: the mean; plain: the sum we computed from the individual updates).
    ``round_seconds[t]``: the fit workflow of round ``t`` on the ServerApp (messages and crypto);
    ``total_seconds``: the whole ``run_simulation`` call, Ray start included.
    """

    secure: bool
    sums: list[np.ndarray | None]
    server_outputs: list[np.ndarray | None]
    contributors: list[list[int]]
    round_seconds: list[float]
    models: list[np.ndarray] = field(
        default_factory=list
    )  # the model after every round (with ``step``)
    total_seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)


def quantization_error_bound(
    contributors: int, clipping_range: float, quantization_range: int
) -> float:
    """Worst-case per-coordinate error of a SecAgg+ sum over ``contributors`` users, no coordinate clipped.

    Each user's stochastic rounding moves a value by less than one step ``2c / T``; the sum of ``k``
    of them by less than ``k`` steps. A float64 margin (``64 eps k c``) covers the dequantisation.
    """
    step = 2.0 * clipping_range / quantization_range
    return contributors * step + 64 * np.finfo(np.float64).eps * contributors * clipping_range


class FixedUpdates:
    """``updates(round, user, model)`` from an array of shape ``(rounds, users, ...)``, whatever the model
    (picklable by value)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = np.asarray(values, dtype=np.float64)

    def __call__(self, t: int, user: int, model: np.ndarray | None = None) -> np.ndarray:
        return self.values[t, user]


def _flwr() -> Any:
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


# ----------------------------------------------------------------------------------------------------------- client


class _ClientFn:
    """``client_fn(context)``: a NumPyClient whose ``fit`` returns ``[updates(round, user, model)]`` with weight 1."""

    def __init__(self, updates: Updates) -> None:
        self.updates = updates

    def __call__(self, context: Any) -> Any:
        NumPyClient, updates = _flwr()["NumPyClient"], self.updates
        user = int(context.node_config["partition-id"])

        class _User(NumPyClient):  # type: ignore[misc, valid-type]
            def fit(
                self, parameters: Any, config: Any
            ) -> tuple[list[np.ndarray], int, dict[str, Any]]:
                model = np.asarray(parameters[0], dtype=np.float64)
                update = np.ascontiguousarray(
                    updates(int(config["round"]), user, model), dtype=np.float64
                )
                return [update], 1, {"user": user}

        return _User().to_client()


def _dropout_mod(
    msg: Any,
    ctxt: Any,
    call_next: Callable[[Any, Any], Any],
    *,
    dropouts: Mapping[tuple[int, int], str],
) -> Any:
    """Fail (raise) when ``dropouts`` says this user drops at this round and stage (in front of SecAgg+)."""
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


# ----------------------------------------------------------------------------------------------------------- server


def _strategy(
    n_users: int, secure: bool, run: AggregationRun, initial: np.ndarray, step: Step | None
) -> Any:
    FedAvg = _flwr()["FedAvg"]
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    class _Keep(FedAvg):  # type: ignore[misc, valid-type]
        """FedAvg that samples every user each round and keeps what reaches ``aggregate_fit``."""

        model: np.ndarray = np.zeros(1)

        def aggregate_fit(
            self, server_round: int, results: list, failures: list
        ) -> tuple[Any, dict]:
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


def _timed(workflow: Callable[[Any, Any], None], run: AggregationRun) -> Callable[[Any, Any], None]:
    def fit(grid: Any, context: Any) -> None:
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
    settings: dict[str, Any],
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
    def main(grid: Any, context: Any) -> None:
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
    """Sum ``updates(t, user)`` over the users with Flower's SecAgg+ for ``t < rounds``; see the module docstring.

    ``num_shares`` (flwr's meaning: neighbours each user shares its secrets with, itself included)
    defaults to every user, ``reconstruction_threshold`` to a majority ``max(2, n_users // 2 + 1)``;
    flwr rejects an integer threshold that is not below an integer ``num_shares``. ``dropouts[(t, user)] = stage`` makes the
    user raise at that SecAgg+ stage (one of :data:`STAGES`) of round ``t``. Returns the sums (the
    server's mean times the contributors), the contributors and timings; a halted round has sum ``None``.
    With ``initial`` and ``step`` the server broadcasts ``initial``, then after every round the model
    ``step(model, sum, contributors)`` (a federated training run); ``run.models`` keeps them.
    """
    if not (isinstance(quantization_range, int) and 0 < quantization_range < 2**31):
        raise ValueError(
            "quantization_range must be an integer in (0, 2**31): the rounded values are cast to int32"
        )
    if n_users * quantization_range >= modulus_range:
        raise ValueError(
            f"n_users * quantization_range = {n_users * quantization_range} must be below "
            f"modulus_range = {modulus_range}, or the integer sum wraps around"
        )
    if modulus_range > 2**53:
        raise ValueError(
            "modulus_range must be at most 2**53 (the unmasked integer sum is dequantised in float64)"
        )
    if not clipping_range > 0:
        raise ValueError("clipping_range must be positive")
    # flwr wants an integer num_shares > 2 (1.0, a float, means every user) and threshold < num_shares
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
    """The same Flower run without SecAgg+: the server receives every update and sums them (the baseline).

    ``dropouts[(t, user)]`` (any stage name, or ``"fit"``) makes the user fail in round ``t``; it is left out.
    """
    return _run(updates, n_users, rounds, secure=False, dropouts=dropouts or {}, settings={})


def exact_sums(
    updates: Updates, n_users: int, rounds: int, contributors: list[list[int]] | None = None
) -> list[np.ndarray]:
    """The float64 sums computed locally (over ``contributors[t]`` if given; zeros if none), in user order,
    for updates that do not depend on the model (such as :class:`FixedUpdates`)."""
    out = []
    for t in range(rounds):
        users = contributors[t] if contributors is not None else range(n_users)
        no_model = np.zeros(1)
        total = np.zeros_like(np.asarray(updates(t, 0, no_model), dtype=np.float64))
        for u in users:
            total = total + np.asarray(updates(t, u, no_model), dtype=np.float64)
        out.append(total)
    return out


def _errors(run: AggregationRun, updates: Updates, n_users: int, rounds: int) -> dict[str, float]:
    done = [t for t in range(rounds) if run.sums[t] is not None]
    exact = exact_sums(updates, n_users, rounds, run.contributors)
    diffs = np.concatenate([np.ravel(run.sums[t] - exact[t]) for t in done])
    return {"max": float(np.max(np.abs(diffs))), "rms": float(np.sqrt(np.mean(diffs**2)))}


def _measure(
    n_users: int = 5, dim: int = 650, rounds: int = 3, seed: int = 1
) -> None:  # pragma: no cover
    """The measurements quoted in the module docstring (thirteen Flower runs; about five minutes).

    Round 0 of every run includes starting Ray's workers, so per-round times are those of rounds >= 1.
    """
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.1, 1.0, (rounds, n_users, dim)) * rng.choice(
        [-1.0, 1.0], (rounds, n_users, dim)
    )
    updates = FixedUpdates(values)
    rms_sum = float(np.sqrt(np.mean(values.sum(axis=1) ** 2)))

    def show(label: str, run: AggregationRun, bound: float | None = None) -> None:
        ok = [s is not None for s in run.sums]
        err = _errors(run, updates, n_users, rounds) if any(ok) else {}
        warm = float(np.mean(run.round_seconds[1:])) if rounds > 1 else float("nan")
        print(
            f"{label}: aggregated {ok} contributors {run.contributors} errors {err} bound {bound} "
            f"(RMS of the sum {rms_sum:.3g}) rounds {[round(x, 3) for x in run.round_seconds]} "
            f"warm round {warm:.3f} s total {run.total_seconds:.1f} s",
            flush=True,
        )

    show("plain", plain_sum(updates, n_users, rounds))
    for c, q, m in [
        (8.0, 2**22, 2**32),
        (1.0, 2**22, 2**32),
        (1.0, 2**30, 2**40),
        (0.5, 2**22, 2**32),
    ]:
        run = secagg_sum(
            updates, n_users, rounds, clipping_range=c, quantization_range=q, modulus_range=m
        )
        show(
            f"secagg c={c} T=2**{int(math.log2(q))} M=2**{int(math.log2(m))}",
            run,
            quantization_error_bound(n_users, c, q),
        )
    for stage in STAGES:
        run = secagg_sum(
            updates,
            n_users,
            rounds,
            num_shares=5,
            reconstruction_threshold=3,
            dropouts={(1, 2): stage},
        )
        show(f"dropout of user 2 in round 1 at {stage} (5 shares, threshold 3)", run)
    run = secagg_sum(
        updates,
        n_users,
        rounds,
        num_shares=5,
        reconstruction_threshold=3,
        dropouts={(1, 2): "collect_masked_vectors", (1, 4): "collect_masked_vectors"},
    )
    show("two dropouts at collect_masked_vectors (5 shares, threshold 3)", run)
    run = secagg_sum(
        updates,
        n_users,
        rounds,
        num_shares=5,
        reconstruction_threshold=4,
        dropouts={(1, 2): "collect_masked_vectors"},
    )
    show("one dropout at collect_masked_vectors (5 shares, threshold 4)", run)
    run = secagg_sum(
        updates,
        n_users,
        rounds,
        num_shares=5,
        reconstruction_threshold=3,
        dropouts={(1, u): "collect_masked_vectors" for u in (0, 2, 4)},
    )
    show("three dropouts at collect_masked_vectors (5 shares, threshold 3)", run)
    show(
        "plain, user 2 fails in round 1",
        plain_sum(updates, n_users, rounds, dropouts={(1, 2): "fit"}),
    )


if __name__ == "__main__":  # pragma: no cover
    _measure()
