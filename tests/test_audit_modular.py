"""Eavesdropper attacks on modular coding (THREAT_MODEL.md): what they must and must not find."""

from __future__ import annotations

import numpy as np
import pytest
from immersion import immerse
from immersion.audit.eavesdropper import SCALAR, VECTOR, aligned_recovery
from immersion.audit.modular import known_plaintext_attack_mod, lattice_attack
from immersion.audit.runner import run_audit
from immersion.integer import encode_fixed, to_signed


def _stream(case, n, fraction_bits, seed):
    ys = case.signal(n, np.random.default_rng(seed))
    imm = immerse(
        case.f, case.g, **case.dims(), arithmetic="modular", fraction_bits=fraction_bits, rng=seed
    )
    return ys, imm.encode_input(ys)


@pytest.mark.parametrize("case", [SCALAR, VECTOR], ids=["scalar", "vector"])
def test_known_pairs_give_pi1_left_exactly_by_elimination_mod_2_64(case):
    ys, enc = _stream(case, 60, 32, 1)
    q = encode_fixed(ys, 32)
    n_tot = case.n_encoded
    with pytest.raises(np.linalg.LinAlgError):
        known_plaintext_attack_mod(q[: n_tot - 1][:1].repeat(n_tot, 0), enc[:1].repeat(n_tot, 0))
    L = known_plaintext_attack_mod(q[:20], enc[:20])
    assert np.array_equal(enc[20:] @ L.T, q[20:])  # every later encoding, bit for bit


def test_lattice_reduction_recovers_small_fixed_point_values_up_to_sign():
    pytest.importorskip("fpylll")
    ys, enc = _stream(SCALAR, 40, 32, 2)
    est = lattice_attack(enc, n_signal=1)[:, 0]
    q = to_signed(encode_fixed(ys, 32))[:, 0].astype(np.float64)
    assert np.array_equal(est, q) or np.array_equal(-est, q)


@pytest.mark.parametrize("case", [SCALAR, VECTOR], ids=["scalar", "vector"])
def test_lattice_reduction_finds_nothing_when_values_fill_the_64_bit_range(case):
    pytest.importorskip("fpylll")
    ys, enc = _stream(case, 40, 61, 3)
    value = aligned_recovery(lattice_attack(enc, n_signal=case.n_input), ys)
    assert value < 0.6, value  # 1.0 at fraction_bits=32 (test above and the audit rows)


def test_audit_rows_for_modular_coding():
    pytest.importorskip("fpylll")
    rows = run_audit(scheme="immerse-modular", quick=True)["attacks"]
    assert all(r["scheme"] == "immerse-modular" for r in rows) and len(rows) == 8
    kpa = [r for r in rows if r["attack"] == "known-plaintext"]
    assert all(r["verdict"] == "leaks" and r["detail"]["fresh_decoded_bit_for_bit"] for r in kpa)
    pca = [r for r in rows if "PCA" in r["metric"]]
    assert len(pca) == 2 and all(r["verdict"] == "resists" for r in pca)
    lll = [r for r in rows if "lattice" in r["metric"]]
    assert {r["verdict"] for r in lll if r["mitigation"] is None} == {"leaks"}
    assert {r["verdict"] for r in lll if r["mitigation"]} == {"resists"} and len(lll) == 4
