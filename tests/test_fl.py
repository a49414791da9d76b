"""Federated schemes (seeds 000, 003): exact equality with FedAvg every round, data, models, CLI."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from click.testing import CliRunner  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion_fl.registry import fl_registry  # noqa: E402
from immersion_fl.runtime.data import load_dataset, load_idx_dataset, split_clients  # noqa: E402
from immersion_fl.runtime.engine import RunConfig, run_federated  # noqa: E402
from immersion_fl.runtime.optimizers import adam, momentum  # noqa: E402
from immersion_fl.schemes import lift_change  # noqa: E402

REGISTERED_SCHEMES = sorted(
    name
    for name, spec in fl_registry().fl_schemes.items()
    if name != "fedavg" and spec.runner is None
)
RUNNER_SCHEMES = sorted(
    name for name, spec in fl_registry().fl_schemes.items() if spec.runner is not None
)
REGISTERED_OPTIMIZERS = sorted(fl_registry().optimizers)


@pytest.mark.parametrize("scheme", REGISTERED_SCHEMES)
@pytest.mark.parametrize("optimizer", REGISTERED_OPTIMIZERS)
def test_every_scheme_and_optimizer_decodes_to_fedavg_every_round(scheme, optimizer):
    """Conformance of every registered scheme and optimizer (plugins included)."""
    cfg = RunConfig(
        scheme=scheme,
        optimizer=optimizer,
        lr=0.01 if optimizer == "adam" else 0.05,
        hidden=(16,),
        clients=4,
        rounds=3,
        local_epochs=2,
        batch_size=64,
        seed=3,
    )
    result = run_federated(cfg)
    assert len(result.diff_vs_plain) == 3
    assert max(result.diff_vs_plain) <= 1e-9  # float64, every round
    assert result.accuracy == result.accuracy_plain  # identical predictions
    assert result.n_encoded > result.n_params


@pytest.mark.parametrize("scheme", RUNNER_SCHEMES)
def test_every_scheme_with_its_own_rounds_equals_its_plain_reference_without_noise(scheme):
    """Conformance of schemes that bring their own round protocol (e.g. mpdp): noise off, every
    round."""
    cfg = RunConfig.from_flat(
        dict(scheme=scheme, noise="off", hidden=(16,), clients=4, rounds=3, batch_size=64, seed=3)
    )
    result = run_federated(cfg)
    assert len(result.diff_vs_plain) == 3 and max(result.diff_vs_plain) <= 1e-9
    assert result.accuracy == result.accuracy_plain


def test_block_keys_and_dirichlet_split_stay_exact():
    cfg = RunConfig.from_flat(
        dict(
            scheme="sifl-m2",
            optimizer="adam",
            lr=0.01,
            hidden=(64,),
            clients=5,
            rounds=2,
            split="dirichlet",
            alpha=0.3,
            keys="block",
            block_size=16,
            seed=1,
        )
    )
    result = run_federated(cfg)
    assert max(result.diff_vs_plain) <= 1e-9
    assert result.privacy["epsilon_local"] == pytest.approx(1.0)


def test_target_optimizer_lift_is_exact_for_stateful_optimizers():
    """Seed 000 section 7: decode once, run the optimizer in original coordinates, lift the
    change."""
    from immersion.backends import make_backend
    from immersion.keys import draw_code

    be = make_backend("torch", dtype="float64", device="cpu")
    code = draw_code(20, 5, kind="dense", rng=0)
    enc, dec, noisy = code.encoder(be), code.decoder(be), code.noisy_encoder(be)
    for opt in (momentum(0.1), adam(0.05)):
        w = torch.linspace(-1, 1, 20, dtype=torch.float64)
        w_enc = noisy(w, torch.full((5,), 1e3, dtype=torch.float64))
        state, w_plain = opt.init(w), w.clone()
        for k in range(10):
            grad = torch.sin(w_plain * (k + 1))
            step, state = opt.update(grad, state, w_plain)
            w_enc = lift_change(w_enc, w_plain, w_plain + step, enc)
            w_plain = w_plain + step
        assert float((dec(w_enc) - w_plain).abs().max()) < 1e-9


def test_iid_and_dirichlet_splits_partition_the_data():
    labels = np.repeat(np.arange(10), 30)
    for split in ("iid", "dirichlet"):
        parts = split_clients(labels, 6, split=split, alpha=0.5, seed=2)
        joined = np.sort(np.concatenate(parts))
        assert joined.tolist() == list(range(300))
    skewed = split_clients(labels, 6, split="dirichlet", alpha=0.05, seed=2)
    assert max(len(np.unique(labels[p])) for p in skewed) < 10 or min(len(p) for p in skewed) < 40


def test_digits_upsampled_to_28_feeds_the_paper_models():
    data = load_dataset("digits28")
    assert (
        data.image_shape == (1, 28, 28) and 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    )


def _write_idx(path, array, gz):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(
        ">" + "I" * array.ndim, *array.shape
    )
    blob = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(blob)


def test_idx_reader_reads_plain_and_gzipped_files_and_refuses_truncated_ones(tmp_path):
    rng = np.random.default_rng(0)
    for stem, arr, gz in (
        ("train-images-idx3-ubyte", rng.integers(0, 256, (12, 28, 28)), True),
        ("train-labels-idx1-ubyte", rng.integers(0, 10, 12), False),
        ("t10k-images-idx3-ubyte", rng.integers(0, 256, (5, 28, 28)), False),
        ("t10k-labels-idx1-ubyte", rng.integers(0, 10, 5), True),
    ):
        _write_idx(tmp_path / (stem + (".gz" if gz else "")), arr, gz)
    data = load_idx_dataset(tmp_path)
    assert data.x_train.shape == (12, 1, 28, 28) and data.x_test.shape == (5, 1, 28, 28)
    raw = (tmp_path / "t10k-images-idx3-ubyte").read_bytes()
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(raw[:-7])
    with pytest.raises(ValueError, match="truncated"):
        load_idx_dataset(tmp_path)


def test_fl_run_cli_prints_one_json_object(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "fl",
            "run",
            "--scheme",
            "sifl-m1",
            "--rounds",
            "2",
            "--hidden",
            "16",
            "--clients",
            "3",
            "--json",
            "--plot",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for key in (
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "round_time_ratio",
        "epsilon_local",
        "epsilon_global",
        "n_params",
        "n_encoded",
        "key_bytes",
    ):
        assert key in out
    assert out["max_abs_diff_vs_plain"] <= 1e-9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.png", "loss.png"]
    bad = CliRunner().invoke(main, ["fl", "run", "--dataset", "nowhere"])
    assert bad.exit_code == 2 and "dataset" in bad.output


def test_failing_clients_are_left_out_and_the_round_completes(caplog):
    from immersion_fl.runtime.faults import FaultPlan

    plan = FaultPlan(
        {(0, 0): "raise", (1, 1): "malformed", (2, 1): "wrong-shape", (3, 2): "timeout"}
    )
    cfg = RunConfig(scheme="sifl-m1", hidden=(16,), clients=5, rounds=3, client_timeout=2.0, seed=4)
    with caplog.at_level("WARNING", logger="immersion.fl"):
        result = run_federated(cfg, faults=plan)
    reasons = {(d["round"], d["client"]): d["reason"] for d in result.dropped}
    assert set(reasons) == {(0, 0), (1, 1), (1, 2), (2, 3)}
    assert "RuntimeError" in reasons[(0, 0)] and "NaN" in reasons[(1, 1)]
    assert "wrong shape" in reasons[(1, 2)] and "timed out" in reasons[(2, 3)]
    assert "client 0 left out" in caplog.text
    assert max(result.diff_vs_plain) <= 1e-9  # FedAvg left out the same clients: still equal
    clean = run_federated(RunConfig(scheme="sifl-m1", hidden=(16,), clients=5, rounds=3, seed=4))
    assert (
        clean.accuracy != result.accuracy or clean.loss != result.loss
    )  # the faults did change the run


@pytest.mark.parametrize("secure_aggregation", [False, True])
def test_every_client_failing_raises_the_named_error(secure_aggregation):
    """Every client fails in round 1 (local engine, with and without secure aggregation): the run
    stops with ``immersion_fl.EveryClientFailedError`` (an ImmersionError), naming the round."""
    import immersion_fl
    from immersion import ImmersionError
    from immersion_fl.runtime.faults import FaultPlan

    plan = FaultPlan({(0, 1): "raise", (1, 1): "malformed", (2, 1): "wrong-shape"})
    cfg = RunConfig.from_flat(
        dict(
            scheme="sifl-m1",
            hidden=(8,),
            clients=3,
            rounds=2,
            seed=1,
            secure_aggregation=secure_aggregation,
        )
    )
    with pytest.raises(immersion_fl.EveryClientFailedError, match="round 1: every client") as info:
        run_federated(cfg, faults=plan)
    assert isinstance(info.value, ImmersionError)
    assert not issubclass(immersion_fl.EveryClientFailedError, RuntimeError)


@pytest.mark.files
def test_resume_from_a_checkpoint_gives_the_uninterrupted_result(tmp_path):
    cfg = RunConfig(
        scheme="sifl-m2", optimizer="momentum", hidden=(16,), clients=3, rounds=4, seed=6
    )
    full = run_federated(cfg)
    run_federated(cfg, checkpoint=tmp_path, stop_after=2)  # interrupted after two rounds
    assert {p.name for p in tmp_path.iterdir()} == {"keys.npz", "state.npz"}
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in tmp_path.iterdir())
    resumed = run_federated(cfg, checkpoint=tmp_path, resume=True)
    assert resumed.accuracy == full.accuracy and resumed.diff_vs_plain == full.diff_vs_plain
    other = RunConfig(
        scheme="sifl-m2", optimizer="momentum", hidden=(16,), clients=3, rounds=4, seed=7
    )
    with pytest.raises(Exception, match="another configuration"):
        run_federated(other, checkpoint=tmp_path, resume=True)


flower = pytest.importorskip  # alias to keep the skip reason readable below


@pytest.fixture(scope="module")
def flwr_available():
    return flower("flwr")


@pytest.mark.slow
def test_flower_engine_matches_fedavg_for_every_scheme_and_optimizer(flwr_available):
    """Both engines run the same scheme code: every scheme x optimizer, every round, within 1e-9."""
    for scheme in ("sifl-m1", "sifl-m2", "sifl-rm"):
        for optimizer in ("sgd", "momentum", "adam"):
            cfg = RunConfig(
                scheme=scheme,
                optimizer=optimizer,
                lr=0.01 if optimizer == "adam" else 0.05,
                hidden=(8,),
                clients=3,
                rounds=2,
                batch_size=64,
                seed=3,
            )
            flower_run = run_federated(cfg, engine="flower")
            local_run = run_federated(cfg)
            assert max(flower_run.diff_vs_plain) <= 1e-9, (scheme, optimizer)
            assert flower_run.accuracy == local_run.accuracy, (scheme, optimizer)


@pytest.mark.slow
def test_flower_engine_leaves_failing_clients_out(flwr_available):
    from immersion_fl.runtime.faults import FaultPlan

    cfg = RunConfig(scheme="sifl-m1", hidden=(8,), clients=3, rounds=2, seed=2)
    result = run_federated(
        cfg, engine="flower", faults=FaultPlan({(1, 0): "raise", (2, 1): "malformed"})
    )
    assert {(d["round"], d["client"]) for d in result.dropped} == {(0, 1), (1, 2)}
    assert max(result.diff_vs_plain) <= 1e-9


@pytest.mark.slow
def test_one_hundred_flower_clients_complete_a_round(flwr_available):
    cfg = RunConfig(scheme="sifl-m1", hidden=(8,), clients=100, rounds=1, batch_size=8, seed=0)
    result = run_federated(cfg, engine="flower")
    assert len(result.accuracy) == 1 and not result.dropped
    assert max(result.diff_vs_plain) <= 1e-9


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_reported_epsilon_matches_seed000_theorems_on_the_drawn_keys(noise):
    """Theorem 1 (eq. 41) or Theorem 2 (eq. 44) recomputed from the dense key matrices."""
    from immersion.privacy import gaussian_epsilon

    cfg = RunConfig.from_flat(
        dict(
            scheme="sifl-m1",
            noise=noise,
            hidden=(4,),
            clients=3,
            rounds=1,
            keys="dense",
            extra=20,
            epsilon_local=0.5,
            clip=10.0,
        )
    )
    from immersion_fl.runtime.engine import Server, task_from_config

    sizes = [150, 160, 170]
    server = Server.create(cfg, task_from_config(cfg), sizes)
    code, sigma = server.scheme.code, server.scheme.noise_scale
    pi, n1 = code.dense_pi(), code.dense_noise_basis()
    delta_local = 2 * 10.0 / min(sizes)
    if noise == "laplace":
        eps = np.abs(pi).sum(1) * delta_local / (np.linalg.norm(n1, axis=1) * sigma)
    else:
        eps = gaussian_epsilon(
            np.linalg.norm(pi, axis=1) * delta_local, np.linalg.norm(n1, axis=1) * sigma, 1e-5
        )
    assert server.result.privacy["epsilon_local"] == pytest.approx(eps.max(), rel=1e-9)
    assert eps.max() == pytest.approx(0.5, rel=1e-9)  # the design meets the target exactly


@pytest.mark.slow
@pytest.mark.parametrize(
    "run_config", ["rounds=2 hidden='16'", "scheme='mpdp' noise='off' rounds=2 hidden='16'"]
)
def test_flower_deployment_runtime_with_tls_and_node_auth_on_loopback(
    tmp_path, flwr_available, run_config
):
    """The README's deployment: a SuperLink with TLS and SuperNode authentication, two
    registered SuperNodes, `flwr run` over TLS (SIFL and MP-DP), equal to plain training."""
    import re
    import shutil
    from pathlib import Path

    from flower_deployment import CONNECTION, LoopbackDeployment

    app = tmp_path / "app"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fl_demos" / "flower_app", app)
    with LoopbackDeployment(tmp_path, secure=True) as deployment:
        for pid in (0, 1):
            private, public = deployment.node_key(f"node-{pid}")
            done = deployment.flwr("supernode", "register", str(public), CONNECTION)
            assert "registered successfully" in done.stdout + done.stderr, done.stdout[-2000:]
            deployment.supernode(f"node-{pid}", pid, 2, key=private)
        out = deployment.run(app, run_config, timeout_s=300)
    line = next((m.group(0) for m in re.finditer(r'\{"scheme".*\}', out.stdout + out.stderr)), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads(line)
    assert summary["rounds"] == 2 and summary["max_abs_diff_vs_plain"] <= 1e-9
    assert summary["accuracy"] == summary["accuracy_plain"]


def test_threat_model_facts_hold_as_measured():
    """THREAT_MODEL.md, federated rows: shared round noise cancels in differences; M2 with p = 2
    leaks w up to a scalar to the server (seed000 notes section 12)."""
    from immersion_fl.runtime.engine import Server, task_from_config

    cfg = RunConfig(scheme="sifl-m2", rounds=1, clients=4, hidden=(32,))
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    scheme = server.scheme
    received = scheme.broadcast(0)
    uploads = [scheme.client_upload(c, received, 0) for c in clients]
    local = [scheme.kit.decode(u) for u in uploads]  # any holder of the client kit decodes
    difference = uploads[0] - uploads[1]
    residual = difference - scheme.kit.encode(local[0] - local[1])
    assert float(uploads[0].abs().max()) > 10.0  # uploads carry large noise ...
    assert float(residual.abs().max()) < 1e-9 * float(
        difference.abs().max()
    )  # ... that cancels in differences
    scheme.server_update(scheme.aggregate(uploads, [c.n_samples for c in clients]))
    first, second = scheme.w_bar[0], scheme.w_bar[1]
    combo = (
        first - float(first @ second) / float(second @ second) * second
    )  # least-norm combination
    w = scheme.global_model()
    cosine = float(combo @ w) / float(combo.norm() * w.norm())
    assert abs(cosine) > 0.99  # the server recovers w up to a scalar
    assert abs(float(first @ w) / float(first.norm() * w.norm())) < 0.1  # a single column does not
