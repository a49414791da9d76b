"""MP-DP on Flower's simulation runtime (seed 004): the same rounds as the in-process engine,
message by message.

Each Flower run starts Ray and its workers (about 20 s on two cores), so the noise-off tests share
one run: round 0 without faults, round 1 with a dropped client (recovery of its pairwise masks),
round 2 with a dropped client and a neighbour that does not reveal (abort, retry with fresh keys).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("cryptography")
pytest.importorskip("flwr")

from immersion_fl.runtime.engine import RunConfig  # noqa: E402
from immersion_fl.runtime.faults import FaultPlan  # noqa: E402
from immersion_mpdp import engine, runner  # noqa: E402

NOISE_OFF = RunConfig.from_flat(
    dict(
        scheme="mpdp", noise="off", mask_corrections=True, hidden=(16,), clients=3, rounds=3, seed=3
    )
)
FAULTS = FaultPlan({(1, 1): "raise", (2, 2): "raise", (0, 2): "no-recovery"})


def _run(cfg, engine_name, faults):
    """The run and the server's weights after every round (both engines record them alike)."""
    weights = []
    record = engine.record

    def spy(result, setup, t, w, *args, **kwargs):
        weights.append([x.clone() for x in w])
        return record(result, setup, t, w, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "record", spy)
        result = runner.run_mpdp(cfg, engine=engine_name, faults=faults)
    return result, weights


@pytest.fixture(scope="module")
def noise_off_runs():
    return _run(NOISE_OFF, "flower", FAULTS), _run(NOISE_OFF, "local", FAULTS)


@pytest.mark.slow
def test_flower_mpdp_without_noise_is_fedsgd_and_the_local_engine(noise_off_runs):
    (flower_run, flower_w), (local_run, local_w) = noise_off_runs
    assert len(flower_run.accuracy) == len(flower_w) == 3
    assert max(flower_run.diff_vs_plain) < 1e-9
    for w_flower, w_local in zip(flower_w, local_w, strict=True):
        assert (
            max(float((a - b).abs().max()) for a, b in zip(w_flower, w_local, strict=True)) <= 1e-12
        )
    assert (
        flower_run.accuracy == local_run.accuracy
        and flower_run.accuracy_plain == local_run.accuracy_plain
    )
    assert flower_run.upload_bytes == local_run.upload_bytes
    assert {"server_mp", "client_lmt", "client_ddp", "server_recover"} <= set(flower_run.phase_s)


@pytest.mark.slow
def test_flower_mpdp_recovers_dropped_clients_and_retries_aborted_rounds(noise_off_runs):
    """Round 1: client 1 crashes after the key agreement; its neighbours reveal their pair seeds and
    the masked corrections are recovered. Round 2: client 2 crashes and client 0 does not reveal, so
    the round is aborted and retried with fresh keys among the others (client 1 alone)."""
    (flower_run, _), (local_run, _) = noise_off_runs
    assert [(d["round"], d["client"]) for d in flower_run.dropped] == [(1, 1), (2, 2)]
    assert all("injected fault" in d["reason"] for d in flower_run.dropped)
    assert [(a["round"], a["attempt"]) for a in flower_run.aborted] == [(2, 1)]
    assert flower_run.aborted[0]["reason"].startswith(
        "client 0 did not reveal its seeds for dropped client 2"
    )
    assert flower_run.diff_vs_plain[1] < 1e-9 and flower_run.diff_vs_plain[2] < 1e-9
    assert [(d["round"], d["client"]) for d in local_run.dropped] == [(1, 1), (2, 2)]
    assert [(a["round"], a["attempt"]) for a in local_run.aborted] == [(2, 1)]


@pytest.mark.slow
def test_flower_mpdp_with_noise_reports_its_privacy():
    cfg = RunConfig.from_flat(
        dict(scheme="mpdp", noise="on", epsilon=1.0, hidden=(8,), clients=3, rounds=1, seed=1)
    )
    result = runner.run_mpdp(cfg, engine="flower")
    summary = result.summary()
    assert summary["noise"] == "on" and summary["epsilon"] == pytest.approx(1.0)
    assert summary["sigma_eta"] > 0 and len(result.sensitivity_observed) == 1
    assert len(result.accuracy) == 1 and not result.dropped
    assert result.diff_vs_plain[0] > 0  # the DP noise eta stays; only the pairwise Delta cancel
