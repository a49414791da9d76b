"""``immersion audit`` rows for MP-DP (seed 004): ``mpdp-output-mask`` and ``gradient-inversion``
(``plugins/immersion_mpdp/attacks.py``). Each attack must succeed where the analysis says it must
and fail with the mitigation on; margins are far from the measured values (quick runs, a few
seconds each)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")

from immersion.audit.runner import VERDICTS, AttackResult  # noqa: E402
from immersion.plugins.manager import registry  # noqa: E402
from immersion_mpdp import attacks  # noqa: E402
from immersion_mpdp.mlp import forward, init_weights  # noqa: E402
from immersion_mpdp.perturbation import perturb  # noqa: E402


@pytest.fixture(scope="module")
def inversion_rows() -> list[AttackResult]:
    return attacks.run_gradient_inversion(quick=True, seed=0)


@pytest.fixture(scope="module")
def mask_rows() -> list[AttackResult]:
    return attacks.run_output_mask(quick=True, seed=0)


def check_rows(rows: list[AttackResult], name: str, schemes: tuple[str, ...]) -> None:
    for row in rows:
        assert row.attack == name and row.scheme in schemes and row.verdict in VERDICTS
        assert np.isfinite(row.value) and np.isfinite(row.baseline)
        assert (row.mitigation is None) == (row.cost is None)
    json.dumps([row.as_dict() for row in rows])  # the audit prints them as JSON


def test_both_attacks_are_registered_for_their_schemes():
    specs = registry().attacks()
    assert specs["mpdp-output-mask"].schemes == ("mpdp",)
    assert specs["gradient-inversion"].schemes == ("fedavg", "mpdp")
    assert specs["gradient-inversion"].run is attacks.run_gradient_inversion


def test_gradient_inversion_succeeds_without_noise_and_fails_at_epsilon_1(inversion_rows):
    check_rows(inversion_rows, "gradient-inversion", ("fedavg", "mpdp"))
    fedsgd, noise_off, eps1, phi_clear, phi_sum = inversion_rows
    base = fedsgd.baseline
    assert 5 < base < 20  # guessing the mean digit
    # FedSGD, batch 1: every row of the first layer's gradient is proportional to the image
    assert fedsgd.scheme == "fedavg" and fedsgd.value > 60 and fedsgd.verdict == "leaks"
    # MP-DP, noise off: the server holds the keys and recovers the exact gradient (Eq. 22)
    assert noise_off.scheme == "mpdp" and noise_off.mitigation is None
    assert noise_off.detail["max_abs_recovered_minus_true_gradient"] < 1e-9
    assert noise_off.value > 60 and noise_off.verdict == "leaks"
    # the mitigation: DP noise at epsilon 1, tens of times the gradient: no better than the mean
    # digit
    assert eps1.mitigation == "mpdp noise epsilon=1" and eps1.cost
    assert eps1.value < base + 2 and eps1.verdict == "resists"
    assert eps1.detail["noise_to_signal"] > 5
    # ... but Phi carries no noise: in the clear (the paper) or summed over 10 clients (masked), it
    # inverts exactly
    for row in (phi_clear, phi_sum):
        assert (
            row.mitigation.startswith("mpdp noise epsilon=1")
            and row.value > 60
            and row.verdict == "leaks"
        )
        assert set(row.detail["methods"]) == {"algebraic"}


def test_output_mask_is_regressed_out_by_a_client(mask_rows):
    check_rows(mask_rows, "mpdp-output-mask", ("mpdp",))
    one_hidden, two_hidden, fresh = mask_rows
    for row in (one_hidden, two_hidden):
        assert row.mitigation is None and row.verdict == "leaks"
        assert (
            row.value > 0.95 and row.baseline < 0.5
        )  # raw W_hat: argmax of y + alpha r is mostly r's
        assert (
            row.detail["relative_output_error"] < 0.1 < 1 < row.detail["relative_output_error_raw"]
        )
        assert row.detail["relative_error_r_est"] < 0.02
        assert abs(row.detail["accuracy_recovered"] - row.detail["accuracy_true"]) < 0.02
    # fresh keys every round (the default) do not help: each round's r is re-estimated
    assert fresh.mitigation.startswith("fresh keys") and fresh.verdict == "leaks"
    assert fresh.value > 0.95 and fresh.baseline < 0.5
    assert fresh.detail["per_round"][-1]["round"] > 0


def test_recovered_model_is_exact_when_the_model_fits_the_client_labels():
    """The least-squares estimate is exact when y = t: the error of r_est is the model's misfit
    only."""
    for sizes in ((6, 5, 3), (6, 5, 4, 3)):
        weights = init_weights(sizes, seed=1)
        model, keys = perturb(weights, np.random.default_rng(2))
        x = torch.as_tensor(np.random.default_rng(3).uniform(0, 1, size=(20, 6)))
        y_hat, alpha = model.forward(x)
        r_est = attacks.estimate_r(
            alpha, y_hat, forward(weights, x)
        )  # "labels" equal to the outputs
        assert float((r_est - keys.r_out).abs().max()) < 1e-12
        recovered = attacks.unmask_model(model, r_est)
        assert [tuple(w.shape) for w in recovered] == [tuple(w.shape) for w in weights]
        x_new = torch.as_tensor(np.random.default_rng(4).uniform(0, 1, size=(50, 6)))
        assert torch.allclose(
            forward(recovered, x_new), forward(weights, x_new), atol=1e-12, rtol=1e-10
        )


def test_noise_cost_says_where_it_comes_from(tmp_path):
    cost, detail = attacks.noise_cost(1.0)
    if attacks.BENCH_JSON.exists():
        assert cost.startswith("from docs/figures/mpdp/bench_mpdp.json") and "accuracy" in cost
        assert all(run["epsilon"] == 1.0 for run in detail["bench_runs"])
    missing, detail = attacks.noise_cost(1.0, tmp_path / "none.json")
    assert missing.startswith("not measured") and detail == {}


@pytest.mark.parametrize(
    "value,baseline,verdict",
    [(100.0, 12.0, "leaks"), (13.0, 12.0, "resists"), (17.0, 12.0, "partial")],
)
def test_psnr_verdicts(value, baseline, verdict):
    assert attacks.psnr_verdict(value, baseline) == verdict
