"""Audit rows for SIML (``immersion audit --scheme siml``): what the training service can decode.

Eq. 44 evaluates the gradient on ``Pi1_left y~_i``, so whoever holds the job file (the service,
or anyone who obtains the file) recovers every training sample and every model iterate. The
attack below does exactly that, from the job file alone, and measures the error.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
from immersion.audit.runner import AttackResult


def run_service_decodes(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """Decode the training set and the final model from the job file and the service's own run."""
    import torch
    from immersion_fl.runtime.data import load_digits_dataset

    from .dynamics import TrainingPlan, run_plan
    from .job import PrivacyDesign, decode_model, load_job, prepare_job, save_job

    data = load_digits_dataset(seed=seed)
    n = 200 if quick else len(data.x_train)
    x, y = torch.as_tensor(data.x_train[:n]), torch.as_tensor(data.y_train[:n])
    plan = TrainingPlan(optimizer="adam", lr=0.001, epochs=1 if quick else 3, order_seed=seed)
    user, job, x0 = prepare_job("nn-x2", x, y, plan, design=PrivacyDesign(), rng=seed)
    with tempfile.TemporaryDirectory() as folder:
        stolen = load_job(save_job(job, Path(folder) / "job.siml"))
    service = stolen.target()
    images, targets = service.decoded_dataset(torch.as_tensor(stolen.encoded_dataset))
    data_error = float((images - x).abs().max())
    raw_error = float(
        np.abs(stolen.encoded_dataset[:, : x[0].numel()] - x.reshape(n, -1).numpy()).mean()
    )
    label_hits = float((targets.argmax(1) == y).double().mean())

    encoded_model, encoded_state = service.train(
        torch.as_tensor(stolen.encoded_state), torch.as_tensor(stolen.encoded_dataset), plan
    )
    w_service = service.decoded_params(encoded_state)  # Pi2_left x~_T: the service's own view
    w_user = decode_model(user, encoded_model, torch.as_tensor(job.encoded_dataset[0]))
    model_error = float((w_service - w_user).abs().max())
    dyn = service.dynamics
    w_plain = dyn.params(
        run_plan(
            dyn,
            x0,
            *service.layout.split(service.layout.rows(x, y)),
            dataclasses.replace(plan, sync="batch"),
        )
    )
    return [
        AttackResult(
            "service-decodes",
            "siml",
            "max abs error of the training images decoded from the job file",
            data_error,
            raw_error,
            "leaks" if data_error < 1e-6 else "resists",
            detail={
                "samples": n,
                "labels_recovered": label_hits,
                "baseline_is": "mean abs difference between encoded entries and the images",
            },
        ),
        AttackResult(
            "service-decodes",
            "siml",
            "max abs error of the final model as the service sees it (Pi2_left x~_T)",
            model_error,
            float((w_plain - dyn.params(x0)).abs().max()),
            "leaks" if model_error < 1e-6 else "resists",
            detail={
                "baseline_is": "how far training moved the weights (max abs change)",
                "mitigation": "none in eq. 44: the gradient needs the decoded data and weights",
            },
        ),
    ]
