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
from immersion.cli import main  # noqa: E402
from immersion_fl.data import load_dataset, load_idx_dataset, split_clients  # noqa: E402
from immersion_fl.engine import RunConfig, run_federated  # noqa: E402
from immersion_fl.optimizers import Adam, Momentum, lift_change  # noqa: E402


@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2", "sifl-rm"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_every_scheme_and_optimizer_decodes_to_fedavg_every_round(scheme, optimizer):
    cfg = RunConfig(scheme=scheme, optimizer=optimizer, lr=0.01 if optimizer == "adam" else 0.05, hidden=(16,),
                    clients=4, rounds=3, local_epochs=2, batch_size=64, seed=3)
    result = run_federated(cfg)
    assert len(result.diff_vs_plain) == 3
    assert max(result.diff_vs_plain) <= 1e-9                      # float64, every round
    assert result.accuracy == result.accuracy_plain              # identical predictions
    assert result.n_encoded > result.n_params


def test_block_keys_and_dirichlet_split_stay_exact():
    cfg = RunConfig(scheme="sifl-m2", optimizer="adam", lr=0.01, hidden=(64,), clients=5, rounds=2,
                    split="dirichlet", alpha=0.3, keys="block", block_size=16, seed=1)
    result = run_federated(cfg)
    assert max(result.diff_vs_plain) <= 1e-9
    assert result.privacy["epsilon_local"] == pytest.approx(1.0)


def test_target_optimizer_lift_is_exact_for_stateful_optimizers():
    """Seed 000 section 7: decode once, run the optimizer in original coordinates, lift the change."""
    from immersion.backends import make_backend
    from immersion.keys import draw_code

    be = make_backend("torch", dtype="float64", device="cpu")
    code = draw_code(20, 5, kind="dense", rng=0)
    enc, dec, noisy = code.encoder(be), code.decoder(be), code.noisy_encoder(be)
    for opt in (Momentum(0.1), Adam(0.05)):
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
    assert data.image_shape == (1, 28, 28) and 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0


def _write_idx(path, array, gz):
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(blob)


def test_idx_reader_reads_plain_and_gzipped_files_and_refuses_truncated_ones(tmp_path):
    rng = np.random.default_rng(0)
    for stem, arr, gz in (("train-images-idx3-ubyte", rng.integers(0, 256, (12, 28, 28)), True),
                          ("train-labels-idx1-ubyte", rng.integers(0, 10, 12), False),
                          ("t10k-images-idx3-ubyte", rng.integers(0, 256, (5, 28, 28)), False),
                          ("t10k-labels-idx1-ubyte", rng.integers(0, 10, 5), True)):
        _write_idx(tmp_path / (stem + (".gz" if gz else "")), arr, gz)
    data = load_idx_dataset(tmp_path)
    assert data.x_train.shape == (12, 1, 28, 28) and data.x_test.shape == (5, 1, 28, 28)
    raw = (tmp_path / "t10k-images-idx3-ubyte").read_bytes()
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(raw[:-7])
    with pytest.raises(ValueError, match="truncated"):
        load_idx_dataset(tmp_path)


def test_fl_run_cli_prints_one_json_object(tmp_path):
    result = CliRunner().invoke(main, ["fl", "run", "--scheme", "sifl-m1", "--rounds", "2", "--hidden", "16",
                                       "--clients", "3", "--json", "--plot", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("max_abs_diff_vs_plain", "accuracy", "accuracy_plain", "round_time_ratio", "epsilon_local",
                "epsilon_global", "n_params", "n_encoded", "key_bytes"):
        assert key in out
    assert out["max_abs_diff_vs_plain"] <= 1e-9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.png", "loss.png"]
    bad = CliRunner().invoke(main, ["fl", "run", "--dataset", "nowhere"])
    assert bad.exit_code == 2 and "dataset" in bad.output
