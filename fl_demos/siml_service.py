"""The SIML training service as two parties (seed 002 section VI-A), using the public API only.

    .venv/bin/python fl_demos/siml_service.py [--model nn-x2] [--optimizer adam] [--epochs 5]
        [--workdir DIR] [--json]

1. User: draw keys, encode the digits training set and the initial model, write a job file.
2. Service (a separate process, as on another machine):
   ``immersion siml serve job.siml --out model.enc``.
3. User: decode the returned model with the keys and evaluate it on the held-out digits.

Then the same training runs plainly on the user's machine, and the two models are compared.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from immersion import load_keys, save_keys
from immersion_fl.runtime.data import load_digits_dataset
from immersion_siml.dynamics import TrainingPlan, run_plan
from immersion_siml.job import (
    PrivacyDesign,
    decode_model,
    key_holder,
    load_encoded_model,
    load_job,
    prepare_job,
    save_job,
)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nn-x2", choices=["mlp64", "nn-x2", "cnn"])
    parser.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="siml-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = load_digits_dataset()
    plan = TrainingPlan(
        optimizer=args.optimizer, lr=0.001 if args.optimizer == "adam" else 0.05, epochs=args.epochs
    )
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)

    # 1. user
    user, job, x0 = prepare_job(args.model, x, y, plan, design=PrivacyDesign(), rng=0)
    keys_file, job_file, model_file = (
        workdir / "user.keys",
        workdir / "job.siml",
        workdir / "model.enc",
    )
    save_keys(user.keys, keys_file, overwrite=True)
    save_job(job, job_file, overwrite=True)

    # 2. service, in its own process
    subprocess.run(
        [
            sys.executable,
            "-m",
            "immersion",
            "siml",
            "serve",
            str(job_file),
            "--out",
            str(model_file),
            "--force",
        ],
        check=True,
    )

    # 3. user: decode with the keys (and the first encoded sample, which masks the model)
    keys, uploaded = load_keys(keys_file), load_job(job_file)
    encoded_model, info = load_encoded_model(model_file)
    holder = key_holder(keys, uploaded)
    target = holder.target
    w = decode_model(
        holder, torch.as_tensor(encoded_model), torch.as_tensor(uploaded.encoded_dataset[0])
    )

    # plain training on the user's machine, same initial weights and batch order
    dynamics = target.dynamics
    images, targets = target.layout.split(target.layout.rows(x, y))
    w_plain = dynamics.params(
        run_plan(dynamics, x0, images, targets, dataclasses.replace(plan, sync="batch"))
    )
    x_test, y_test = torch.as_tensor(data.x_test), torch.as_tensor(data.y_test)
    out = {
        "model": args.model,
        "optimizer": args.optimizer,
        "epochs": args.epochs,
        "workdir": str(workdir),
        "job_bytes": job_file.stat().st_size,
        "model_bytes": model_file.stat().st_size,
        "service_train_seconds": info["train_seconds"],
        "accuracy": dynamics.model.evaluate(w, x_test, y_test)[0],
        "accuracy_plain": dynamics.model.evaluate(w_plain, x_test, y_test)[0],
        "max_abs_diff_vs_plain": float((w - w_plain).abs().max()),
    }
    print(json.dumps(out) if args.json else "\n".join(f"{k:22s} {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
