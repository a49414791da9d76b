"""``immersion bench core``: the structured transforms' profile beside a memory-bandwidth floor."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from immersion.bench.core import bench_core, transform_profile
from immersion.cli.main import main


def test_block_rows_profile_every_transform_call_and_dense_rows_have_none():
    result = bench_core(sizes=((3, "dense"), (300, "block")), steps=5, repeats=1)
    rows = result["results"]
    assert [r["keys"] for r in rows] == ["dense"] * 2 + ["block"] * 2  # two workloads each
    assert all(r["transforms"] is None for r in rows[:2])
    for row in rows[2:]:
        q = row["transforms"]
        # encode_input, target.output, target.step and decode_output all go through Q or Q^T
        assert q["transforms_per_step"] >= 4 and q["transforms_per_step"] == int(
            q["transforms_per_step"]
        )
        assert q["transform_bytes_per_step"] >= q["transforms_per_step"] * 300 * 32 * 8
        assert 0 < q["transform_share"] and q["copy_s_same_bytes"] > 0
        assert row["max_abs_state_error"] < 1e-9


def test_profile_counts_the_calls_and_leaves_the_transforms_as_they_were():
    from immersion import immerse

    imm = immerse(lambda x, y: x, lambda x, y: x, 200, 1, 200, keys="block", rng=1)
    transform = imm.target._state_in._transform
    calls = []

    def one_step():
        calls.append(1)
        imm.target.step(imm.encode_state(np.ones(200)), imm.encode_input(np.zeros(1)))

    profile = transform_profile(imm, one_step, steps=3, repeats=2)
    assert len(calls) == 6
    # per step: encode_state (Q2), encode_input (Q1), step: Q2^T, Q1^T, Q2 -> 5 transforms
    assert profile is not None and profile["transforms_per_step"] == 5
    assert "forward" not in vars(transform) and "adjoint" not in vars(transform)


def test_cli_bench_core_quick_prints_a_table_and_json():
    runner = CliRunner()
    table = runner.invoke(main, ["bench", "core", "--quick", "--steps", "5", "--repeats", "1"])
    assert table.exit_code == 0, table.output
    assert "Q_share" in table.output
    out = runner.invoke(
        main, ["bench", "core", "--quick", "--steps", "5", "--repeats", "1", "--json"]
    )
    rows = json.loads(out.stdout)["results"]
    assert all(r["transforms"] is None for r in rows)  # --quick: dense keys only
