"""``immersion bench siml``: plain training, SIML, Opacus DP-SGD and CKKS side by side (seed 002
Figs. 4-5).

One process, one dataset, one model, one batch order. Timings are training only (no key
drawing, encoding or evaluation), best of ``repeats`` with plain and SIML alternating. Ratios:

* ``siml_time_ratio``: SIML's target optimizer over the plain optimizer (the same flat-vector
  code, run as a plain loop: no encoding, the state packed once an epoch);
* ``siml_time_ratio_vs_torch``: over a standard torch loop of the same module (``torch.optim``),
  with ``siml_max_abs_diff_vs_torch`` the largest weight difference to that loop's model;
* ``dpsgd[].time_ratio``: Opacus DP-SGD over a standard torch training loop of the same model
  (Opacus trains ``nn.Module`` objects, so that is its plain counterpart);
* ``ckks_time_ratio_vs_siml``: CKKS training of the x^2 network, **extrapolated** from encrypted
  forward+backward passes on a few samples, over SIML's measured training time.

Baselines whose optional extra (``baselines``: opacus, tenseal) is missing are skipped with a
message in ``skipped``. ``model`` may be the user's ``package.module:function`` and ``dataset``
the user's data (:class:`~immersion_siml.inputs.UserData`): plain and SIML then run on them (the
baselines run on the SDK's models only).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from immersion import OptionalDependencyError

from .dynamics import TrainingPlan, run_plan
from .job import PrivacyDesign, decode_model, prepare_job
from .models import MODEL_NAMES

DPSGD_EPSILONS = (0.1, 0.6, 2.0, 10.0)


def _best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _torch_loop(module: Any, x: Any, y: Any, plan: TrainingPlan) -> Callable[[], Any]:
    """Plain training as a torch user writes it: the module itself, ``torch.optim`` (Adam with
    Keras' ``eps = 1e-7``, SGD with or without momentum 0.9), cross-entropy against ``y`` (labels
    or rows), the plan's batches. Each call trains a fresh copy from the same initial weights;
    this is also the plain counterpart of Opacus' DP-SGD."""
    import copy

    import torch

    def train() -> Any:
        net = copy.deepcopy(module)
        opt = (
            torch.optim.Adam(net.parameters(), lr=plan.lr, eps=1e-7)
            if plan.optimizer == "adam"
            else torch.optim.SGD(
                net.parameters(), lr=plan.lr, momentum=0.9 if plan.optimizer == "momentum" else 0
            )
        )
        for epoch in plan.batches(len(x)):
            for idx in epoch:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                opt.step()
        return torch.nn.utils.parameters_to_vector(net.parameters()).detach()

    return train


def _siml_side_by_side(
    model_name: str,
    dataset: Any,
    plan: TrainingPlan,
    design: PrivacyDesign,
    repeats: int,
    seed: int,
) -> dict[str, Any]:
    """Plain (the same flat-vector optimizer code, and a standard torch loop) and SIML training
    timed alternately, best of ``repeats``; decoded model and accuracy compared."""
    import copy

    import torch

    x_train = torch.as_tensor(dataset.x_train, dtype=torch.float64)
    y_train = torch.as_tensor(dataset.y_train)
    user, job, x0 = prepare_job(
        model_name,
        x_train,
        y_train,
        plan,
        design=design,
        init_seed=seed,
        rng=seed,
        n_classes=getattr(dataset, "n_classes", None),
    )
    target, dynamics = user.target, user.target.dynamics
    images, targets = target.layout.split(target.layout.rows(x_train, y_train))
    encoded_state, encoded_dataset = (
        torch.as_tensor(job.encoded_state),
        torch.as_tensor(job.encoded_dataset),
    )
    module = copy.deepcopy(dynamics.model.module)
    torch.nn.utils.vector_to_parameters(dynamics.params(x0), module.parameters())
    torch_loop = _torch_loop(module, x_train, y_train, plan)
    plain_plan = dataclasses.replace(plan, sync="epoch")  # the plain loop, packed once an epoch
    t_plain, t_torch, t_siml = float("inf"), float("inf"), float("inf")
    for _ in range(repeats):
        seconds, x_plain = _best_time(
            lambda: run_plan(dynamics, x0, images, targets, plain_plan), 1
        )
        t_plain = min(t_plain, seconds)
        seconds, w_torch = _best_time(torch_loop, 1)
        t_torch = min(t_torch, seconds)
        seconds, (encoded_model, _) = _best_time(
            lambda: target.train(encoded_state, encoded_dataset, plan), 1
        )
        t_siml = min(t_siml, seconds)
    w_siml = decode_model(user, encoded_model, encoded_dataset[0])
    w_plain = dynamics.params(x_plain)

    def accuracy(w: Any) -> float:
        if dataset.x_test is None:
            return float("nan")
        x_test = torch.as_tensor(dataset.x_test, dtype=torch.float64)
        return dynamics.model.accuracy(w, x_test, torch.as_tensor(dataset.y_test))

    report = user.report()
    return {
        "sync": plan.sync,
        "plain_seconds": t_plain,
        "torch_seconds": t_torch,
        "siml_seconds": t_siml,
        "time_ratio": t_siml / t_plain,
        "time_ratio_vs_torch": t_siml / t_torch,
        "max_abs_diff_vs_plain": float((w_siml - w_plain).abs().max()),
        "max_abs_diff_vs_torch": float((w_siml - w_torch).abs().max()),
        "accuracy_plain": accuracy(w_plain),
        "accuracy_siml": accuracy(w_siml),
        "epsilon_data": report.epsilon_input,
        "epsilon_model": report.epsilon_output,
        "n_params": dynamics.n_params,
    }


def bench_siml(
    *,
    model: str = "nn-x2",
    dataset: Any = None,
    plan: TrainingPlan | None = None,
    design: PrivacyDesign | None = None,
    epsilons: tuple[float, ...] = DPSGD_EPSILONS,
    delta: float = 1e-5,
    repeats: int = 3,
    ckks_samples: int = 4,
    seed: int = 0,
    baselines: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """All figures of ``immersion bench siml`` as one dict (see the module docstring)."""
    from immersion_fl.runtime.data import load_digits_dataset

    dataset = dataset if dataset is not None else load_digits_dataset(seed=seed)
    plan = plan or TrainingPlan(
        optimizer="adam", lr=0.001, epochs=10, batch_size=32, order_seed=seed
    )
    design = design or PrivacyDesign()
    say = progress or (lambda _msg: None)
    rows = []
    for sync in ("epoch", "batch"):
        say(f"plain and SIML ({sync} sync), {repeats} repeats")
        rows.append(
            _siml_side_by_side(
                model, dataset, dataclasses.replace(plan, sync=sync), design, repeats, seed
            )
        )
    main_row = rows[0] if plan.sync == "epoch" else rows[1]
    out: dict[str, Any] = {
        "model": model,
        "n_params": rows[0]["n_params"],
        "dataset": dataset.name,
        "n_train": len(dataset.x_train),
        "optimizer": plan.optimizer,
        "lr": plan.lr,
        "epochs": plan.epochs,
        "batch_size": plan.batch_size,
        "sync": plan.sync,
        "repeats": repeats,
        "accuracy_plain": main_row["accuracy_plain"],
        "accuracy_siml": main_row["accuracy_siml"],
        "siml_max_abs_diff_vs_plain": max(r["max_abs_diff_vs_plain"] for r in rows),
        "siml_time_ratio": main_row["time_ratio"],
        "siml_time_ratio_vs_torch": main_row["time_ratio_vs_torch"],
        "siml_max_abs_diff_vs_torch": max(r["max_abs_diff_vs_torch"] for r in rows),
        "siml_by_sync": rows,
        "epsilon_data": main_row["epsilon_data"],
        "epsilon_model": main_row["epsilon_model"],
        "dpsgd": [],
        "ckks": None,
        "ckks_time_ratio_vs_siml": None,
        "skipped": [],
    }
    if not baselines:
        out["skipped"].append("baselines: not requested")
        return out
    if model not in MODEL_NAMES:
        out["skipped"].append(f"baselines: run on the SDK's models ({', '.join(MODEL_NAMES)}) only")
        return out

    from . import ckks, dpsgd

    try:
        plain_torch = main_row["torch_seconds"]  # Opacus' plain counterpart
        out["plain_torch_seconds"] = plain_torch
        for eps in epsilons:
            say(f"Opacus DP-SGD at epsilon {eps}")
            r = dpsgd.train_dpsgd(
                model,
                dataset,
                epsilon=eps,
                delta=delta,
                epochs=plan.epochs,
                batch_size=plan.batch_size,
                lr=plan.lr,
                optimizer=plan.optimizer,
                seed=seed,
            )
            out["dpsgd"].append({**r.as_dict(), "time_ratio": r.seconds / plain_torch})
    except OptionalDependencyError as exc:
        out["skipped"].append(f"dpsgd: {exc}")
    if model != "nn-x2":
        out["skipped"].append("ckks: runs on the x^2 network only (--model nn-x2)")
        return out
    try:
        say(
            f"CKKS encrypted forward+backward on {ckks_samples} samples "
            "(extrapolated to the training set)"
        )
        flat = dataset.x_train.reshape(len(dataset.x_train), -1)
        m = ckks.measure_ckks_training(flat, dataset.y_train, n_samples=ckks_samples, seed=seed)
        ckks_seconds = m.extrapolated_epoch_s * plan.epochs
        out["ckks"] = {
            **m.as_dict(),
            "extrapolated_training_s": ckks_seconds,
            "label": "extrapolated",
        }
        out["ckks_time_ratio_vs_siml"] = ckks_seconds / main_row["siml_seconds"]
    except OptionalDependencyError as exc:
        out["skipped"].append(f"ckks: {exc}")
    return out
