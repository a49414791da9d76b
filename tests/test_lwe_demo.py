"""The encrypted LQG demo and ``immersion bench control`` run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from immersion.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_encrypted_lqg_demo(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "control_demos" / "encrypted_lqg.py"), "--steps", "300",
         "--modulus-bits", "104", "--plot", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    result = json.loads(out.stdout)
    assert result["bit_identical_to_twin"] is True
    assert result["max_rel_u_error"] < 1e-6 and result["security_bits"] == 128
    assert result["headroom_bits"] > 0 and result["noise_bound"] > 1 << result["scale_bits"]
    assert (tmp_path / "encrypted_lqg.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_control_quick_json(tmp_path):
    saved = tmp_path / "control.json"
    result = CliRunner().invoke(
        main,
        ["bench", "control", "--quick", "--eclib-budget", "0.2", "--hidden-samples", "0", "--json",
         "--out", str(saved)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert json.loads(saved.read_text()) == out  # --out saves the same object
    rows = out["rows"]
    assert set(rows) == {"plain", "immerse", "lwe", "lwe-wide", "lwe-hidden-gains"}
    assert rows["lwe-hidden-gains"] == {"skipped": "hidden_samples = 0"}
    assert rows["lwe"]["dimension"] == 4096 and rows["lwe"]["security_bits"] == 128
    assert rows["lwe"]["bit_identical_to_twin"] and rows["lwe-wide"]["bit_identical_to_twin"]
    assert rows["lwe"]["per_sample_s"] == pytest.approx(
        rows["lwe"]["plant_s"] + rows["lwe"]["cloud_s"]
    )
    if out["note"] is None:  # ECLib installed: one dimension, ours beside it
        (c,) = out["eclib"]
        assert c["dimension"] == 10 and c["lwe_same_dimension"]["security_bits"] is None
        assert c["ratio_eclib_over_lwe"] == pytest.approx(
            c["eclib"]["per_sample_s"] / c["lwe_same_dimension"]["per_sample_s"]
        )


def test_bench_control_skips_eclib_with_a_note(monkeypatch):
    import immersion.lwe.benchmark as bench

    monkeypatch.setattr(bench, "eclib_available", lambda: False)
    out = bench.bench_control(steps=20, repeats=1, eclib_dimensions=(10,), hidden_samples=0)
    assert out["eclib"] == [] and "eclib not installed" in out["note"]


def test_bench_control_refuses_bad_dimensions():
    result = CliRunner().invoke(main, ["bench", "control", "--eclib-dims", "10,x"])
    assert result.exit_code == 2 and "--eclib-dims" in result.output
