"""Seed 001 accountant: reference values, ranges, composition, dp-accounting cross-checks, CLI."""

from __future__ import annotations

import json
import math

import pytest
from immersion import InvalidArgumentError
from immersion_secagg.accountant import (
    Setting,
    epsilon_from_rdp,
    gd_guarantee,
    guarantee,
    rdp_gd_isotropic,
    rdp_theorem2,
    rdp_theorem4,
    sgd_guarantee,
    table1_sgd_epsilon,
    theorem4_alpha_max,
)

FIG5 = Setting(
    users=50, samples=1200, batch=32, clip=10.0
)  # seed 001 Fig. 5 setting, D = 60000 / 50


@pytest.mark.parametrize(
    "theorem,kw,epsilon,alpha",
    [
        ("2", {"min_eig_sum": 1.0}, 1.67912, 8.68),
        ("2", {"min_eig_sum": 10.0}, 0.225284, 63.7),
        ("4", {"sigma2": 1e-3}, 2.04938, 7.22),
        ("4", {"sigma2": 1e-2}, 0.228777, 59.6),
    ],
)
def test_reference_values_of_the_notes(theorem, kw, epsilon, alpha):
    g = guarantee(theorem, FIG5, 1e-4, **kw)
    assert g.epsilon == pytest.approx(epsilon, abs=6e-6)
    assert g.alpha == pytest.approx(alpha, abs=0.05)


def test_rdp_at_alpha2_and_ranges():
    assert rdp_theorem2(2.0, FIG5, 1.0) == pytest.approx(0.2106667, abs=1e-7)
    assert rdp_theorem4(2.0, FIG5, 1e-3) == pytest.approx(0.270175, abs=1e-6)
    assert math.isinf(rdp_theorem2(12.0, FIG5, 1.0)) and math.isfinite(
        rdp_theorem2(11.9, FIG5, 1.0)
    )
    assert theorem4_alpha_max(FIG5, 1e-3) == pytest.approx(9.6)
    assert theorem4_alpha_max(FIG5, 1e-3, strict_range=True) == pytest.approx(
        0.3
    )  # the stated range is empty
    assert math.isinf(guarantee("4", FIG5, 1e-4, sigma2=1e-3, strict_range=True).epsilon)
    strict = guarantee("4", FIG5, 1e-4, sigma2=1e-2, strict_range=True)
    assert strict.epsilon == pytest.approx(4.62216, abs=1e-4) and strict.alpha == pytest.approx(
        3.0, abs=1e-6
    )


def test_lemma1_minimum_is_the_minimum_and_rdp_adds_over_rounds():
    for theorem, kw in (("2", {"min_eig_sum": 3.0}), ("4", {"sigma2": 5e-3})):
        for rounds in (1, 10):
            g = guarantee(theorem, FIG5, 1e-4, rounds=rounds, **kw)
            rdp = (
                (lambda a: rdp_theorem2(a, FIG5, 3.0))
                if theorem == "2"
                else (lambda a: rdp_theorem4(a, FIG5, 5e-3))
            )
            at = [
                rounds * rdp(a) + math.log(1e4) / (a - 1)
                for a in (1.01, 1.5, 2, 3, 5, 8, g.alpha * 0.99, g.alpha * 1.01)
            ]
            assert all(g.epsilon <= v + 1e-9 for v in at if math.isfinite(v))
        assert (
            guarantee(theorem, FIG5, 1e-4, rounds=10, **kw).epsilon
            > guarantee(theorem, FIG5, 1e-4, **kw).epsilon
        )


def test_monotone_in_lambda_sigma2_users_and_clip():
    eps = [guarantee("2", FIG5, 1e-4, min_eig_sum=lam).epsilon for lam in (1, 3, 10, 100)]
    assert eps == sorted(eps, reverse=True)
    eps = [
        guarantee("4", Setting(n, 1200, 32, 10.0), 1e-4, sigma2=1e-2).epsilon for n in (10, 50, 200)
    ]
    assert eps == sorted(eps, reverse=True)
    eps = [
        guarantee("4", Setting(50, 1200, 32, c), 1e-4, sigma2=1e-2).epsilon
        for c in (1.0, 5.0, 10.0)
    ]
    assert eps == sorted(eps)


def test_gd_row_equals_dp_accounting_gaussian_rdp():
    """Table 1 GD row = the Gaussian mechanism with replace-one sensitivity 2C/D (dp-accounting's
    RDP)."""
    import dp_accounting as dpa
    from dp_accounting import rdp

    sigma2, orders = 1e-2, [1.5, 2.0, 4.0, 8.0, 32.0]
    accountant = rdp.RdpAccountant(
        orders=orders, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    accountant.compose(
        dpa.GaussianDpEvent(math.sqrt(FIG5.users * sigma2) * FIG5.samples / (2 * FIG5.clip)), 7
    )
    ours = [7 * rdp_gd_isotropic(a, FIG5, sigma2) for a in orders]
    assert accountant._rdp == pytest.approx(ours, rel=1e-12)
    g = gd_guarantee(FIG5, sigma2, 1e-4, rounds=7)
    assert accountant.get_epsilon(1e-4) <= g.epsilon  # dp-accounting converts more tightly
    assert g.epsilon == pytest.approx(
        7 * 2 * 100 / (1200**2 * 50 * sigma2)
        + 2 * math.sqrt(7 * 2 * 100 / (1200**2 * 50 * sigma2) * math.log(1e4)),
        rel=1e-6,
    )  # closed form a + 2 sqrt(a log 1/delta)


def test_sgd_row_table1_and_dp_accounting_agree_in_size():
    """Table 1's amplified SGD row (notes' values) beside dp-accounting's
    sampling-without-replacement RDP."""
    for sigma2, table in ((1e-3, 12.2782), (1e-2, 1.00201), (1.0, 0.0123781)):
        assert table1_sgd_epsilon(FIG5, sigma2, 1e-4) == pytest.approx(table, rel=1e-5)
        tight = sgd_guarantee(FIG5, sigma2, 1e-4).epsilon
        assert 0.5 * table < tight < 1.5 * table
    assert (
        sgd_guarantee(FIG5, 1e-2, 1e-4, rounds=10).epsilon > sgd_guarantee(FIG5, 1e-2, 1e-4).epsilon
    )


def test_bad_input_names_the_argument():
    with pytest.raises(InvalidArgumentError, match="batch"):
        Setting(50, 10, 32, 1.0)
    with pytest.raises(InvalidArgumentError, match="clip"):
        Setting(50, 100, 32, 0.0)
    with pytest.raises(InvalidArgumentError, match="delta"):
        guarantee("2", FIG5, 1.5, min_eig_sum=1.0)
    with pytest.raises(InvalidArgumentError, match="min_eig_sum"):
        guarantee("2", FIG5, 1e-4, sigma2=1.0)
    with pytest.raises(InvalidArgumentError, match="theorem"):
        guarantee("3", FIG5, 1e-4, sigma2=1.0)
    with pytest.raises(InvalidArgumentError, match="sigma2"):
        rdp_theorem4(2.0, FIG5, -1.0)
    assert math.isinf(epsilon_from_rdp(lambda a: a, 1e-4, alpha_max=1.0).epsilon)


def test_cli():
    from click.testing import CliRunner
    from immersion.cli.main import main

    base = [
        "dp",
        "secagg",
        "--users",
        "50",
        "--samples",
        "1200",
        "--batch",
        "32",
        "--clip",
        "10",
        "--delta",
        "1e-4",
    ]
    out = CliRunner().invoke(main, base + ["--theorem", "2", "--lambda-min", "0.02", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    assert got["epsilon"] == pytest.approx(1.67912, abs=1e-5) and got[
        "rdp_at_alpha2"
    ] == pytest.approx(0.2106667)
    assert got["alpha"] == pytest.approx(8.68, abs=0.05)
    out = CliRunner().invoke(
        main, base + ["--theorem", "4", "--sigma2", "1e-3", "--strict-range", "--json"]
    )
    assert (
        json.loads(out.stdout)["epsilon"] is None
        and "no guarantee" in json.loads(out.stdout)["note"]
    )
    bad = CliRunner().invoke(main, base + ["--theorem", "4", "--lambda-sum", "1"])
    assert bad.exit_code != 0 and "--sigma2" in bad.output


def _cfg(**kw):
    from immersion_fl.runtime.engine import RunConfig

    base = dict(
        scheme="gd-dp",
        model="linear",
        clients=5,
        rounds=2,
        batch_size=8,
        lr=0.5,
        epsilon=4.0,
        delta=1e-4,
    )
    base.update(kw)
    return RunConfig.from_flat(base)


@pytest.mark.parametrize("scheme", ["sgd-dp", "gsgd-dp", "gd-dp"])
def test_schemes_calibrate_sigma2_to_the_total_epsilon(scheme):
    from immersion_fl.runtime.engine import run_federated
    from immersion_secagg.engine import account

    res = run_federated(_cfg(scheme=scheme))
    out = res.summary()
    assert out["epsilon"] <= 4.0 and out["sigma2"] > 0
    s = Setting(5, out["samples_per_user"], 8, 10.0)
    assert (
        account(scheme, s, out["sigma2"] / 1.01, 1e-4, 2).epsilon > 4.0
    )  # the smallest such sigma2
    assert len(res.accuracy) == 2 and max(res.diff_vs_plain) > 0  # noise moved the model


def test_more_privacy_means_more_noise():
    from immersion_fl.runtime.engine import run_federated

    tight = run_federated(_cfg(epsilon=1.0, rounds=1)).summary()["sigma2"]
    loose = run_federated(_cfg(epsilon=8.0, rounds=1)).summary()["sigma2"]
    assert tight > loose


def test_scheme_bad_input():
    from immersion_fl.runtime.engine import run_federated
    from immersion_fl.runtime.faults import FaultPlan

    with pytest.raises(InvalidArgumentError, match="batch_size"):
        run_federated(_cfg(batch_size=10_000))
    with pytest.raises(InvalidArgumentError, match="inject_fault"):
        run_federated(_cfg(), faults=FaultPlan({(0, 0): "raise"}))
    with pytest.raises(InvalidArgumentError, match="noise"):
        run_federated(_cfg(noise="laplace"))


def test_fig5_demo_runs_and_plots(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fl_demos" / "secagg_schemes.py"
    spec = importlib.util.spec_from_file_location("secagg_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    result = demo.run_demo(rounds=2, epsilons=[4.0], users=10)
    assert [r["scheme"] for r in result["runs"]] == ["sgd-dp", "gsgd-dp", "gd-dp"]
    assert all(
        r["epsilon"] <= 4.0 and r["sigma2"] > 0 and 0 <= r["accuracy"] <= 1 for r in result["runs"]
    )
    assert demo.plot(result, tmp_path).exists()


def test_sgd_dp_without_noise_learns_like_gd():
    """A regression guard: the IID batch keeps each record with its own label."""
    from immersion_fl.runtime.engine import run_federated

    sgd = run_federated(_cfg(scheme="sgd-dp", noise="off", rounds=5, clients=10)).accuracy[-1]
    gd = run_federated(_cfg(scheme="gd-dp", noise="off", rounds=5, clients=10)).accuracy[-1]
    assert sgd > 0.3 and abs(sgd - gd) < 0.2  # chance is 0.1; mismatched labels gave 0.08
