"""Federated learning on the user's own torch module and data: :func:`run`.

The same rounds as ``immersion fl run`` (:func:`immersion_fl.runtime.engine.train_rounds`), on
a :class:`~immersion_fl.runtime.engine.FederatedTask` built from the user's objects instead of
the SDK's model and dataset names. The module is never modified: training runs on a flat copy of its
parameters and the result holds a decoded copy of the same class.
"""

from __future__ import annotations

import copy
import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from immersion import InvalidArgumentError

from .config import RunConfig
from .runtime.engine import FederatedTask, RunResult, progress_bar, run_federated
from .runtime.models import FlatModel
from .runtime.user_model import (  # check_module, client_tensors: importable from here too
    check_module,
    check_outputs,
    check_targets,
    client_tensors,
    require_torch,
)

if TYPE_CHECKING:
    import torch

    from .config import SchemeOptions
    from .hookspecs import SchemeSpec


@dataclass
class FederatedResult:
    """What :func:`run` returns.

    Parameters
    ----------
    model:
        A copy of the user's module (same class) holding the decoded global model.
    privacy:
        The scheme's privacy figures (per-element epsilons, noise law, ...; empty for FedAvg).
    history:
        Per-round figures (accuracy with ``test_data``, distance to plain FedAvg with
        ``compare_plain``, the reference drift with ``reference_drift``, round times, dropped
        clients).
    """

    model: "torch.nn.Module"
    privacy: dict[str, Any]
    history: RunResult

    def summary(self) -> dict[str, Any]:
        """The run's figures as one JSON-ready dictionary (as ``immersion fl run --json``)."""
        return self.history.summary()


def run(
    model: "torch.nn.Module",
    client_data: Sequence[Any],
    *,
    scheme: str,
    optimizer: str = "sgd",
    lr: float,
    rounds: int,
    local_epochs: int,
    batch_size: int,
    shuffle: bool = True,
    engine: str = "local",
    rng: int | np.random.Generator | None = None,
    test_data: tuple[Any, Any] | None = None,
    compare_plain: bool = False,
    reference_drift: bool = False,
    client_timeout: float | None = None,
    progress: bool | Callable[[str], None] = False,
    device: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    **scheme_options: Any,
) -> FederatedResult:
    """Train ``model`` federatedly on ``client_data`` with a registered scheme.

    Each client runs ``local_epochs`` of mini-batch steps of ``optimizer`` on the mean
    cross-entropy of its data (its state fresh every round), the server averages weighted by
    sample counts (seed 000 eq. 2). With a SIFL scheme the clients train on the decoded broadcast
    and upload the lifted change (seed 000 section 7), and the decoded model equals that FedAvg
    run round by round.

    Parameters
    ----------
    model:
        A ``torch.nn.Module`` with float64 parameters and no buffers (BatchNorm's running
        statistics are not averaged by these schemes). Its current parameters are the initial
        model; it is not modified.
    client_data:
        One ``(X_i, Y_i)`` pair of arrays or tensors, or one torch ``Dataset`` of ``(x, y)``
        items, per client. ``Y_i``: class indices (1-D integers) or one-hot / probability rows.
    scheme:
        A registered scheme: ``fedavg``, ``sifl-m1``, ``sifl-m2``, ``sifl-rm``, ``mpdp`` (bias-free
        ReLU MLPs, FedSGD), ``sgd-dp``, ``gsgd-dp``, ``gd-dp`` (FedSGD under secure aggregation).
    optimizer, lr:
        The clients' optimizer (``sgd``, ``momentum``, ``adam`` or a plugin's) and learning rate.
    rounds, local_epochs, batch_size:
        Rounds, local epochs per round and mini-batch size (the last batch may be shorter).
    shuffle:
        A fresh batch order every epoch (from ``rng``) or the data in its order.
    engine:
        ``"local"`` (this process) or ``"flower"`` (Flower's simulation runtime).
    rng:
        Seed or ``numpy.random.Generator`` for keys, noise and batch order (None: OS entropy).
    test_data:
        Held-out ``(X, Y)`` to report accuracy every round.
    compare_plain:
        Also run plain FedAvg in lockstep and report the distance every round.
    reference_drift:
        Also run plain FedAvg summing its uploads in reverse order, and report its distance to
        plain FedAvg every round (``history.reference_drift``: the float64 drift of FedAvg
        against itself, next to the scheme's). Needs ``compare_plain`` and a weight-averaging
        scheme other than ``fedavg``; local and Flower engines.
    client_timeout:
        Seconds a client may take before it is left out of a round.
    progress:
        Show a progress bar on stderr (True) or call this function with one line per round.
    device:
        Where keys, model and training live: ``"cpu"`` (default) or ``"cuda"`` (the torch backend
        runs the key products and the clients' training on the GPU; SIFL and FedAvg, local engine).
    checkpoint:
        A folder where the server state and keys are saved after every round (owner-only
        files), as ``immersion fl run --checkpoint``; ``engine="local"``.
    resume:
        Continue the run saved in ``checkpoint`` (call again with the same arguments; with
        ``rng=None`` the saved run's seed is reused). The result equals an uninterrupted run's.
    **scheme_options:
        The scheme's own options (e.g. ``epsilon_local=0.5, keys="block"`` for SIFL; see
        :class:`~immersion_fl.schemes.SiflOptions`); unknown names are refused.

    Returns
    -------
    FederatedResult
        The decoded model, the privacy figures and the per-round history.

    Examples
    --------
    >>> import torch
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3)).double()
    >>> X = torch.randn(40, 4, dtype=torch.float64)
    >>> data = [(X[:20], (X[:20, 0] > 0).long()), (X[20:], (X[20:, 0] > 0).long())]
    >>> out = run(net, data, scheme="sifl-m1", lr=0.1, rounds=2, local_epochs=1, batch_size=8,
    ...           rng=0, compare_plain=True)
    >>> type(out.model) is type(net), out.history.diff_vs_plain[-1] < 1e-12
    (True, True)
    """
    torch = require_torch()
    spec = _scheme_spec(scheme)
    options = _scheme_options(spec, scheme_options)
    check_module(model)
    clients = [
        client_tensors(i, item) for i, item in enumerate(_as_list(client_data, "client_data"))
    ]
    check_targets(clients)
    check_outputs(model, clients)
    test = client_tensors(-1, test_data, argument="test_data") if test_data is not None else None
    if test is not None:
        check_outputs(model, [test], argument="test_data")
    if not isinstance(resume, bool):
        raise InvalidArgumentError("resume", f"expected True or False, got {resume!r}")
    if resume and checkpoint is None:
        raise InvalidArgumentError("resume", "needs the checkpoint folder of the run to continue")
    if checkpoint is not None and engine != "local":
        raise InvalidArgumentError("checkpoint", "checkpoints work with engine='local'")
    if resume and rng is None:  # OS-entropy seed: the saved run's
        from .runtime.checkpoint import saved_seed

        seed = saved_seed(checkpoint)  # type: ignore[arg-type]
    else:
        seed = _seed(rng)
    cfg = RunConfig(
        scheme=scheme,
        optimizer=optimizer,
        lr=lr,
        model=type(model).__name__,
        hidden=(),
        clients=len(clients),
        rounds=rounds,
        local_epochs=local_epochs,
        batch_size=batch_size,
        dataset="user data",
        seed=seed,
        compare_plain=compare_plain,
        client_timeout=client_timeout,
        options=options,
    )
    if not isinstance(shuffle, bool):
        raise InvalidArgumentError("shuffle", f"expected True or False, got {shuffle!r}")
    _check_reference_drift(reference_drift, spec, compare_plain)
    working = copy.deepcopy(model)
    w0 = torch.nn.utils.parameters_to_vector(working.parameters()).detach().clone()
    task = FederatedTask(FlatModel(working), clients, w0, test, shuffle)
    if device not in (None, "cpu"):
        from immersion.backends import make_backend

        make_backend(
            "torch", dtype="float64", device=device
        )  # refuses a device torch cannot use, naming it
        if spec.factory is None or engine != "local":
            raise InvalidArgumentError(
                "device",
                f"{device!r} runs the weight-averaging schemes on engine='local'; "
                f"{scheme!r} with engine={engine!r} runs on the CPU",
            )
        task = task.to(device)
    report = progress_bar(rounds) if progress is True else (progress or None)
    history = run_federated(
        cfg,
        engine=engine,
        progress=report,
        task=task,
        reference_drift=reference_drift,
        checkpoint=checkpoint,
        resume=resume,
    )
    decoded = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(
        torch.as_tensor(history.final_model, dtype=torch.float64).detach().cpu().reshape(-1),
        decoded.parameters(),
    )
    return FederatedResult(decoded, dict(history.privacy), history)


def _check_reference_drift(value: object, spec: SchemeSpec, compare_plain: bool) -> None:
    if not isinstance(value, bool):
        raise InvalidArgumentError("reference_drift", f"expected True or False, got {value!r}")
    if not value:
        return
    if spec.factory is None or spec.name == "fedavg":
        raise InvalidArgumentError(
            "reference_drift",
            f"is measured beside a weight-averaging scheme's plain twin; {spec.name!r} has none",
        )
    if compare_plain is not True:
        raise InvalidArgumentError(
            "reference_drift", "needs compare_plain=True (it is measured beside plain FedAvg)"
        )


def _scheme_spec(scheme: object) -> SchemeSpec:
    from .registry import fl_registry

    if not isinstance(scheme, str):
        raise InvalidArgumentError("scheme", f"expected a scheme name, got {scheme!r}")
    return fl_registry().fl_scheme(scheme)


def _scheme_options(spec: SchemeSpec, values: dict[str, Any]) -> SchemeOptions:
    import dataclasses

    known = {f.name for f in dataclasses.fields(spec.options)}
    for name in values:
        if name not in known:
            raise InvalidArgumentError(
                name,
                f"is not an option of scheme {spec.name!r}; its options: {sorted(known) or 'none'}",
            )
    return spec.options(**values)


def _as_list(value: Any, argument: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise InvalidArgumentError(
            argument, f"expected a list with one item per client, got {type(value).__name__}"
        )
    items = list(value)
    if not items:
        raise InvalidArgumentError(argument, "expected at least one client")
    return items


def _seed(rng: object) -> int:
    if rng is None:
        return secrets.randbits(62)
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(2**62))
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return int(rng)
    raise InvalidArgumentError(
        "rng", f"expected None, a seed >= 0 or a numpy Generator, got {rng!r}"
    )
