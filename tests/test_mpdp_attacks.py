"""fl_demos/mpdp_attacks.py (seed 004 Tables 2-4, notes section 10.11) in quick mode: what the
attacks must show, with margins far from the measured values (quick runs take about 10 s each)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")

DEMO = Path(__file__).resolve().parents[1] / "fl_demos" / "mpdp_attacks.py"
SETTINGS = (
    "fedsgd",
    "mpdp_noise_off",
    "mpdp_eps1",
    "mpdp_eps3",
    "mpdp_phi_clear",
    "mpdp_phi_sum_K10",
    "baseline_mean_image",
)


def load_demo():
    spec = importlib.util.spec_from_file_location("mpdp_attacks_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_result():
    return load_demo().run_demo(quick=True, seed=0)


def check_result(result: dict) -> None:
    inv, mia = result["gradient_inversion"], result["membership_inference"]
    for name in SETTINGS:
        assert math.isfinite(inv[name]["psnr"]) and 0 <= inv[name]["mse"] <= 1, name
    psnr = {name: inv[name]["psnr"] for name in SETTINGS}
    # the server recovers one client's exact gradient when the noise is off: perturbation alone
    # hides nothing
    assert inv["checks"]["max_abs_recover_minus_plain_noise_off"] < 1e-9
    assert psnr["fedsgd"] > 40 and psnr["mpdp_noise_off"] > 30
    # with the calibrated noise the reconstruction is no better than guessing the average digit
    assert psnr["fedsgd"] > psnr["mpdp_eps1"] + 20
    assert psnr["mpdp_eps1"] < psnr["baseline_mean_image"] + 2
    assert psnr["mpdp_eps3"] < psnr["baseline_mean_image"] + 2
    assert inv["batch_1"]["mpdp_eps1"]["noise_to_signal"] > 5
    # Phi sent in the clear (the paper) is noise-free: the inputs come back (notes 10.11(c))
    assert inv["checks"]["max_abs_phi_autograd_minus_upload"] < 1e-12
    assert psnr["mpdp_phi_clear"] > 60 and psnr["mpdp_phi_clear"] > psnr["fedsgd"] - 10
    # masked corrections: the sum over 10 one-image clients still gives every image back
    assert psnr["mpdp_phi_sum_K10"] > 60
    assert set(inv["batch_1"]["mpdp_phi_sum_K10"]["method"]) == {"algebraic"}

    for name in ("plain", "perturbed", "perturbed_corrected"):
        assert 0.0 <= mia[name]["asr"] <= 1.0, name
    assert mia["plain"]["asr"] > 0.6  # the overfit model leaks membership
    assert mia["perturbed"]["asr"] < 0.6  # y_hat = y + alpha r hides it
    assert (
        mia["perturbed_corrected"]["asr"] > mia["perturbed"]["asr"] + 0.1
    )  # until r is estimated (10.11(d))
    assert abs(mia["perturbed_corrected"]["asr"] - mia["plain"]["asr"]) < 0.1
    assert mia["perturbed_corrected"]["relative_error_r_est"] < 0.05


def test_quick_run_shows_the_attacks(quick_result):
    check_result(quick_result)
    assert quick_result["settings"]["quick"] is True


def test_algebraic_phi_inversion_is_exact_for_a_few_images():
    import numpy as np
    import torch
    from immersion_mpdp.lmt import local_model_training
    from immersion_mpdp.mlp import init_weights, one_hot
    from immersion_mpdp.perturbation import perturb

    demo = load_demo()
    weights = init_weights((64, 32, 10), seed=5)
    model, _ = perturb(weights, np.random.default_rng(5))
    x = torch.as_tensor(np.random.default_rng(6).uniform(0, 1, size=(3, 64)))
    phi = local_model_training(model, x, one_hot(torch.tensor([1, 2, 3]), 10)).phi
    recon = demo.invert_phi_algebraic(model, phi[0])
    assert recon is not None
    assert demo.psnr_mse(recon, x)[0] > 60


@pytest.mark.slow
def test_cli_prints_one_json_object_with_another_seed():
    out = subprocess.run(
        [sys.executable, str(DEMO), "--quick", "--json", "--seed", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(out.stdout)  # exactly one JSON object on stdout
    assert result["settings"]["seed"] == 1
    check_result(result)
