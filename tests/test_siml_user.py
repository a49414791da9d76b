"""SIML on the user's own module and data (issue 13): ``immersion_siml.train``, the CLI with import
paths, job files of version 2 and the version-1 files written before them.

The reference is always a plain loop written here: the user's ``nn.Module`` called directly,
``torch.nn.functional`` losses and ``torch.optim`` optimizers, in-order or the plan's batches.
"""

from __future__ import annotations

import copy
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from immersion import InvalidArgumentError, NonFiniteError, load_keys  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion_fl.runtime.data import load_digits_dataset  # noqa: E402
from immersion_siml import train  # noqa: E402
from immersion_siml.job import (  # noqa: E402
    JOB_MAGIC,
    PrivacyDesign,
    SimlFileError,
    decode_model,
    key_holder,
    load_job,
    prepare_job,
    save_job,
)

F = torch.nn.functional
LEGACY = Path(__file__).parent / "data" / "legacy"


# ------------------------------------------------------------------ the user's own modules


class SmallCnn(torch.nn.Module):
    """A small CNN with a custom forward (skip connection, average pooling, scaled tanh)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        h = h + 0.5 * torch.tanh(self.conv2(h))
        return self.head(F.avg_pool2d(h, 2).flatten(1))


class OddMlp(torch.nn.Module):
    """An MLP with a non-standard activation, a LayerNorm (parameters, no buffers) and a loose
    parameter of its own."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(n_in, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.fc2 = torch.nn.Linear(24, n_out)
        self.temperature = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        h = self.norm(self.fc1(x.flatten(1)))
        h = h * torch.sigmoid(1.7 * h) + 0.1 * torch.sin(h)  # neither ReLU nor anything built in
        return self.fc2(h) / self.temperature


def _digits(n: int = 96):
    data = load_digits_dataset()
    return data.x_train[:n], data.y_train[:n]


def _wine():
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    return (x - x.mean(0)) / x.std(0), y


CASES = {
    "cnn-digits": (lambda: SmallCnn(), _digits),
    "mlp-digits": (lambda: OddMlp(64, 10), _digits),
    "mlp-wine": (lambda: OddMlp(13, 3), _wine),
}


def _module(case: str, seed: int = 0):
    torch.manual_seed(seed)
    return CASES[case][0]().double()


def plain_training(module, x, y_rows, batches, *, optimizer, lr, loss="cross_entropy"):
    """The user's plain loop: the module itself, torch's loss and optimizer, the given batches."""
    module = copy.deepcopy(module)
    x, y_rows = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y_rows)
    opt = (
        torch.optim.Adam(module.parameters(), lr=lr, eps=1e-7)  # Keras' eps, as SIML's adam
        if optimizer == "adam"
        else torch.optim.SGD(module.parameters(), lr=lr)
    )
    loss_fn = F.mse_loss if loss == "mse" else F.cross_entropy  # cross_entropy: probability rows
    for epoch in batches:
        for idx in epoch:
            opt.zero_grad()
            loss_fn(module(x[idx]), y_rows[idx]).backward()
            opt.step()
    return module


def in_order(n: int, batch_size: int, epochs: int) -> list[list[np.ndarray]]:
    return [
        [np.arange(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]
        for _ in range(epochs)
    ]


def max_param_diff(a, b) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max(float((p - q).detach().abs().max()) for p, q in pairs)


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.1), ("adam", 0.001)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_decoded_module_equals_plain_training(case, optimizer, lr, shuffle):
    """Measured: SGD 4e-12 to 7e-12, Adam (lr 0.001, the paper's) 2e-12 to 9e-11. Adam at lr 0.01
    reaches 8e-10 after 2 epochs on digits: a decoded always-zero pixel carries rounding of
    ~1e-16, and Adam turns its ~1e-15 gradient into steps of ``lr x 1e-8`` (README, SIML)."""
    x, y = CASES[case][1]()
    net = _module(case)
    before = copy.deepcopy(net.state_dict())
    epochs, batch_size = 2, 20  # 96 and 178 samples: the last batch of each epoch is short
    out = train(
        net,
        x,
        y,
        optimizer=optimizer,
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        shuffle=shuffle,
        rng=7,
    )
    if shuffle:
        batches = out.plan.batches(len(x))
        for epoch in batches:  # every epoch is a permutation of all samples ...
            assert sorted(np.concatenate(epoch).tolist()) == list(range(len(x)))
        assert not np.array_equal(np.concatenate(batches[0]), np.concatenate(batches[1]))
    else:
        batches = in_order(len(x), batch_size, epochs)
        assert [[b.tolist() for b in e] for e in out.plan.batches(len(x))] == [
            [b.tolist() for b in e] for e in batches
        ]
    y_rows = F.one_hot(torch.as_tensor(y)).double()
    plain = plain_training(net, x, y_rows, batches, optimizer=optimizer, lr=lr)
    assert type(out.model) is type(net) and out.model is not net
    assert max_param_diff(out.model, plain) <= 1e-9
    assert max_param_diff(plain, net) > 1e-3  # it trained
    for name, value in net.state_dict().items():  # the user's module is untouched
        assert torch.equal(value, before[name])
    assert [row["epoch"] for row in out.history] == [1, 2]
    assert all(np.isfinite(row["loss"]) for row in out.history)


def test_batch_sync_momentum_and_compare_plain():
    x, y = _wine()
    net = _module("mlp-wine", seed=3)
    out = train(
        net,
        x,
        y,
        optimizer="momentum",
        lr=0.05,
        epochs=3,
        batch_size=32,
        shuffle=False,
        sync="batch",
        rng=1,
        compare_plain=True,
    )
    assert out.plan.sync == "batch" and out.plan.optimizer == "momentum"
    assert out.max_abs_diff_vs_plain <= 1e-9
    assert all(row["max_abs_diff_vs_plain"] <= 1e-9 for row in out.history)
    mine = copy.deepcopy(net)  # torch's SGD with momentum 0.9 is the heavy ball SIML runs
    opt = torch.optim.SGD(mine.parameters(), lr=0.05, momentum=0.9)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    for epoch in in_order(len(x), 32, 3):
        for idx in epoch:
            opt.zero_grad()
            F.cross_entropy(mine(xt[idx]), yt[idx]).backward()
            opt.step()
    assert max_param_diff(out.model, mine) <= 1e-9
    summary = out.summary()
    json.dumps(summary)
    assert summary["epsilon_data"] == out.epsilon_data and "model" not in summary


def test_mse_regression_on_tabular_data():
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    x, y = x[:120] * 10, (y[:120] - y.mean()) / y.std()  # a real-valued target vector
    torch.manual_seed(2)
    net = torch.nn.Sequential(
        torch.nn.Linear(10, 16), torch.nn.Softplus(), torch.nn.Linear(16, 1)
    ).double()
    out = train(net, x, y, loss="mse", lr=0.05, epochs=3, batch_size=25, shuffle=False, rng=0)
    plain = plain_training(
        net,
        x,
        torch.as_tensor(y).reshape(-1, 1),
        in_order(120, 25, 3),
        optimizer="sgd",
        lr=0.05,
        loss="mse",
    )
    assert max_param_diff(out.model, plain) <= 1e-9
    assert out.history[-1]["loss"] < out.history[0]["loss"]


class SequenceNet(torch.nn.Module):
    """Samples of shape (T, F) = (6, 3): a shared step map, averaged over time."""

    def __init__(self) -> None:
        super().__init__()
        self.step = torch.nn.Linear(3, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.tanh(self.step(x)).mean(dim=1))


class ScalarNet(torch.nn.Module):
    """One number per sample: X has shape (N,)."""

    def __init__(self) -> None:
        super().__init__()
        self.lift = torch.nn.Linear(1, 6)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.sin(self.lift(x.unsqueeze(1))))


@pytest.mark.parametrize("net_class,shape", [(SequenceNet, (6, 3)), (ScalarNet, ())])
def test_any_feature_shape(net_class, shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, *shape))
    y = rng.dirichlet(np.ones(4 if shape else 2), size=50)  # soft labels: probability rows
    torch.manual_seed(1)
    net = net_class().double()
    out = train(net, x, y, lr=0.2, epochs=2, batch_size=12, shuffle=False, rng=0)
    assert out.n_sample == int(np.prod(shape)) + y.shape[1]
    plain = plain_training(net, x, torch.as_tensor(y), in_order(50, 12, 2), optimizer="sgd", lr=0.2)
    assert max_param_diff(out.model, plain) <= 1e-9
    assert max_param_diff(plain, net) > 1e-3


def test_privacy_design_options_and_figures():
    x, y = _wine()
    net = _module("mlp-wine")
    out = train(
        net,
        x,
        y,
        lr=0.1,
        epochs=1,
        batch_size=64,
        rng=0,
        epsilon_data=0.5,
        epsilon_model=2.0,
        keys="block",
        block_size=16,
        extra_data=10,
    )
    assert out.epsilon_data == pytest.approx(0.5, rel=1e-9)
    assert out.epsilon_model == pytest.approx(2.0, rel=1e-9)
    assert out.n_sample == 13 + 3 and out.n_sample_encoded == 16 + 10
    assert out.privacy["epsilon_data_proven"] >= out.epsilon_data
    assert 0 < out.decode_error_estimate < 1e-6


# ------------------------------------------------------------------ bad input


def test_bad_input_is_refused_naming_the_argument():
    x, y = _wine()
    net = _module("mlp-wine")
    ok = dict(lr=0.1, epochs=1, batch_size=16, rng=0)

    def refused(argument, model=net, X=x, Y=y, **options):
        with pytest.raises(InvalidArgumentError) as info:
            train(model, X, Y, **{**ok, **options})
        assert info.value.argument == argument, info.value
        return str(info.value)

    bn = torch.nn.Sequential(torch.nn.Linear(13, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
    assert "buffers" in refused("model", model=bn.double())
    assert "float64" in refused("model", model=OddMlp(13, 3).float())  # float32
    drop = torch.nn.Sequential(torch.nn.Linear(13, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 3))
    assert "dropout" in refused("model", model=drop.double())
    refused("model", model="not a module")
    assert "177" in refused("Y", Y=y[:-1])
    refused("Y", Y=np.eye(4)[y])  # 4 columns, the model has 3 outputs
    refused("Y", Y=y.astype(float) + 0.5)  # a real vector is not class labels
    refused("Y", Y=-np.eye(3)[y])  # negative "probabilities"
    bad_x = x.copy()
    bad_x[3, 2] = np.nan
    with pytest.raises(NonFiniteError, match="X"):
        train(net, bad_x, y, **ok)
    refused("X", X=x[:, :5])  # the module cannot take 5 features
    refused("loss", loss="hinge")
    refused("optimizer", optimizer="rmsprop")
    refused("lr", lr=-1.0)
    refused("shuffle", shuffle="yes")
    refused("sync", sync="step")
    refused("epsilon", epsilon=0.5)  # unknown design option
    refused("epsilon_data", epsilon_data=0.0)
    refused("keys", keys="sparse")


def test_dense_keys_too_large_are_refused_naming_keys():
    torch.manual_seed(0)
    big = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 300), torch.nn.Linear(300, 10)
    ).double()
    x, y = _digits(20)
    with pytest.raises(InvalidArgumentError, match="GiB") as info:
        train(big, x, y, optimizer="adam", lr=0.01, epochs=1, batch_size=10, rng=0, keys="dense")
    assert info.value.argument == "keys"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_a_device_torch_cannot_use_is_refused():
    x, y = _wine()
    with pytest.raises(InvalidArgumentError) as info:
        train(_module("mlp-wine"), x, y, lr=0.1, epochs=1, batch_size=16, device="cuda")
    assert info.value.argument == "device"


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.1), ("adam", 0.01)])
def test_cuda_training_equals_cpu_training(optimizer, lr):
    x, y = _digits()
    net = _module("cnn-digits")
    options = dict(optimizer=optimizer, lr=lr, epochs=2, batch_size=20, rng=4)
    on_gpu = train(net, x, y, device="cuda", **options)
    on_cpu = train(net, x, y, **options)
    assert next(on_gpu.model.parameters()).device.type == "cpu"  # where the user's module is
    assert max_param_diff(on_gpu.model, on_cpu.model) <= 1e-9


# ------------------------------------------------------------------ CLI and job files

USER_CODE = """
import numpy as np
import torch


class TabularNet(torch.nn.Module):
    def __init__(self, width=WIDTH):
        super().__init__()
        self.inner = torch.nn.Linear(13, width)
        self.outer = torch.nn.Linear(width, 3)

    def forward(self, x):
        return self.outer(torch.nn.functional.elu(self.inner(x)))


def build_model():
    return TabularNet().double()


def load():
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    return x[:140], y[:140], x[140:], y[140:]


def wrong_width():
    return torch.nn.Linear(13, 4).double()
"""


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A package of the user's own in tmp_path, importable as ``userpkg.models``."""
    import importlib
    import sys

    pkg = tmp_path / "code" / "userpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")

    def write(width: int) -> None:
        (pkg / "models.py").write_text(textwrap.dedent(USER_CODE).replace("WIDTH", str(width)))
        sys.modules.pop("userpkg.models", None)
        importlib.invalidate_caches()

    write(20)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    yield write
    for name in ("userpkg", "userpkg.models"):
        sys.modules.pop(name, None)


def invoke(command: str):
    """Run ``immersion COMMAND`` (words split on spaces; tmp_path has none)."""
    return CliRunner().invoke(main, command.split())


MODEL, DATA = "userpkg.models:build_model", "userpkg.models:load"


def test_cli_round_trip_with_import_paths(tmp_path, user_code):
    work = tmp_path / "work"
    work.mkdir()
    keys, job, enc, w_file = (work / n for n in ("me.keys", "job.siml", "model.enc", "w.npy"))
    plan = "--optimizer adam --lr 0.01 --epochs 3 --batch-size 16"
    res = invoke(
        f"siml encode --model {MODEL} --dataset {DATA} {plan} --seed 5 "
        f"--keys-out {keys} --job-out {job}"
    )
    assert res.exit_code == 0, res.output
    assert job.read_bytes().startswith(JOB_MAGIC)
    assert b"pickle" not in job.read_bytes() and b"torch" not in job.read_bytes()

    # the service refuses to import user code it was not told to trust, and writes nothing
    res = invoke(f"siml serve {job} --out {enc}")
    assert res.exit_code != 0 and f"--allow-model {MODEL}" in res.output
    assert not enc.exists()
    res = invoke(f"siml serve {job} --out {enc} --allow-model {MODEL}")
    assert res.exit_code == 0, res.output

    res = invoke(
        f"siml decode --keys {keys} --job {job} --model-in {enc} --out {w_file} "
        f"--evaluate {DATA} --json"
    )
    assert res.exit_code == 0, res.output
    decoded = json.loads(res.stdout)
    assert decoded["model"] == MODEL and 0 <= decoded["accuracy"] <= 1

    # the user's plain training: the module built as the CLI built it (seed 5), same batches
    from userpkg.models import build_model, load

    torch.manual_seed(5)
    net = build_model()
    x, y, x_test, y_test = load()
    loaded = load_job(job)
    assert loaded.model == MODEL and loaded.plan.optimizer == "adam"
    plain = plain_training(
        net,
        x,
        F.one_hot(torch.as_tensor(y)).double(),
        loaded.plan.batches(len(x)),
        optimizer="adam",
        lr=0.01,
    )
    w = np.load(w_file)
    w_plain = torch.nn.utils.parameters_to_vector(plain.parameters()).detach().numpy()
    assert np.abs(w - w_plain).max() <= 1e-9
    with torch.no_grad():
        acc = float((plain(torch.as_tensor(x_test)).argmax(1).numpy() == y_test).mean())
    assert decoded["accuracy"] == acc

    # `siml run` with the same import paths compares with plain training itself
    res = invoke(f"siml run --model {MODEL} --dataset {DATA} {plan} --json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["max_abs_diff_vs_plain"] <= 1e-9 and out["accuracy"] == out["accuracy_plain"]


def test_changed_user_code_is_refused_by_the_service(tmp_path, user_code):
    x, y, _, _ = __import__("userpkg.models", fromlist=["load"]).load()
    from immersion_siml.dynamics import TrainingPlan

    plan = TrainingPlan(optimizer="sgd", lr=0.1, epochs=1, batch_size=32)
    _, job, _ = prepare_job("userpkg.models:build_model", x, y, plan, design=PrivacyDesign(), rng=0)
    path = save_job(job, tmp_path / "job.siml")
    user_code(21)  # the service has another version of the user's code
    with pytest.raises(InvalidArgumentError, match="same version") as info:
        load_job(path).target(allowed_models=("userpkg.models:build_model",))
    assert info.value.argument == "model"


def test_cli_bad_input_leaves_nothing_on_disk(tmp_path, user_code):
    work = tmp_path / "work"
    work.mkdir()
    common = f"--epochs 1 --keys-out {work / 'k.keys'} --job-out {work / 'j.siml'}"
    for model, dataset, named in (
        ("userpkg.models:wrong_width", "userpkg.models:load", "Y"),  # 4 outputs for 3 classes
        ("userpkg.models:missing", "userpkg.models:load", "model"),
        ("userpkg.models:build_model", "userpkg.models:absent", "dataset"),
        ("userpkg.models:build_model", "digits", "X"),  # 64 pixels for a 13-feature module
        ("resnet50", "digits", "--model"),
    ):
        res = invoke(f"siml encode --model {model} --dataset {dataset} {common}")
        assert res.exit_code != 0, (model, dataset)
        assert named in res.output.splitlines()[-1], res.output
        assert list(work.iterdir()) == []


@pytest.mark.files
def test_legacy_version_1_job_serves_and_decodes_to_plain_training(tmp_path):
    """tests/data/legacy: a job file and its key file written by the code before version 2 (nn-x2,
    the first 40 digits training samples, SGD lr 0.05, 2 epochs, batches of 8, order seed 3,
    block keys b = 8, rng 5)."""
    for name in ("siml-nn-x2.job", "siml-nn-x2.keyfile"):
        shutil.copy(LEGACY / name, tmp_path / name)
    (tmp_path / "siml-nn-x2.keyfile").chmod(0o600)
    job = load_job(tmp_path / "siml-nn-x2.job")
    assert (job.model, job.feature_shape, job.n_targets, job.parameters) == (
        "nn-x2",
        (1, 8, 8),
        10,
        None,
    )
    assert (job.plan.optimizer, job.plan.lr, job.plan.epochs, job.plan.batch_size) == (
        "sgd",
        0.05,
        2,
        8,
    )
    assert job.plan.order_seed == 3 and job.plan.shuffle is True
    service = job.target()
    encoded_model, _ = service.train(
        torch.as_tensor(job.encoded_state), torch.as_tensor(job.encoded_dataset), job.plan
    )
    user = key_holder(load_keys(tmp_path / "siml-nn-x2.keyfile"), job)
    w = decode_model(user, encoded_model, torch.as_tensor(job.encoded_dataset[0]))

    x, y = _digits(40)
    images, rows = service.decoded_dataset(torch.as_tensor(job.encoded_dataset))
    assert float((images - torch.as_tensor(x)).abs().max()) < 1e-9  # the same 40 samples
    assert torch.equal(rows.argmax(1), torch.as_tensor(y))
    w0 = service.dynamics.params(user.decode_state(torch.as_tensor(job.encoded_state)))
    from immersion_siml.models import build_siml_model

    net = build_siml_model("nn-x2", feature_shape=(1, 8, 8))
    torch.nn.utils.vector_to_parameters(w0, net.parameters())
    plain = plain_training(
        net,
        x,
        F.one_hot(torch.as_tensor(y), 10).double(),
        job.plan.batches(40),
        optimizer="sgd",
        lr=0.05,
    )
    w_plain = torch.nn.utils.parameters_to_vector(plain.parameters()).detach()
    assert float((w - w_plain).abs().max()) <= 1e-9
    assert float((w_plain - w0).abs().max()) > 1e-3


def test_version_2_job_files_round_trip_and_refuse_damage(tmp_path):
    from immersion_siml.dynamics import TrainingPlan
    from immersion_siml.job import job_meta

    x, y = _wine()
    plan = TrainingPlan(optimizer="adam", lr=0.01, epochs=1, batch_size=50, shuffle=False)
    _, job, _ = prepare_job(
        "nn-x2", x, np.eye(3)[y] * 0.9 + 0.1 / 3, plan, design=PrivacyDesign(), rng=0
    )
    path = save_job(job, tmp_path / "job.siml")
    loaded = load_job(path)
    assert (loaded.feature_shape, loaded.n_targets, loaded.plan) == ((13,), 3, plan)
    assert loaded.parameters == job.parameters and loaded.parameters[0] == ("1.weight", (16, 13))
    assert job_meta(loaded) == job_meta(job)
    blob = path.read_bytes()
    (tmp_path / "cut.siml").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(SimlFileError, match="integrity"):
        load_job(tmp_path / "cut.siml")
