"""The encrypted LQG demo and ``immersion bench control`` run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from immersion.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def test_encrypted_lqg_demo(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "control_demos" / "encrypted_lqg.py"), "--steps", "150",
         "--plot", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["bit_identical_to_twin"] is True and result["security_bits"] == 128
    assert result["max_rel_u_error"] < 1e-3 and result["precision_proven"] <= 1e-4
    assert result["noise_margin_bits"] > 0
    assert (tmp_path / "encrypted_lqg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_control_quick_json(tmp_path, monkeypatch):
    import immersion.bench.control as bench

    monkeypatch.setattr(bench, "FRONTIER", (1e-3, 1e-15))  # one point, one refusal
    saved = tmp_path / "control.json"
    result = CliRunner().invoke(
        main,
        ["bench", "control", "--quick", "--eclib-dims", "", "--json", "--out", str(saved)],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert json.loads(saved.read_text()) == out  # --out saves the same object
    row = out["lwe"]
    assert row["degree"] == 4096 and row["security_bits"] == 128 and row["bit_identical_to_twin"]
    assert row["total_s"] == pytest.approx(
        row["plant_offline_s"] + row["plant_online_s"] + row["cloud_s"]
    )
    assert row["one_step_error_measured"] <= row["precision_proven"]
    assert out["ratio_lwe_total_over_plain"] == pytest.approx(row["total_s"] / out["plain_s"])
    (point, refused) = out["frontier"]
    assert point["precision_proven"] <= 1e-3 and "smallest proven" in refused["refused"]
    assert [o["n_state"] for o in out["orders"]] == [2, 4, 6, 8]
    assert len({(o["bytes_up"], o["bytes_down"]) for o in out["orders"]}) == 1
    assert out["eclib_gsw_lwe"] == []


def test_bench_control_refuses_bad_dimensions():
    result = CliRunner().invoke(main, ["bench", "control", "--eclib-dims", "10,x"])
    assert result.exit_code == 2 and "--eclib-dims" in result.output
    result = CliRunner().invoke(main, ["bench", "control", "--eclib-dims", "8,4"])
    assert result.exit_code == 2 and "ascending" in result.output
