"""SIFL in exact integer arithmetic (issue 16): bit-identical to FedAvg on the same fixed-point
values, round by round, on every engine; epsilon 0; refusals named. And what exactness means in
float mode: the one-step error and the reference drift."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import immersion_fl  # noqa: E402
from immersion import InvalidArgumentError  # noqa: E402
from immersion_fl.config import RunConfig  # noqa: E402
from immersion_fl.runtime.engine import Server, run_federated, task_from_config  # noqa: E402
from immersion_fl.schemes import SiflOptions  # noqa: E402
from immersion_fl.schemes.modular import FixedPointFedAvg, round_div  # noqa: E402

SIFL = ["sifl-m1", "sifl-m2", "sifl-rm"]


def _cfg(scheme: str, **kw) -> RunConfig:
    base = dict(
        scheme=scheme,
        hidden=(12,),
        clients=4,
        rounds=4,
        batch_size=64,
        seed=5,
        arithmetic="modular",
    )
    base.update(kw)
    return RunConfig.from_flat(base)


@pytest.mark.parametrize("scheme", SIFL)
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_modular_schemes_equal_the_fixed_point_twin_bit_for_bit(scheme, optimizer):
    result = run_federated(
        _cfg(scheme, optimizer=optimizer, lr=0.01 if optimizer == "adam" else 0.05)
    )
    assert result.diff_vs_plain == [0.0] * 4  # exactly: the same integers every round
    assert result.accuracy == result.accuracy_plain
    assert 0 < max(result.diff_vs_float_plain) < 1e-6  # quantisation (step 2^-32) carried along
    assert result.privacy["epsilon_local"] == 0.0 and result.privacy["arithmetic"] == "modular"


@pytest.mark.parametrize("scheme", SIFL)
def test_the_aggregate_does_not_depend_on_the_order_of_uploads(scheme):
    cfg = _cfg(scheme, rounds=1)
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    received = server.scheme.broadcast(0)
    uploads = [server.scheme.client_upload(c, received, 0) for c in clients]
    sizes = task.sizes
    orders = [list(range(4)), [3, 1, 0, 2], [2, 3, 1, 0]]
    totals = [
        server.scheme.weighted_sum([uploads[i] for i in o], [sizes[i] for i in o]) for o in orders
    ]
    assert all(np.array_equal(totals[0], t) for t in totals[1:])
    assert all(u.dtype == np.uint64 for u in uploads)


def test_broadcast_elements_are_uniform_modulo_2_64():
    """Every element of an encoding is uniform whatever the model (keys with odd noise rows):
    chi-square on the top 4 bits of one element over 4,000 fresh broadcasts of the same model."""
    from scipy.stats import chisquare

    cfg = _cfg("sifl-m1", rounds=1)
    task = task_from_config(cfg)
    scheme = Server.create(cfg, task, task.sizes).scheme
    words = np.array([scheme.broadcast(0).encoded[[0, 7]] for _ in range(4000)])
    for column in words.T:
        counts = np.bincount((column >> np.uint64(60)).astype(int), minlength=16)
        assert chisquare(counts).pvalue > 1e-4


@pytest.mark.files
def test_a_modular_checkpoint_resumes_to_the_same_integers(tmp_path):
    cfg = _cfg("sifl-m2", rounds=3)
    full = run_federated(cfg)
    run_federated(cfg, checkpoint=tmp_path / "ck", stop_after=2)
    resumed = run_federated(cfg, checkpoint=tmp_path / "ck", resume=True)
    assert torch.equal(resumed.final_model, full.final_model)
    assert resumed.diff_vs_plain == [0.0] * 3


@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2", "sifl-rm"])
def test_the_python_api_takes_modular_arithmetic(scheme):
    rng = np.random.default_rng(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    ).double()
    data = [(rng.normal(size=(n, 5)), rng.integers(0, 3, n)) for n in (20, 33)]
    out = immersion_fl.run(
        net,
        data,
        scheme=scheme,
        lr=0.1,
        rounds=3,
        local_epochs=2,
        batch_size=8,
        rng=1,
        compare_plain=True,
        arithmetic="modular",
        fraction_bits=40,
        keys="dense",
    )
    assert out.history.diff_vs_plain == [0.0] * 3
    assert out.privacy["quantisation_step"] == 2.0**-40


@pytest.mark.parametrize(
    "bad,name",
    [
        (dict(noise="gaussian"), "noise"),
        (dict(epsilon_local=2.0), "epsilon_local"),
        (dict(client_noise=True), "client_noise"),
        (dict(fraction_bits=70), "fraction_bits"),
        (dict(arithmetic="decimal"), "arithmetic"),
    ],
)
def test_float_only_options_are_refused_under_modular_arithmetic(bad, name):
    with pytest.raises(InvalidArgumentError) as info:
        SiflOptions(**{"arithmetic": "modular", **bad})
    assert info.value.argument == name


def test_sums_that_could_wrap_are_refused_by_name():
    with pytest.raises(InvalidArgumentError) as info:
        run_federated(_cfg("sifl-m1", rounds=1, clip=1e9, fraction_bits=40))
    assert info.value.argument == "clip"


def test_the_flower_wrapper_refuses_modular_arithmetic():
    pytest.importorskip("flwr")
    from flwr.serverapp.strategy import FedAvg

    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.SiflStrategy(FedAvg(), "sifl-m1", arithmetic="modular")
    assert info.value.argument == "arithmetic"


def test_round_div_rounds_to_nearest_in_integers():
    values = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7, 2**61], dtype=np.int64)
    expected = [int(np.floor(v / 4 + 0.5)) for v in values[:-1]] + [2**59]
    assert round_div(values, 4).tolist() == expected


def test_fixed_point_fedavg_is_fedavg_on_quantised_models():
    twin = FixedPointFedAvg(20)
    twin.setup(torch.tensor([0.1, -0.2], dtype=torch.float64))
    q = [np.array([2**20, -(2**20)], dtype=np.int64).view(np.uint64), np.zeros(2, dtype=np.uint64)]
    twin.server_update(twin.aggregate(q, [3, 1]))
    assert twin.global_model().tolist() == [0.75, -0.75]


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2", "sifl-rm"])
def test_the_flower_engine_equals_the_local_engine_bit_for_bit(scheme):
    pytest.importorskip("flwr")
    cfg = _cfg(scheme, clients=3, rounds=2)
    local, flower = run_federated(cfg), run_federated(cfg, engine="flower")
    assert flower.diff_vs_plain == [0.0, 0.0]
    assert torch.equal(local.final_model, flower.final_model)


def test_float_runs_report_the_one_step_error_and_the_reference_drift():
    cfg = RunConfig.from_flat(
        dict(scheme="sifl-m1", optimizer="adam", lr=0.01, hidden=(12,), clients=4, rounds=3, seed=5)
    )
    result = run_federated(cfg, reference_drift=True)
    assert len(result.one_step_error) == 3 and max(result.one_step_error) < 1e-12
    assert len(result.reference_drift) == 3 and max(result.reference_drift) < 1e-12
    summary = result.summary()
    assert summary["one_step_error_max"] == max(result.one_step_error)
    assert summary["arithmetic"] == "float" and summary["max_abs_diff_vs_float_fedavg"] is None


def test_the_cli_prints_the_exactness_figures():
    from click.testing import CliRunner
    from immersion.cli.main import main

    args = ["fl", "run", "--scheme", "sifl-rm", "--clients", "3", "--rounds", "2", "--hidden", "8"]
    modular = CliRunner().invoke(main, args + ["--arithmetic", "modular", "--json"])
    assert modular.exit_code == 0, modular.output
    out = json.loads(modular.stdout)
    assert out["max_abs_diff_vs_plain"] == 0.0 and out["max_abs_diff_vs_float_fedavg"] > 0
    text = CliRunner().invoke(main, args)
    assert (
        text.exit_code == 0 and "reference_drift" in text.output and "one_step_error" in text.output
    )
