"""SIFL with ``secure_aggregation``: still FedAvg round by round, dropouts recovered, and the
aggregator sees masked words only (issue 15, part 2)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")

from click.testing import CliRunner  # noqa: E402
from immersion import InvalidArgumentError  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion_fl.runtime import secure  # noqa: E402
from immersion_fl.runtime.engine import RunConfig, run_federated  # noqa: E402
from immersion_fl.runtime.faults import FaultPlan  # noqa: E402

SIFL = ("sifl-m1", "sifl-m2", "sifl-rm")
FAULTS = FaultPlan({(1, 1): "raise", (0, 2): "malformed", (2, 2): "no-recovery"})


def _cfg(scheme: str, secure_aggregation: bool = True, **extra) -> RunConfig:
    flags = dict(scheme=scheme, hidden=(16,), clients=4, rounds=3, batch_size=64, seed=1)
    return RunConfig.from_flat({**flags, "secure_aggregation": secure_aggregation, **extra})


@pytest.mark.parametrize("scheme", SIFL)
def test_secure_aggregation_decodes_to_fedavg_every_round(scheme):
    masked = run_federated(_cfg(scheme))
    clear = run_federated(_cfg(scheme, secure_aggregation=False))
    assert len(masked.diff_vs_plain) == 3
    assert max(masked.diff_vs_plain) <= 1e-9  # float64, every round
    assert masked.accuracy == masked.accuracy_plain == clear.accuracy
    assert float((masked.final_model - clear.final_model).abs().max()) <= 1e-12
    assert masked.summary()["secure_aggregation"] is True


@pytest.mark.parametrize("scheme", SIFL)
def test_dropouts_are_recovered_and_a_silent_survivor_retries_the_round(scheme):
    """Client 1 crashes after the key agreement (round 1) and client 0 uploads NaN (round 2):
    their masks are removed from the seeds their peers reveal; client 2 does not reveal in
    round 2, so that attempt is given up and retried with fresh keys among clients 1 and 3."""
    result = run_federated(_cfg(scheme), faults=FAULTS)
    assert max(result.diff_vs_plain) <= 1e-9
    assert {(d["round"], d["client"]) for d in result.dropped} == {(1, 1), (2, 0)}
    assert [(a["round"], a["silent"]) for a in result.aborted] == [(2, [2])]


def test_a_round_that_keeps_failing_recovery_is_given_up_with_a_named_error(monkeypatch):
    monkeypatch.setattr(secure, "MAX_ATTEMPTS", 1)
    with pytest.raises(secure.SecureAggregationError, match="round 2"):
        run_federated(_cfg("sifl-m1"), faults=FAULTS)


def test_what_the_aggregator_receives_is_masked():
    """The masked words of one client decode (as fixed point) to noise, unrelated to its upload,
    and the difference of two clients' masked uploads is no longer Pi1 (w_i - w_k)."""
    rng = np.random.default_rng(0)
    uploads = [torch.as_tensor(rng.normal(size=50)) for _ in range(3)]
    parties = [secure.new_party(k, 0) for k in range(3)]
    round_ = secure.SecureRound(0, [0, 1, 2], {0: 10, 1: 20, 2: 30}, {})
    round_.publics.update({k: p.public_bytes for k, p in enumerate(parties)})
    masked = {
        k: secure.masked_upload(p, uploads[k], round_.weight(k), round_.publics, 3)
        for k, p in enumerate(parties)
    }
    from immersion.securesum.protocol import from_fixed

    seen = from_fixed(masked[1]) - from_fixed(masked[0])
    truth = (20 * uploads[1] - 10 * uploads[0]).numpy() / 60
    assert np.abs(seen - truth).min() > 1e3  # nothing of the difference is left
    assert abs(np.corrcoef(seen, truth)[0, 1]) < 0.5
    total = round_.total(masked, {})
    expected = sum(round_.weight(k) * uploads[k] for k in range(3)).numpy()
    assert np.abs(total - expected).max() <= 1e-15
    assert round_.problem(masked[0][:-2], 50) and round_.problem(masked[0].view(np.int64), 50)


def test_an_upload_outside_the_fixed_point_range_is_refused_naming_it():
    party = secure.new_party(0, 0)
    publics = {0: party.public_bytes, 1: secure.new_party(1, 0).public_bytes}
    with pytest.raises(InvalidArgumentError, match="upload"):
        secure.masked_upload(party, torch.tensor([1e13]), 1.0, publics, 2)
    with pytest.raises(InvalidArgumentError, match="upload"):
        secure.masked_upload(party, torch.tensor([float("nan")]), 1.0, publics, 2)


def test_the_option_is_validated_and_refused_where_it_cannot_run():
    with pytest.raises(InvalidArgumentError, match="secure_aggregation") as info:
        _cfg("sifl-m1", secure_aggregation="yes")
    assert info.value.argument == "secure_aggregation"
    with pytest.raises(InvalidArgumentError, match="secure_aggregation"):
        RunConfig.from_flat(dict(scheme="fedavg", secure_aggregation=True))
    from flwr.serverapp.strategy import FedAvg
    from immersion_fl.flower.native import SiflStrategy

    with pytest.raises(InvalidArgumentError, match="secure_aggregation"):
        SiflStrategy(FedAvg(), "sifl-m1", secure_aggregation=True)


def test_the_python_api_and_the_cli_take_the_option():
    from immersion_fl import run

    net = torch.nn.Sequential(torch.nn.Linear(4, 3)).double()
    x = torch.randn(40, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    data = [(x[:20], (x[:20, 0] > 0).long()), (x[20:], (x[20:, 0] > 0).long())]
    out = run(
        net,
        data,
        scheme="sifl-m2",
        lr=0.1,
        rounds=2,
        local_epochs=1,
        batch_size=8,
        rng=0,
        compare_plain=True,
        secure_aggregation=True,
    )
    assert out.history.summary()["secure_aggregation"] and out.history.diff_vs_plain[-1] < 1e-12
    result = CliRunner().invoke(
        main,
        [
            "fl",
            "run",
            "--scheme",
            "sifl-rm",
            "--hidden",
            "8",
            "--clients",
            "3",
            "--rounds",
            "1",
            "--secure-aggregation",
            "--inject-fault",
            "1:0:raise",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    summary = json.loads(result.stdout)
    assert summary["secure_aggregation"] and summary["max_abs_diff_vs_plain"] <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SIFL)
def test_flower_engine_secure_aggregation_equals_fedavg_and_the_local_engine(scheme):
    """The same protocol over Flower messages (advertise, masked train, reveal), with the same
    faults: FedAvg within 1e-9, the same decisions and the same model as the local engine."""
    pytest.importorskip("flwr")
    cfg = _cfg(scheme)
    flower = run_federated(cfg, engine="flower", faults=FAULTS)
    local = run_federated(cfg, faults=FAULTS)
    assert max(flower.diff_vs_plain) <= 1e-9
    assert flower.accuracy == local.accuracy
    assert float((flower.final_model - local.final_model).abs().max()) <= 1e-12
    assert [(a["round"], a["silent"]) for a in flower.aborted] == [(2, [2])]
    assert {(d["round"], d["client"]) for d in flower.dropped} == {
        (d["round"], d["client"]) for d in local.dropped
    }
