"""``immersion_fl.run`` on modules and data that are not the SDK's: every scheme against a plain
FedAvg written here with ``torch.optim``, round by round, and bad input named."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import immersion_fl  # noqa: E402
from immersion import InvalidArgumentError  # noqa: E402
from torch import nn  # noqa: E402


@pytest.fixture(autouse=True)
def _float64_modules():
    """Modules built in these tests are float64; the default is restored for other test files."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


class TinyConv(nn.Module):
    """A convolutional net with a custom forward (not an nn.Sequential, not an SDK model)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.tanh(self.conv(x)), 2)
        return self.head(h.flatten(1)) + 0.1 * x.mean(dim=(1, 2, 3))[:, None]


class SoftplusMLP(nn.Module):
    def __init__(self, width: int = 12) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, width), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.softplus(self.a(x)))


def _images(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 1, 8, 8))
    y = np.eye(3)[
        (x[:, 0, :4].sum(axis=(1, 2)) > 0).astype(int) + (x[:, 0, 4:].mean(axis=(1, 2)) > 0.3)
    ]
    return x, y


def _tabular(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 5))
    logits = x @ rng.normal(size=(5, 4))
    p = np.exp(logits - logits.max(1, keepdims=True))
    return x, p / p.sum(1, keepdims=True)  # soft labels


def plain_fedavg(
    model: nn.Module,
    data,
    *,
    optimizer: str,
    lr: float,
    rounds: int,
    local_epochs: int,
    batch_size: int,
) -> list[torch.Tensor]:
    """FedAvg written out with torch.optim, in-order batches: the reference (one vector per
    round)."""
    global_model = copy.deepcopy(model)
    sizes = [len(y) for _, y in data]
    history = []
    for _ in range(rounds):
        local_vectors = []
        for x, y in data:
            x, y = torch.as_tensor(x), torch.as_tensor(y)
            local = copy.deepcopy(global_model)
            opt = {
                "sgd": lambda p: torch.optim.SGD(p, lr=lr),
                "momentum": lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9),
                "adam": lambda p: torch.optim.Adam(p, lr=lr, eps=1e-7),
            }[optimizer](local.parameters())
            for _ in range(local_epochs):
                for i in range(0, len(x), batch_size):
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(
                        local(x[i : i + batch_size]), y[i : i + batch_size]
                    )
                    loss.backward()
                    opt.step()
            local_vectors.append(nn.utils.parameters_to_vector(local.parameters()).detach())
        average = sum(n / sum(sizes) * v for n, v in zip(sizes, local_vectors, strict=True))
        nn.utils.vector_to_parameters(average, global_model.parameters())
        history.append(average)
    return history


def _vector(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach()


@pytest.mark.parametrize("scheme", ["fedavg", "sifl-m1", "sifl-m2", "sifl-rm"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_own_modules_decode_to_plain_fedavg(scheme, optimizer):
    rng = np.random.default_rng(7)
    torch.manual_seed(1)
    model = TinyConv().double() if optimizer != "momentum" else SoftplusMLP().double()
    make = _images if optimizer != "momentum" else _tabular
    data = [make(rng, n) for n in (23, 17, 30)]  # last batches are partial
    lr = 0.01 if optimizer == "adam" else 0.1
    before = _vector(model).clone()
    out = immersion_fl.run(
        model,
        data,
        scheme=scheme,
        optimizer=optimizer,
        lr=lr,
        rounds=3,
        local_epochs=2,
        batch_size=8,
        shuffle=False,
        rng=3,
    )
    expected = plain_fedavg(
        model, data, optimizer=optimizer, lr=lr, rounds=3, local_epochs=2, batch_size=8
    )
    assert float((_vector(out.model) - expected[-1]).abs().max()) < 1e-9
    assert type(out.model) is type(model) and torch.equal(
        _vector(model), before
    )  # user's module untouched
    if scheme in ("sifl-m1", "sifl-m2"):
        assert out.privacy["epsilon_local"] == pytest.approx(1.0)


def test_every_round_matches_and_datasets_equal_arrays():
    rng = np.random.default_rng(2)
    data = [_tabular(rng, n) for n in (12, 19)]
    model = SoftplusMLP(6).double()
    as_datasets = [
        torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)) for x, y in data
    ]
    a = immersion_fl.run(
        model,
        data,
        scheme="sifl-m2",
        lr=0.2,
        rounds=4,
        local_epochs=1,
        batch_size=5,
        shuffle=False,
        rng=0,
        compare_plain=True,
        test_data=data[0],
    )
    b = immersion_fl.run(
        model,
        as_datasets,
        scheme="sifl-m2",
        lr=0.2,
        rounds=4,
        local_epochs=1,
        batch_size=5,
        shuffle=False,
        rng=0,
    )
    # float64 rounding of the coded round trip: about 1e-12 here, its last bits vary by BLAS kernel
    assert max(a.history.diff_vs_plain) < 1e-10 and len(a.history.diff_vs_plain) == 4
    assert len(a.history.accuracy) == 4
    assert torch.equal(_vector(a.model), _vector(b.model))


def test_shuffled_batches_are_reproducible_from_rng_and_integer_labels_work():
    rng = np.random.default_rng(4)
    data = [(x, y.argmax(1)) for x, y in (_tabular(rng, 20), _tabular(rng, 20))]
    model = SoftplusMLP().double()
    runs = [
        immersion_fl.run(
            model,
            data,
            scheme="sifl-m1",
            lr=0.1,
            rounds=2,
            local_epochs=1,
            batch_size=6,
            rng=11,
            compare_plain=True,
        )
        for _ in range(2)
    ]
    assert max(runs[0].history.diff_vs_plain) < 1e-12
    assert torch.equal(_vector(runs[0].model), _vector(runs[1].model))


@pytest.mark.parametrize(
    "case",
    [
        "buffers",
        "float32",
        "lengths",
        "test lengths",
        "scheme",
        "option",
        "dense",
        "module",
        "labels",
    ],
)
def test_bad_input_is_refused_by_name(case):
    rng = np.random.default_rng(0)
    model, data, kw = SoftplusMLP().double(), [_tabular(rng, 10), _tabular(rng, 10)], {}
    argument = {
        "buffers": "model",
        "float32": "model",
        "lengths": "client_data",
        "test lengths": "test_data",
        "scheme": "scheme",
        "option": "graph",
        "dense": "keys",
        "module": "model",
        "labels": "client_data",
    }[case]
    if case == "buffers":
        model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)).double()
    elif case == "float32":
        model = SoftplusMLP().float()
    elif case == "lengths":
        data[1] = (data[1][0], data[1][1][:-1])
    elif case == "test lengths":
        kw = {"test_data": (data[0][0], data[0][1][:-1])}
    elif case == "option":
        kw = {"graph": "complete"}  # an MP-DP option given to SIFL
    elif case == "dense":
        model = nn.Sequential(nn.Linear(5, 20_000), nn.Linear(20_000, 4)).double()
        kw = {"keys": "dense"}
    elif case == "module":
        model = lambda x: x  # noqa: E731
    elif case == "labels":
        data[0] = (data[0][0], np.ones((10, 2, 2)))
    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.run(
            model,
            data,
            scheme="sifl-m9" if case == "scheme" else "sifl-m1",
            lr=0.1,
            rounds=1,
            local_epochs=1,
            batch_size=4,
            rng=0,
            **kw,
        )
    assert info.value.argument == argument
    assert not str(info.value).startswith(f"{argument}: {argument}:"), str(info.value)
    if "lengths" in case:
        assert str(info.value).endswith("X has 10 rows but Y has 9"), str(info.value)


class SumHead(nn.Module):
    """One number per sample: not a row of class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).sum(1)


@pytest.mark.parametrize(
    "case, argument, words",
    [
        ("input width", "client_data", "cannot take samples of shape (5,)"),
        ("label range", "client_data", "class index 3, but the model outputs 3 logits"),
        ("row width", "client_data", "Y has 4 columns"),
        ("output shape", "model", "one row of class logits per sample"),
        ("test width", "test_data", "cannot take samples of shape (6,)"),
    ],
)
def test_shapes_that_do_not_fit_are_refused_before_any_round(case, argument, words):
    """One forward pass on two samples, before any round: a module whose input width does not
    fit X, or whose outputs do not fit Y, is refused by name (not left to fail every client)."""
    rng = np.random.default_rng(0)
    data, kw = [_tabular(rng, 10), _tabular(rng, 10)], {}
    model = SoftplusMLP().double()  # 5 inputs, 4 outputs
    if case == "input width":
        model = nn.Sequential(nn.Linear(7, 4)).double()
    elif case == "label range":
        model = nn.Sequential(nn.Linear(5, 3)).double()
        data = [(x, y.argmax(1)) for x, y in data]
        data[1] = (data[1][0], np.full(10, 3))  # classes 0..3 for a 3-logit module
    elif case == "row width":
        model = nn.Sequential(nn.Linear(5, 3)).double()
    elif case == "output shape":
        model = SumHead().double()
    else:
        kw = {"test_data": (rng.normal(size=(4, 6)), np.zeros(4, dtype=int))}
    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.run(
            model,
            data,
            scheme="sifl-m1",
            lr=0.1,
            rounds=1,
            local_epochs=1,
            batch_size=4,
            rng=0,
            **kw,
        )
    assert info.value.argument == argument and words in str(info.value), str(info.value)


def test_reference_drift_is_recorded_every_round_when_asked():
    """reference_drift=True: plain FedAvg against itself summed in reverse order, per round, in
    the history and the summary; the run itself is unchanged. Refused where nothing records it."""
    rng = np.random.default_rng(9)
    data = [_tabular(rng, n) for n in (9, 12, 10)]
    model = SoftplusMLP().double()
    kw = dict(
        optimizer="adam",
        lr=0.01,
        rounds=3,
        local_epochs=1,
        batch_size=4,
        shuffle=False,
        rng=2,
        compare_plain=True,
    )
    drift = immersion_fl.run(model, data, scheme="sifl-m1", reference_drift=True, **kw)
    plain = immersion_fl.run(model, data, scheme="sifl-m1", **kw)
    assert len(drift.history.reference_drift) == 3 and max(drift.history.reference_drift) < 1e-12
    assert drift.summary()["reference_drift_per_round"] == drift.history.reference_drift
    assert plain.history.reference_drift == [] and plain.summary()["reference_drift_max"] is None
    assert torch.equal(_vector(drift.model), _vector(plain.model))
    for scheme, extra in (
        ("sifl-m1", {"compare_plain": False}),
        ("fedavg", {}),
        ("gd-dp", {}),
        ("sifl-m1", {"reference_drift": 1}),
    ):
        args = {**kw, "reference_drift": True, **extra}
        with pytest.raises(InvalidArgumentError) as info:
            immersion_fl.run(model, data, scheme=scheme, **args)
        assert info.value.argument == "reference_drift", (scheme, extra)


def test_mpdp_runs_on_a_users_bias_free_mlp_and_equals_fedsgd_without_noise():
    """Seed 004 covers bias-free ReLU MLPs trained with the MSE to one-hot targets (FedSGD)."""
    rng = np.random.default_rng(5)
    data = [(x, y.argmax(1)) for x, y in (_tabular(rng, 16), _tabular(rng, 16), _tabular(rng, 16))]
    model = nn.Sequential(
        nn.Linear(5, 7, bias=False), nn.ReLU(), nn.Linear(7, 4, bias=False)
    ).double()
    out = immersion_fl.run(
        model,
        data,
        scheme="mpdp",
        lr=0.1,
        rounds=3,
        local_epochs=1,
        batch_size=8,
        rng=2,
        shuffle=False,
        noise="off",
        compare_plain=True,
    )
    assert max(out.history.diff_vs_plain) < 1e-12 and type(out.model) is nn.Sequential
    # plain FedSGD on the MSE, written here: each client one in-order batch per round, unweighted
    # mean
    w = [p.detach().clone() for p in model.parameters()]
    for t in range(3):
        grads = []
        for x, y in data:
            k = t % 2
            xb, yb = (
                torch.as_tensor(x[8 * k : 8 * k + 8]),
                nn.functional.one_hot(torch.as_tensor(y[8 * k : 8 * k + 8]), 4),
            )
            params = [p.clone().requires_grad_(True) for p in w]
            out_b = torch.relu(xb @ params[0].T) @ params[1].T
            loss = 0.5 * ((out_b - yb) ** 2).sum(1).mean()
            grads.append(torch.autograd.grad(loss, params))
        w = [p - 0.1 * sum(g[i] for g in grads) / len(grads) for i, p in enumerate(w)]
    assert float((_vector(out.model) - torch.cat([p.reshape(-1) for p in w])).abs().max()) < 1e-12
    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.run(
            SoftplusMLP().double(),
            data,
            scheme="mpdp",
            lr=0.1,
            rounds=1,
            local_epochs=1,
            batch_size=8,
            rng=0,
        )
    assert info.value.argument == "model" and "bias" in str(info.value)


@pytest.mark.parametrize("scheme", ["sgd-dp", "gsgd-dp", "gd-dp"])
def test_seed_001_schemes_run_on_a_users_module_and_equal_their_noise_free_reference(scheme):
    rng = np.random.default_rng(6)
    data = [_tabular(rng, 12) for _ in range(3)]
    model = SoftplusMLP(5).double()
    out = immersion_fl.run(
        model,
        data,
        scheme=scheme,
        lr=0.2,
        rounds=2,
        local_epochs=1,
        batch_size=4,
        rng=1,
        noise="off",
        grad_clip=1e6,
        test_data=data[0],
    )
    assert max(out.history.diff_vs_plain) == 0.0 and len(out.history.accuracy) == 2
    if (
        scheme == "gd-dp"
    ):  # full clipped gradients (the clip never binds): plain FedSGD on the mean CE
        w = _vector(model).clone()
        from immersion_fl.runtime.models import FlatModel

        fm = FlatModel(copy.deepcopy(model))
        for _ in range(2):
            g = (
                sum(fm.loss_and_grad(w, torch.as_tensor(x), torch.as_tensor(y))[1] for x, y in data)
                / 3
            )
            w = w - 0.2 * g
        assert float((_vector(out.model) - w).abs().max()) < 1e-12
    uneven = [data[0], (data[1][0][:-1], data[1][1][:-1])]
    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.run(
            model, uneven, scheme=scheme, lr=0.1, rounds=1, local_epochs=1, batch_size=4, rng=0
        )
    assert info.value.argument == "client_data"


USER_MODULE = """
import numpy as np
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def load():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 6))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    return x[:72], y[:72], x[72:], y[72:]


def wide():
    return nn.Sequential(nn.Linear(7, 3)).double()


def uneven():
    x, y, _, _ = load()
    return x, y[:-1]
"""


def test_the_cli_takes_a_users_model_and_dataset_as_import_paths(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner
    from immersion.cli.main import main

    (tmp_path / "user_fl_code.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)  # importable from the current folder, as with python -m
    args = [
        "fl",
        "run",
        "--scheme",
        "sifl-m1",
        "--model",
        "user_fl_code:build",
        "--dataset",
        "user_fl_code:load",
        "--clients",
        "3",
        "--rounds",
        "3",
        "--json",
    ]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    assert out["model"] == "user_fl_code:build" and out["n_params"] == 6 * 5 + 5 + 5 * 3 + 3
    assert out["max_abs_diff_vs_plain"] < 1e-12 and len(out["accuracy_per_round"]) == 3
    again = json.loads(CliRunner().invoke(main, args).stdout)  # seeded: the same run
    assert again["accuracy_per_round"] == out["accuracy_per_round"]
    folder = tmp_path / "ckpt"
    stop = CliRunner().invoke(main, args[:-1] + ["--checkpoint", str(folder), "--json"])
    assert stop.exit_code == 0, stop.output
    resumed = CliRunner().invoke(
        main, args[:-1] + ["--checkpoint", str(folder), "--resume", "--json"]
    )
    assert json.loads(resumed.stdout)["accuracy_per_round"] == out["accuracy_per_round"]
    bad = CliRunner().invoke(
        main, ["fl", "run", "--model", "user_fl_code:missing", "--rounds", "1"]
    )
    assert bad.exit_code != 0 and "model" in bad.output and "missing" in bad.output


@pytest.mark.parametrize(
    "model, dataset, extra, named",
    [
        ("user_fl_code:wide", "user_fl_code:load", [], "dataset"),  # 7 inputs for 6 features
        ("user_fl_code:missing", "user_fl_code:load", [], "model"),
        ("user_fl_code:build", "user_fl_code:absent", [], "dataset"),
        ("user_fl_code:build", "digits", [], "dataset"),  # 64 pixels for a 6-feature module
        (
            "user_fl_code:build",
            "user_fl_code:uneven",
            [],
            "Error: dataset: user_fl_code:uneven: X has 72 rows but Y has 71",
        ),
        (  # round 0 fails on every client
            "user_fl_code:build",
            "user_fl_code:load",
            ["--inject-fault", "0:0:raise", "--inject-fault", "1:0:raise"],
            "every client failed",
        ),
    ],
)
def test_cli_bad_input_leaves_nothing_on_disk(tmp_path, monkeypatch, model, dataset, extra, named):
    """A run refused before its first round ends writes neither the --checkpoint folder nor
    the --plot folder."""
    from click.testing import CliRunner
    from immersion.cli.main import main

    (tmp_path / "user_fl_code.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    args = ["fl", "run", "--model", model, "--dataset", dataset, "--clients", "2"]
    args += ["--rounds", "2", "--checkpoint", str(work / "ckpt"), "--plot", str(work / "plots")]
    res = CliRunner().invoke(main, args + extra)
    assert res.exit_code != 0, res.output
    last = res.output.strip().splitlines()[-1]
    assert named in last, res.output
    fields = last.removeprefix("Error: ").split(": ")
    assert fields[0] != fields[1], last  # the argument is named once
    assert list(work.iterdir()) == []


def test_a_device_torch_cannot_use_is_refused_by_name():
    rng = np.random.default_rng(0)
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(InvalidArgumentError) as info:
        immersion_fl.run(
            SoftplusMLP().double(),
            [_tabular(rng, 8)],
            scheme="sifl-m1",
            lr=0.1,
            rounds=1,
            local_epochs=1,
            batch_size=4,
            rng=0,
            device="cuda",
        )
    assert info.value.argument == "device"


@pytest.mark.slow
def test_the_flower_engine_runs_a_users_module_like_the_local_engine():
    """engine="flower" (Flower's simulation runtime) on a module and data of this file: the same
    decoded model as engine="local", and FedAvg every round."""
    pytest.importorskip("flwr")
    rng = np.random.default_rng(8)
    data = [_tabular(rng, n) for n in (14, 11)]
    model = SoftplusMLP(6).double()
    kw = dict(
        scheme="sifl-m1",
        lr=0.1,
        rounds=2,
        local_epochs=1,
        batch_size=5,
        shuffle=False,
        rng=4,
        compare_plain=True,
        reference_drift=True,
    )
    local = immersion_fl.run(model, data, engine="local", **kw)
    flower = immersion_fl.run(model, data, engine="flower", **kw)
    assert type(flower.model) is SoftplusMLP
    assert len(flower.history.diff_vs_plain) == 2 and max(flower.history.diff_vs_plain) < 1e-9
    assert float((_vector(flower.model) - _vector(local.model)).abs().max()) < 1e-9
    # the reference drift is recorded on Flower too (the one-step error is the local engine's)
    assert len(flower.history.reference_drift) == 2 and max(flower.history.reference_drift) < 1e-9
    assert len(local.history.one_step_error) == 2 and flower.history.one_step_error == []


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2"])
def test_cuda_runs_decode_to_the_cpu_run(scheme):
    rng = np.random.default_rng(3)
    data = [_images(rng, n) for n in (40, 30)]
    model = TinyConv().double()
    kw = dict(
        scheme=scheme,
        lr=0.05,
        rounds=3,
        local_epochs=1,
        batch_size=16,
        shuffle=False,
        rng=1,
        compare_plain=True,
    )
    cpu = immersion_fl.run(model, data, **kw)
    gpu = immersion_fl.run(model, data, device="cuda", **kw)
    assert max(gpu.history.diff_vs_plain) < 1e-9
    assert float((_vector(gpu.model).cpu() - _vector(cpu.model)).abs().max()) < 1e-9
