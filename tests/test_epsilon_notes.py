"""Summaries explain a proven epsilon that differs from the requested one, and what the
sensitivities assume; the reactor summary explains an estimate above the decode bound."""

from __future__ import annotations

import numpy as np
import pytest
from immersion import immerse


def _immersion(**options):
    return immerse(
        lambda x, y: 0.5 * x + y, lambda x, y: x, 1, 1, 1, extra_input=8, rng=0, **options
    )


def test_the_note_names_both_figures_and_the_ratio_when_they_differ():
    report = _immersion().report()
    assert report.epsilon_input_proven > report.epsilon_input
    note = report.epsilon_note()
    assert f"epsilon_input {report.epsilon_input:.3g} -> proven" in note
    assert f"{report.epsilon_input_proven:.3g}" in note
    assert "Theorem 1" in note and "||N1^i||_2 / ||N1^i||_inf" in note
    # the ratio it names is the keys' own: proven / designed = max over rows of l2 / linf
    n1 = _immersion().keys.N1
    ratio = np.linalg.norm(n1, axis=1) / np.abs(n1).max(axis=1)
    assert report.epsilon_input_proven / report.epsilon_input <= ratio.max() * (1 + 1e-9)


def test_no_note_where_proven_equals_designed():
    report = _immersion(noise="gaussian", delta_input=1e-5, delta_output=1e-5).report()
    assert report.epsilon_input_proven == report.epsilon_input
    assert report.epsilon_note() == ""


def test_the_siml_summary_explains_its_epsilons_and_sensitivities():
    pytest.importorskip("torch")
    from immersion_siml.run import privacy_figures

    class User:
        def report(self):
            return _immersion().report()

    figures = privacy_figures(User())
    assert "proven" in figures["epsilon_note"]
    assert "Delta^w = C = 1000" in figures["sensitivity_note"]
    assert "not enforced" in figures["sensitivity_note"]


def test_the_reactor_summary_explains_estimate_versus_bound():
    from immersion_reactor.simulation import run_reactor, summary

    out = summary(run_reactor(steps=30))
    assert "decode_error_estimate models the error of a whole step" in out["decode_error_note"]
    assert out["decode_bound_holds"]
    assert ("proven" in out["epsilon_note"]) == (out["epsilon_input_proven"] > out["epsilon_input"])


def test_the_lwe_report_says_its_precision_is_one_step():
    from immersion.lwe import encrypt_controller

    ctrl = encrypt_controller(
        ([[0.5]], [[1.0]], [[0.3]], [[0.0]]), input_range=1, output_range=1, secure=True
    )
    report = ctrl.report()
    assert report["precision"] == ctrl.design.precision
    assert "ONE sample" in report["precision_scope"]
    assert "closed loop" in report["precision_scope"]
