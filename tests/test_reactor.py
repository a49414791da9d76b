"""Reactor case study (seed 002 SI-NCS): exactness, stabilisation, CLI, plots, remote mode."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from immersion.cli.main import main
from immersion_reactor.model import ReactorController, ReactorParameters
from immersion_reactor.simulation import ReactorDivergenceError, run_reactor, summary


@pytest.fixture(scope="module")
def paper_run():
    """2000 samples at h = 0.01 (20 s) from the paper's initial state, default epsilon."""
    return run_reactor(steps=2000, dt=0.01)


def test_decoded_control_equals_plain_every_sample(paper_run):
    scale = np.abs(paper_run.u_plain).max()
    assert scale > 1.0  # a real control signal, not zeros
    err = np.abs(paper_run.u_plain - paper_run.u_decoded)
    assert err.max() <= 1e-9 * scale
    assert paper_run.controller_state_error.max() <= 1e-9
    assert paper_run.report.epsilon_input == pytest.approx(1e-3)


def test_every_element_of_every_decode_is_within_its_own_bound(paper_run):
    assert paper_run.decode_within_bound.shape == (2000,) and paper_run.decode_within_bound.all()
    assert (paper_run.u_decode_error <= paper_run.u_decode_bound).all()
    assert (paper_run.state_decode_error <= paper_run.state_decode_bound).all()
    assert summary(paper_run)["decode_bound_holds"] is True


def test_immersed_loop_stabilises_the_plant_like_the_plain_loop(paper_run):
    final_plain, final_imm = (
        np.linalg.norm(x[-1]) for x in (paper_run.x_plain, paper_run.x_immersed)
    )
    assert final_plain < 1e-3 and final_imm < 1e-3
    assert np.abs(paper_run.x_plain - paper_run.x_immersed).max() < 1e-9
    assert np.linalg.norm(paper_run.x_plain[0]) > 1.0  # it started far from the origin


def test_literal_discrete_reading_diverges_as_the_notes_say():
    """eqs. 49-50 read as recursions (dt = 1) blow up within a few steps: hence the ODE reading."""
    ctrl = ReactorController(dt=1.0)
    x = ctrl.initial_state.copy()
    with np.errstate(all="ignore"):
        for _ in range(5):
            x = x + 1.0 * ctrl.rates(x, np.array([-0.5]))
    assert not np.isfinite(x).all() or np.abs(x).max() > 1e9


def test_large_sampling_period_ends_with_a_clear_error():
    with pytest.raises(ReactorDivergenceError, match="smaller --dt"):
        run_reactor(steps=200, dt=0.5)
    result = CliRunner().invoke(main, ["demo", "reactor", "--dt", "0.5", "--steps", "200"])
    assert (
        result.exit_code == 2
        and "Traceback" not in result.output
        and "smaller --dt" in result.output
    )


def test_parameters_are_overridable():
    slower = ReactorParameters(theta1=3.0, initial_state=(-0.2, 1.0))
    run = run_reactor(steps=300, dt=0.02, params=slower)
    assert run.x_plain[0].tolist() == [-0.2, 1.0]
    assert np.abs(run.u_plain - run.u_decoded).max() <= 1e-9 * max(1.0, np.abs(run.u_plain).max())


def test_cli_json_has_every_figure_and_plots_are_written(tmp_path):
    result = CliRunner().invoke(
        main, ["demo", "reactor", "--steps", "300", "--json", "--plot", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for key in (
        "steps",
        "max_abs_u",
        "drift_max_abs_u",
        "drift_max_rel_u",
        "drift_max_abs_plant_state",
        "drift_max_abs_controller_state",
        "decode_error_estimate",
        "decode_error_bound",
        "max_abs_decode_error",
        "decode_bound_holds",
        "decode_error_over_bound_median",
        "decode_error_over_bound_max",
        "final_state_norm_plain",
        "final_state_norm_immersed",
        "epsilon_input",
        "epsilon_output",
        "step_time_ratio",
    ):
        assert key in out
    assert out["steps"] == 300 and out["step_time_ratio"] > 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "fig08_measurement_encoded.png",
        "fig09_control_decoded.png",
        "fig10_decoding_error.png",
        "fig11_closed_loop_states.png",
        "fig12_running_time.png",
    ]
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_text_output_names_drift_and_per_decode_bound_apart():
    """The drift of the closed loop is never printed under the per-decode bound's heading."""
    result = CliRunner().invoke(main, ["demo", "reactor", "--steps", "50"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    drift = next(i for i, t in enumerate(lines) if t.startswith("drift of the decoded closed"))
    decode = next(i for i, t in enumerate(lines) if t.startswith("rounding of each single"))
    assert drift < decode
    drift_keys = {t.split()[0] for t in lines[drift + 1 : decode]}
    assert drift_keys == {
        "drift_max_abs_u",
        "drift_max_rel_u",
        "drift_max_abs_plant_state",
        "drift_max_abs_controller_state",
    }
    assert any(t.startswith("decode_error_bound ") for t in lines[decode + 1 :])
    assert not any("error" in t.split()[0] for t in lines[drift + 1 : decode])


def test_remote_mode_round_trip_on_loopback():
    """The CLI spawns `immersion serve`, ships the public matrices, then only encoded vectors."""
    result = CliRunner().invoke(main, ["demo", "reactor", "--steps", "200", "--remote", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["remote"] is True and out["address"].startswith("tcp://127.0.0.1:")
    assert out["drift_max_rel_u"] <= 1e-9
    assert 0 < out["round_trip_us_median"] <= out["round_trip_us_p99"]


def test_remote_server_refuses_unknown_algorithms_and_bad_vectors():
    pytest.importorskip("zmq")
    from immersion import immerse
    from immersion.remote.client import RemoteError, RemoteTarget
    from immersion.remote.server import Service

    with Service("tcp://127.0.0.1:*", log=lambda line: None) as service:
        address = service.address
        ctrl = ReactorController()
        imm = immerse(ctrl.f, ctrl.g, 3, 1, 1, rng=0, probe=(ctrl.initial_state, np.array([-0.5])))
        with pytest.raises(RemoteError, match="unknown algorithm"):
            RemoteTarget(address, imm, algorithm="not-registered", timeout_s=5)
        cloud = RemoteTarget(
            address, imm, algorithm="reactor-controller", params={"dt": 0.01}, timeout_s=5
        )
        xt, yt = imm.encode_state(ctrl.initial_state), imm.encode_input(np.array([-0.5]))
        ut, xt_next = cloud.advance(xt, yt)
        local_ut, local_xt = imm.target.advance(xt, yt)
        np.testing.assert_allclose(ut, local_ut, rtol=1e-15)
        np.testing.assert_allclose(xt_next, local_xt, rtol=1e-15)
        with pytest.raises(RemoteError, match="encoded_input"):
            cloud.advance(xt, yt[:2])
        cloud.close()
    assert not service._thread.is_alive()


def test_summary_reports_the_ratio_from_the_same_run(paper_run):
    out = summary(paper_run)
    assert out["step_time_ratio"] == pytest.approx(
        np.median(paper_run.step_s_immersed) / np.median(paper_run.step_s_plain)
    )


def test_cli_overrides_plant_parameters_and_refuses_unknown_ones():
    ok = CliRunner().invoke(
        main,
        ["demo", "reactor", "--steps", "100", "--json", "--set", "theta1=3", "--set", "x1_0=-0.2"],
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["drift_max_rel_u"] <= 1e-9
    bad = CliRunner().invoke(main, ["demo", "reactor", "--set", "nosuch=1"])
    assert bad.exit_code == 2 and "--set" in bad.output and "Traceback" not in bad.output
