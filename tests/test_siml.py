"""SIML (seed 002 section VI-A): the decoded model equals plain training, epoch by epoch; files;
errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from immersion import InvalidArgumentError, PrecisionError  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion_fl.runtime.data import load_digits_dataset  # noqa: E402
from immersion_fl.runtime.optimizers import adam  # noqa: E402
from immersion_siml.dynamics import OptimizerDynamics, TrainingPlan, run_plan  # noqa: E402
from immersion_siml.job import (  # noqa: E402
    PrivacyDesign,
    SimlFileError,
    decode_model,
    load_encoded_model,
    load_job,
    prepare_job,
    save_encoded_model,
    save_job,
)
from immersion_siml.models import siml_model  # noqa: E402
from immersion_siml.run import run_siml  # noqa: E402
from immersion_siml.target import SampleLayout  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    return load_digits_dataset()


@pytest.mark.parametrize("model", ["nn-x2", "mlp64"])
@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("adam", 0.001)])
@pytest.mark.parametrize("sync", ["epoch", "batch"])
def test_decoded_model_equals_plain_training_every_epoch(digits, model, optimizer, lr, sync):
    plan = TrainingPlan(optimizer=optimizer, lr=lr, epochs=3, batch_size=64, sync=sync)
    result = run_siml(model, digits, plan, rng=1)
    assert len(result.max_abs_diff_per_epoch) == 3
    assert max(result.max_abs_diff_per_epoch) <= 1e-9
    assert result.max_abs_diff_vs_plain <= 1e-9
    assert result.accuracy == result.accuracy_plain
    assert result.accuracy_curve == result.accuracy_curve_plain
    assert result.accuracy > 0.3  # it trained (10 classes: chance is 0.1)


def test_plain_dynamics_is_the_ordinary_optimizer(digits):
    """The flat-state Adam (second moment carried as its square root) is Adam, step for step."""
    model = siml_model("nn-x2", feature_shape=(1, 8, 8))
    dynamics = OptimizerDynamics(model, adam(0.01))
    layout = SampleLayout((1, 8, 8), 10)
    images, targets = layout.split(
        layout.rows(torch.as_tensor(digits.x_train), torch.as_tensor(digits.y_train))
    )
    plan = TrainingPlan(optimizer="adam", lr=0.01, epochs=2, batch_size=50, sync="batch")
    w = model.initial_vector(3)
    x = run_plan(dynamics, dynamics.initial_state(w), images, targets, plan)
    opt = adam(0.01)
    state = opt.init(w)
    for epoch in plan.batches(len(images)):
        for idx in epoch:
            _, grad = model.loss_and_grad(w, images[idx], targets[idx])
            update, state = opt.update(grad, state, w)
            w = w + update
    assert float((dynamics.params(x) - w).abs().max()) < 1e-12
    assert float((x[-dynamics.n_params :] ** 2 - state.nu).abs().max()) < 1e-15


def test_encoding_hides_the_sample_and_reports_theorem_1(digits):
    plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=1)
    result = run_siml(
        "nn-x2",
        digits,
        plan,
        design=PrivacyDesign(epsilon_data=0.5, epsilon_model=2.0),
        compare_plain=False,
    )
    assert result.privacy["epsilon_data"] == pytest.approx(0.5, rel=1e-9)
    assert result.privacy["epsilon_model"] == pytest.approx(2.0, rel=1e-9)
    assert result.privacy["epsilon_data_proven"] >= result.privacy["epsilon_data"]
    # the encoded sample is dominated by noise: far from the image it encodes
    assert (
        np.abs(result.sample_encoded - result.sample_original).max()
        > 10 * np.abs(result.sample_original).max()
    )
    assert np.isnan(result.max_abs_diff_vs_plain)


def test_infeasible_precision_is_refused(digits):
    plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=1)
    with pytest.raises(PrecisionError, match="tolerance"):
        run_siml(
            "nn-x2", digits, plan, design=PrivacyDesign(epsilon_data=1e-12), compare_plain=False
        )


def test_service_from_files_matches_in_process(tmp_path, digits):
    plan = TrainingPlan(optimizer="adam", lr=0.001, epochs=2, batch_size=64)
    x = torch.as_tensor(digits.x_train[:300])
    y = torch.as_tensor(digits.y_train[:300])
    user, job, _ = prepare_job("nn-x2", x, y, plan, design=PrivacyDesign(), rng=5)
    assert job.public_keys.noise is None  # the service never gets the noise law
    job_path = save_job(job, tmp_path / "job.siml")
    loaded = load_job(job_path)
    assert loaded.plan == plan and loaded.model == "nn-x2"
    np.testing.assert_array_equal(loaded.encoded_dataset, job.encoded_dataset)

    service = loaded.target()
    encoded_model, _ = service.train(
        torch.as_tensor(loaded.encoded_state), torch.as_tensor(loaded.encoded_dataset), plan
    )
    model_path = save_encoded_model(
        encoded_model.numpy(), tmp_path / "model.enc", info={"model": "nn-x2"}
    )
    returned, info = load_encoded_model(model_path)
    assert info == {"model": "nn-x2"}

    local, _ = user.target.train(
        torch.as_tensor(job.encoded_state), torch.as_tensor(job.encoded_dataset), plan
    )
    np.testing.assert_array_equal(returned, local.numpy())
    w = decode_model(user, torch.as_tensor(returned), torch.as_tensor(job.encoded_dataset[0]))
    assert w.shape == (1210,)


def test_files_refuse_tampering_foreign_files_and_overwrite(tmp_path, digits):
    plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=1)
    _, job, _ = prepare_job(
        "nn-x2",
        torch.as_tensor(digits.x_train[:50]),
        torch.as_tensor(digits.y_train[:50]),
        plan,
        design=PrivacyDesign(),
        rng=0,
    )
    path = save_job(job, tmp_path / "job.siml")
    with pytest.raises(SimlFileError, match="exists"):
        save_job(job, path)
    blob = bytearray(path.read_bytes())
    blob[-100] ^= 0xFF
    bad = tmp_path / "bad.siml"
    bad.write_bytes(bytes(blob))
    with pytest.raises(SimlFileError, match="integrity"):
        load_job(bad)
    other = tmp_path / "other.siml"
    other.write_bytes(b"not a job")
    with pytest.raises(SimlFileError, match="not an immersion SIML job"):
        load_job(other)
    with pytest.raises(SimlFileError, match="not an immersion SIML encoded-model"):
        load_encoded_model(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.siml",
        "job.siml",
        "other.siml",
    ]  # no temp files


def test_bad_input_names_the_argument(digits):
    with pytest.raises(InvalidArgumentError, match="optimizer"):
        TrainingPlan(optimizer="rmsprop")
    with pytest.raises(InvalidArgumentError, match="lr"):
        TrainingPlan(lr=float("nan"))
    with pytest.raises(InvalidArgumentError, match="epochs"):
        TrainingPlan(epochs=0)
    with pytest.raises(InvalidArgumentError, match="sync"):
        TrainingPlan(sync="step")
    with pytest.raises(InvalidArgumentError, match="model"):
        siml_model("resnet", feature_shape=(1, 8, 8))
    plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=1)
    x, y = torch.as_tensor(digits.x_train[:20]), torch.as_tensor(digits.y_train[:20])
    with pytest.raises(InvalidArgumentError, match="Y"):
        prepare_job("nn-x2", x, y[:-1], plan, design=PrivacyDesign())
    with pytest.raises(InvalidArgumentError, match="model"):
        prepare_job("cnn", x.reshape(20, -1), y, plan, design=PrivacyDesign())
    user, job, _ = prepare_job("nn-x2", x, y, plan, design=PrivacyDesign(), rng=0)
    with pytest.raises(InvalidArgumentError, match="encoded_dataset"):
        user.target.train(
            torch.as_tensor(job.encoded_state), torch.as_tensor(job.encoded_dataset[:, :-1]), plan
        )
    with pytest.raises(InvalidArgumentError, match="encoded_state"):
        user.target.train(
            torch.as_tensor(job.encoded_state[:-1]), torch.as_tensor(job.encoded_dataset), plan
        )
    other = dataclasses.replace(job, model="mlp64")
    with pytest.raises(InvalidArgumentError, match="model: mlp64 builds parameters"):
        other.target()  # the job's parameter list is checked first
    with pytest.raises(InvalidArgumentError, match="keys"):
        dataclasses.replace(other, parameters=None).target()  # as for a version-1 file


def test_cli_run_json_and_the_three_step_service(tmp_path):
    runner = CliRunner()
    res = runner.invoke(
        main,
        [
            "siml",
            "run",
            "--model",
            "nn-x2",
            "--optimizer",
            "sgd",
            "--epochs",
            "2",
            "--json",
            "--plot",
            str(tmp_path / "plots"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in (
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "time_ratio_vs_plain",
        "epsilon_data",
        "epsilon_model",
    ):
        assert key in out
    assert out["max_abs_diff_vs_plain"] <= 1e-9 and out["accuracy"] == out["accuracy_plain"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "siml_accuracy.png",
        "siml_sample.png",
    ]

    keys, job, enc = tmp_path / "k.keys", tmp_path / "job.siml", tmp_path / "model.enc"
    common = ["--model", "nn-x2", "--optimizer", "sgd", "--epochs", "2"]
    assert (
        runner.invoke(
            main, ["siml", "encode", *common, "--keys-out", str(keys), "--job-out", str(job)]
        ).exit_code
        == 0
    )
    assert runner.invoke(main, ["siml", "serve", str(job), "--out", str(enc)]).exit_code == 0
    res = runner.invoke(
        main,
        [
            "siml",
            "decode",
            "--keys",
            str(keys),
            "--job",
            str(job),
            "--model-in",
            str(enc),
            "--evaluate",
            "digits",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (
        json.loads(res.stdout)["accuracy"] == out["accuracy"]
    )  # same seed: same keys, data order, weights
    again = runner.invoke(main, ["siml", "serve", str(job), "--out", str(enc)])
    assert again.exit_code != 0 and "exists" in again.output


def test_two_party_demo_script(tmp_path):
    """fl_demos/siml_service.py: the service runs in its own process, from the job file alone."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "fl_demos" / "siml_service.py"
    out = subprocess.run(
        [sys.executable, str(script), "--epochs", "2", "--workdir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(out.stdout)
    assert (
        result["max_abs_diff_vs_plain"] <= 1e-9 and result["accuracy"] == result["accuracy_plain"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.siml", "model.enc", "user.keys"]


def test_bench_skips_missing_baselines_with_a_message(monkeypatch, digits):
    import sys

    from immersion_siml.bench import bench_siml

    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "tenseal", None)
    small = dataclasses.replace(digits, x_train=digits.x_train[:200], y_train=digits.y_train[:200])
    out = bench_siml(
        model="nn-x2", dataset=small, plan=TrainingPlan(epochs=1, batch_size=50), repeats=1
    )
    assert out["dpsgd"] == [] and out["ckks"] is None and out["ckks_time_ratio_vs_siml"] is None
    assert len(out["skipped"]) == 2 and all("baselines" in note for note in out["skipped"])
    assert (
        out["siml_max_abs_diff_vs_plain"] <= 1e-9 and out["accuracy_siml"] == out["accuracy_plain"]
    )
    assert [row["sync"] for row in out["siml_by_sync"]] == ["epoch", "batch"]


def test_the_service_can_decode_the_training_set(tmp_path, digits):
    """THREAT_MODEL.md: eq. 44 needs Pi1_left, so whoever holds the job file recovers every
    sample."""
    plan = TrainingPlan(optimizer="sgd", lr=0.05, epochs=1)
    x, y = torch.as_tensor(digits.x_train[:100]), torch.as_tensor(digits.y_train[:100])
    _, job, _ = prepare_job("nn-x2", x, y, plan, design=PrivacyDesign(epsilon_data=0.1), rng=2)
    loaded = load_job(save_job(job, tmp_path / "job.siml"))
    images, targets = loaded.target().decoded_dataset(torch.as_tensor(loaded.encoded_dataset))
    assert float((images - x).abs().max()) < 1e-10
    assert torch.equal(targets.argmax(1), y)
    assert (
        np.abs(loaded.encoded_dataset[:, :64] - digits.x_train[:100].reshape(100, -1)).mean() > 1.0
    )


def test_audit_row_service_decodes_the_training_set():
    from immersion_siml.attacks import run_service_decodes

    rows = run_service_decodes(quick=True)
    assert [r.verdict for r in rows] == ["leaks", "leaks"]
    assert (
        rows[0].value < 1e-10 < 1.0 < rows[0].baseline and rows[0].detail["labels_recovered"] == 1.0
    )
    assert rows[1].value < 1e-9 < rows[1].baseline
