"""Audit of federated learning by immersion (seeds 000 and 003): ``immersion_fl.attacks`` and the
``client_noise`` mitigation. THREAT_MODEL.md, section "Federated learning by immersion"."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")

from immersion import InvalidArgumentError  # noqa: E402
from immersion.audit.runner import run_audit  # noqa: E402
from immersion.plugins.manager import registry  # noqa: E402
from immersion_fl.attacks import (  # noqa: E402
    run_client_decodes,
    run_m2_scalar_leak,
    run_shared_noise_difference,
    single_thread,
)
from immersion_fl.registry import fl_registry  # noqa: E402
from immersion_fl.runtime.engine import (  # noqa: E402
    RunConfig,
    Server,
    run_federated,
    task_from_config,
)
from immersion_fl.schemes import kernel_noise  # noqa: E402

SIFL = ("sifl-m1", "sifl-m2", "sifl-rm")


@pytest.fixture(scope="module")
def difference_rows():
    return run_shared_noise_difference(quick=True, seed=0)


def _rows(rows, scheme, mitigation):
    return [r for r in rows if r.scheme == scheme and r.mitigation == mitigation]


def test_attacks_are_registered_for_the_sifl_schemes():
    specs = registry().attacks()
    assert specs["shared-noise-difference"].schemes == SIFL
    assert specs["client-decodes"].schemes == SIFL
    assert specs["m2-scalar-leak"].schemes == ("sifl-m2",)


@pytest.mark.parametrize("scheme", SIFL)
def test_shared_noise_difference_leaks_without_mitigation(difference_rows, scheme):
    """Seed 000 eqs. 19-20: w~_i - w~_k = Pi1 (w_i - w_k): no noise left, exact cosines, a kit
    decodes."""
    noise_left, cosines, collusion = _rows(difference_rows, scheme, None)
    assert [r.verdict for r in (noise_left, cosines, collusion)] == ["leaks"] * 3
    assert noise_left.value < 1e-12 and noise_left.baseline > 1.0  # independent noise: about sqrt 2
    assert cosines.value < 1e-9 and cosines.baseline > 0.5
    assert collusion.value < 1e-9 and collusion.detail["via_difference"] < 1e-9


@pytest.mark.parametrize("scheme", SIFL)
def test_client_noise_hides_the_difference_but_not_from_a_kit_holder(difference_rows, scheme):
    rows = _rows(difference_rows, scheme, "client-noise")
    noise_left, cosines, collusion = rows[0], rows[1], rows[-1]
    assert noise_left.verdict == "resists" and noise_left.value > 0.5
    assert cosines.verdict == "resists"
    assert collusion.verdict == "leaks"  # the client noise is in ker(Pi1_left): kits remove it
    assert all(r.cost for r in rows)
    if scheme == "sifl-rm":  # one noise dimension: estimated and projected out
        (pca,) = [r for r in rows if "principal directions" in r.metric]
        assert pca.verdict == "partial" and pca.value < 0.3 and pca.baseline > 10
    else:  # quick: fewer samples than the 201 noise dimensions
        assert len(rows) == 3


@pytest.mark.parametrize("scheme", SIFL)
def test_secure_aggregation_hides_individual_uploads(difference_rows, scheme):
    rows = _rows(difference_rows, scheme, "secure-aggregation")
    assert [r.verdict for r in rows] == ["resists"] * 3
    assert all("round time x" in r.cost for r in rows)


def test_secure_aggregation_rows_come_from_the_real_option(difference_rows):
    """The rows run ``secure_aggregation=True`` through the engine's secure round (not a
    simulation beside it), including a round with a dropout, and the model still equals FedAvg."""
    import re

    for scheme in SIFL:
        cost = _rows(difference_rows, scheme, "secure-aggregation")[0].cost
        assert "engine's secure round" in cost and "one dropout" in cost
        gap = float(re.search(r"max \|w - w_fedavg\| ([0-9.e+-]+)", cost).group(1))
        assert gap <= 1e-9


@pytest.mark.parametrize(
    ("scheme", "noise"),
    [
        ("sifl-m1", "laplace"),
        ("sifl-m1", "gaussian"),
        ("sifl-m2", "gaussian"),
        ("sifl-rm", "laplace"),
    ],
)
def test_client_noise_keeps_the_decoded_model_equal_to_fedavg_every_round(scheme, noise):
    cfg = RunConfig.from_flat(
        dict(
            scheme=scheme,
            hidden=(8,),
            clients=3,
            rounds=3,
            batch_size=128,
            seed=3,
            noise=noise,
            client_noise=True,
        )
    )
    with single_thread():
        result = run_federated(cfg)
    assert len(result.diff_vs_plain) == 3 and max(result.diff_vs_plain) <= 1e-9
    assert result.accuracy == result.accuracy_plain


@pytest.mark.parametrize("scheme", ["sifl-m1", "sifl-m2"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_client_noise_leaves_epsilon_local_and_adds_epsilon_difference_for_gaussian(scheme, noise):
    with single_thread():  # small dense keys: one BLAS thread is faster
        cfg_on = RunConfig.from_flat(
            dict(scheme=scheme, hidden=(1,), noise=noise, client_noise=True)
        )
        cfg_off = RunConfig.from_flat(dict(scheme=scheme, hidden=(1,), noise=noise))
        on = Server.create(cfg_on, task_from_config(cfg_on), [100, 150])
        off = Server.create(cfg_off, task_from_config(cfg_off), [100, 150])
    assert on.result.privacy["epsilon_local"] == pytest.approx(1.0)  # post-processing: unchanged
    assert "epsilon_difference" not in off.result.privacy  # noise-free: no finite epsilon
    if noise == "laplace":
        assert on.result.privacy["epsilon_difference"] is None  # no law to apply Theorem 1 to
    else:  # eq. 44 with sqrt(2) sigma_bar
        assert 0 < on.result.privacy["epsilon_difference"] < on.result.privacy["epsilon_local"]


@pytest.mark.parametrize("scheme", SIFL)
def test_client_noise_puts_private_noise_into_each_upload(scheme):
    cfg = RunConfig.from_flat(
        dict(scheme=scheme, rounds=1, clients=3, hidden=(8,), batch_size=256, client_noise=True)
    )
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    clients = task.clients(cfg, server.scheme.model_norm_bound)
    kit = server.scheme.kit
    received = server.scheme.broadcast(0)
    uploads = [server.scheme.client_upload(c, received, 0) for c in clients]
    left = kernel_noise(kit, uploads[0] - uploads[1])
    assert float(left.norm()) > 1e-3 * float(
        kernel_noise(kit, uploads[0]).norm()
    )  # noise left in the difference
    assert float(kit.decode(left).abs().max()) < 1e-9 * float(
        left.abs().max()
    )  # ... and it decodes away


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.5])
def test_bad_client_noise_values_name_the_option(bad):
    with pytest.raises(InvalidArgumentError, match="client_noise") as info:
        run_federated(
            RunConfig.from_flat(
                dict(scheme="sifl-m1", rounds=1, clients=2, hidden=(4,), client_noise=bad)
            )
        )
    assert info.value.argument == "client_noise"


@pytest.mark.parametrize("scheme", ["fedavg", "mpdp"])
def test_client_noise_is_refused_where_there_is_no_round_noise(scheme):
    if scheme not in fl_registry().fl_schemes:
        pytest.skip(f"{scheme} not registered")
    with pytest.raises(InvalidArgumentError, match="client_noise") as info:
        run_federated(
            RunConfig.from_flat(
                dict(scheme=scheme, rounds=1, clients=2, hidden=(4,), client_noise=True)
            )
        )
    assert info.value.argument == "client_noise"


def test_client_noise_is_refused_by_the_flower_engine():
    cfg = RunConfig.from_flat(
        dict(scheme="sifl-m1", rounds=1, clients=2, hidden=(4,), client_noise=True)
    )
    with pytest.raises(InvalidArgumentError, match="client_noise"):
        run_federated(cfg, engine="flower")  # refused before Flower starts
    with single_thread():
        server = Server.create(cfg, task_from_config(cfg), [10, 10])
    with pytest.raises(InvalidArgumentError, match="client_noise"):
        server.scheme.kit_arrays()  # the Flower handshake: refused, never silently dropped


def test_client_decodes_the_global_model_every_round():
    rows = run_client_decodes(quick=True, seed=0)
    assert {r.scheme for r in rows} == set(SIFL)
    for r in rows:
        assert r.verdict == "leaks" and r.value < 1e-9 < r.baseline
        assert r.detail["round_noise_relative_error"] < 1e-9
        assert "none in the scheme" in r.detail["mitigation"]


def test_m2_server_recovers_w_up_to_a_scalar_for_p_2_and_3():
    rows = run_m2_scalar_leak(quick=True, seed=0)
    assert [r.detail["p"] for r in rows] == [2, 3]
    for r in rows:
        assert r.verdict == "leaks" and r.value > 0.99 and r.baseline < 0.1
        assert r.detail["with_a_clients_pi2_right_error"] < 1e-9


def test_run_audit_filters_fl_rows_by_scheme():
    out = run_audit(scheme="sifl-m2", attack="m2-scalar-leak", quick=True)
    assert out["attacks"] and all(row["scheme"] == "sifl-m2" for row in out["attacks"])


def test_client_noise_only_delays_an_eavesdropper_that_estimates_range_n1():
    """Full-size setting for sifl-m1 (m = 201 noise dimensions, 5 m noisy differences):
    projecting out the top m principal directions recovers Pi1 (w_i - w_0) to a fraction of its
    size, from noise 10^4 times larger."""
    from immersion_fl.attacks import _difference_rows

    with single_thread():
        rows = _difference_rows("sifl-m1", hidden=(4,), clients=10, seed=0, pca_factor=5)
    (pca,) = [r for r in rows if "principal directions" in r.metric]
    assert pca.mitigation == "client-noise" and pca.verdict == "partial"
    assert (
        pca.value < 0.8
        and pca.baseline > 1e3
        and pca.detail["samples"] > 5 * pca.detail["noise_dims"]
    )
