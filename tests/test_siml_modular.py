"""SIML in exact integer arithmetic modulo 2^64 (issue 16): ``arithmetic="modular"``.

The reference of exactness is the fixed-point twin: plain training without keys on the same
fixed-point values, rounded where the service rounds (dataset and initial state once, every
target step's change, the returned model). The decoded model must equal it bit for bit, epoch by
epoch, for every optimizer and both sync modes; its distance to float training is reported.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from immersion import InvalidArgumentError, Keys, load_keys, save_keys  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion.coding.target import TargetAlgorithm  # noqa: E402
from immersion.coding.target_codes import TargetCodes  # noqa: E402
from immersion.integer import quantisation_step  # noqa: E402
from immersion.keys import ModularKeys  # noqa: E402
from immersion_siml import train  # noqa: E402
from immersion_siml.dynamics import TrainingPlan  # noqa: E402
from immersion_siml.job import (  # noqa: E402
    PrivacyDesign,
    decode_model,
    key_holder,
    load_encoded_model,
    load_job,
    prepare_job,
    save_encoded_model,
    save_job,
)
from immersion_siml.references import plain_training  # noqa: E402


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    ).double()


def _data(n: int = 48, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, dtype=torch.float64, generator=gen)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0).long()


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().numpy().tobytes()


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("sync", ["epoch", "batch"])
def test_decoded_model_is_the_fixed_point_twin_bit_for_bit(optimizer: str, sync: str) -> None:
    net, (X, Y) = _net(), _data()
    lr = 0.01 if optimizer == "adam" else 0.1
    out = train(
        net,
        X,
        Y,
        optimizer=optimizer,
        lr=lr,
        epochs=3,
        batch_size=16,
        sync=sync,
        rng=3,
        compare_plain=True,
        arithmetic="modular",
        fraction_bits=24,
    )
    assert out.max_abs_diff_vs_plain == 0.0
    assert [row["max_abs_diff_vs_plain"] for row in out.history] == [0.0, 0.0, 0.0]
    assert out.epsilon_data == 0.0 and out.epsilon_model == 0.0
    assert out.privacy["arithmetic"] == "modular" and out.privacy["fraction_bits"] == 24
    # the twin rebuilt here, independently of train(): same plan, same quantisation points
    w0 = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    dynamics = _dynamics(net, optimizer, lr)
    from immersion_siml.target import SampleLayout

    twin = plain_training(
        dynamics,
        dynamics.initial_state(w0),
        X,
        torch.nn.functional.one_hot(Y, 3).double(),
        out.plan,
        layout=SampleLayout((4,), 3),
        fraction_bits=24,
    )
    assert _bits(out.weights) == _bits(twin)
    decoded = torch.nn.utils.parameters_to_vector(out.model.parameters()).detach()
    assert _bits(decoded) == _bits(twin)
    # quantisation carried through training: not zero, far below the weights' scale
    assert 0.0 < out.max_abs_diff_vs_float_plain < 1e-4
    assert out.max_abs_diff_vs_float_plain >= quantisation_step(24) / 2


def _dynamics(net: torch.nn.Module, optimizer: str, lr: float):  # type: ignore[no-untyped-def]
    from immersion_siml.job import plan_dynamics
    from immersion_siml.models import SimlModel

    return plan_dynamics(SimlModel(net, loss="cross_entropy"), TrainingPlan(optimizer, lr))


def test_job_files_round_trip_and_decode_exactly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    X, Y = _data()
    plan = TrainingPlan(optimizer="adam", lr=0.01, epochs=2, batch_size=16, order_seed=4)
    design = PrivacyDesign(arithmetic="modular", fraction_bits=30, keys="block", block_size=8)
    user, job, x0 = prepare_job("nn-x2", X.reshape(-1, 1, 2, 2), Y, plan, design=design, rng=5)
    assert isinstance(user.keys, ModularKeys)
    assert job.encoded_dataset.dtype == np.uint64 and job.encoded_state.dtype == np.uint64
    save_job(job, tmp_path / "job")
    save_keys(user.keys, tmp_path / "keys")
    loaded = load_job(tmp_path / "job")
    assert loaded.fraction_bits == 30
    assert np.array_equal(loaded.encoded_dataset, job.encoded_dataset)
    service = loaded.target()
    encoded_model, _ = service.train(loaded.encoded_state, loaded.encoded_dataset, loaded.plan)
    save_encoded_model(encoded_model, tmp_path / "model", info={})
    answer, _ = load_encoded_model(tmp_path / "model")
    assert answer.dtype == np.uint64
    holder = key_holder(load_keys(tmp_path / "keys"), loaded)
    w = decode_model(holder, answer, loaded.encoded_dataset[0])
    dynamics = service.dynamics
    twin = plain_training(
        dynamics,
        x0,
        *service.layout.split(service.layout.rows(X.reshape(-1, 1, 2, 2), _one_hot(Y))),
        plan,
        layout=service.layout,
        fraction_bits=30,
    )
    assert _bits(w) == _bits(twin)
    # float keys cannot decode a modular job
    with pytest.raises(InvalidArgumentError, match="^keys: "):
        key_holder(Keys.draw(n_state=2, n_input=1, n_output=1, rng=0), loaded)


def _one_hot(Y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(Y, 3).double()


def test_encoded_entries_do_not_follow_the_data() -> None:
    """Uniform modulo 2^64 whatever the data: two very different datasets give encoded entries
    whose top bits are spread over all 16 values (chi-square, 15 degrees of freedom)."""
    X, Y = _data(n=400)
    plan = TrainingPlan(optimizer="sgd", lr=0.1, epochs=1, batch_size=400)
    design = PrivacyDesign(arithmetic="modular")
    for scale in (0.0, 1000.0):
        _, job, _ = prepare_job("nn-x2", scale * X.reshape(-1, 1, 2, 2), Y, plan, design=design)
        top = (job.encoded_dataset[:, 0] >> np.uint64(60)).astype(np.int64)
        counts = np.bincount(top, minlength=16)
        chi2 = float(((counts - 25.0) ** 2 / 25.0).sum())
        assert chi2 < 37.7  # the 0.999 quantile of chi-square with 15 degrees of freedom


def test_range_refusals_name_the_signal() -> None:
    net, (X, Y) = _net(), _data()
    common = dict(lr=0.1, epochs=1, batch_size=16, rng=0, arithmetic="modular")
    with pytest.raises(
        InvalidArgumentError, match=r"^X: \|X\| reaches .* below 2.14748e\+09 \(2\^31\)"
    ):
        train(net, X * 1e9 + 3e9, Y, **common)
    with pytest.raises(InvalidArgumentError, match=r"^Y: \|Y\| reaches"):
        train(net, X, torch.full((48, 3), 10.0, dtype=torch.float64), loss="mse", **common,
              fraction_bits=60)  # fmt: skip
    big = _net()
    with torch.no_grad():
        big[0].weight.fill_(20.0)
    with pytest.raises(InvalidArgumentError, match=r"^model: \|model\| reaches 20"):
        train(big, X, Y, **common, fraction_bits=60)
    with pytest.raises(InvalidArgumentError, match="^state: the optimizer state"):
        train(net, X, torch.full((48, 3), 3.0, dtype=torch.float64), loss="mse",
              **{**common, "lr": 50.0}, fraction_bits=59)  # fmt: skip


def test_design_options_of_the_other_arithmetic_are_refused() -> None:
    net, (X, Y) = _net(), _data()
    with pytest.raises(InvalidArgumentError, match="^fraction_bits: applies to arithmetic"):
        train(net, X, Y, lr=0.1, epochs=1, batch_size=16, fraction_bits=20)
    with pytest.raises(InvalidArgumentError, match="^epsilon_data: applies to arithmetic='float'"):
        train(net, X, Y, lr=0.1, epochs=1, batch_size=16, arithmetic="modular", epsilon_data=2.0)
    with pytest.raises(InvalidArgumentError, match="^arithmetic: "):
        train(net, X, Y, lr=0.1, epochs=1, batch_size=16, arithmetic="integer")
    with pytest.raises(InvalidArgumentError, match="^fraction_bits: "):
        PrivacyDesign(arithmetic="modular", fraction_bits=70)


def test_cli_run_modular_reports_exactness_and_the_float_distance() -> None:
    result = CliRunner().invoke(
        main,
        "siml run --arithmetic modular --fraction-bits 28 --model nn-x2 --optimizer adam "
        "--epochs 2 --json".split(),
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["max_abs_diff_vs_plain"] == 0.0 and out["max_abs_diff_per_epoch"] == [0.0, 0.0]
    assert out["epsilon_data"] == 0.0 and out["epsilon_model"] == 0.0
    assert out["arithmetic"] == "modular" and out["quantisation_step"] == 2.0**-28
    assert 0.0 < out["max_abs_diff_vs_float_plain"] < 1e-4
    refused = CliRunner().invoke(
        main, "siml run --arithmetic modular --epsilon-model 2 --epochs 1 --json".split()
    )
    assert refused.exit_code == 2 and "--epsilon-model applies to --arithmetic float" in (
        refused.output
    )


def test_one_target_codes_object_serves_every_target() -> None:
    """TargetAlgorithm, ModularTarget and SIML's TargetOptimizer hold one TargetCodes each, built
    by the same factories, and the target optimizer decodes what the user encoded."""
    from immersion import immerse

    imm = immerse(lambda x, y: x + y, lambda x, y: x, n_state=2, n_input=2, n_output=2, rng=0)
    assert isinstance(imm.target, TargetAlgorithm) and isinstance(imm.target.codes, TargetCodes)
    mod = immerse(
        lambda x, y: x + y,
        lambda x, y: x,
        n_state=2,
        n_input=2,
        n_output=2,
        rng=0,
        arithmetic="modular",
    )
    assert isinstance(mod.target.codes, TargetCodes)
    X, Y = _data()
    plan = TrainingPlan(optimizer="sgd", lr=0.1, epochs=1, batch_size=16)
    for design in (PrivacyDesign(), PrivacyDesign(arithmetic="modular")):
        user, job, x0 = prepare_job("nn-x2", X.reshape(-1, 1, 2, 2), Y, plan, design=design)
        service = user.target
        assert isinstance(service.codes, TargetCodes)
        state = service.decoded_state(
            torch.as_tensor(job.encoded_state)
            if design.arithmetic == "float"
            else job.encoded_state
        )
        assert float((state - x0).abs().max()) <= 2.0**-32 + 1e-9
