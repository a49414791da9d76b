"""Seeded keys: a seeded ``rng`` with the cryptographic coding (``coding="lwe"``) warns once per
process with :class:`~immersion.errors.ImmersionSecurityWarning`; OS-entropy keys do not warn;
every coding's handle accepts the same key options (``rng``, ``secure``) and has ``report()``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from immersion import immerse_system
from immersion.coding import keygen
from immersion.errors import ImmersionSecurityWarning

SYSTEM = (
    np.array([[0.9, 0.1], [0.0, 0.8]]),
    np.array([[0.0], [1.0]]),
    np.array([[1.0, 0.0]]),
    np.zeros((1, 1)),
)
LWE = {"coding": "lwe", "input_range": 1.0, "output_range": 5.0}
CODINGS = {
    "float": {},
    "modular": {"arithmetic": "modular"},
    "lwe": LWE,
    "lwe-hide-gains": {**LWE, "hide_gains": True},  # once refused rng and had no report()
}


@pytest.fixture
def fresh_process(monkeypatch):
    """As if no seeded key had warned yet in this process."""
    monkeypatch.setattr(keygen, "_WARNED_SEEDED", set())


def _security_warnings(**options) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        immerse_system(SYSTEM, **options)
    return [w for w in seen if issubclass(w.category, ImmersionSecurityWarning)]


def test_a_seeded_lwe_key_warns_once_per_process(fresh_process):
    with pytest.warns(ImmersionSecurityWarning, match="seeded rng.*secure=True"):
        immerse_system(SYSTEM, rng=0, **LWE)
    assert _security_warnings(rng=1, **LWE) == []  # once per process
    assert issubclass(ImmersionSecurityWarning, UserWarning)


@pytest.mark.parametrize("key_options", [{}, {"secure": True}])
def test_os_entropy_lwe_keys_do_not_warn(fresh_process, key_options):
    assert _security_warnings(**key_options, **LWE) == []


@pytest.mark.parametrize("coding", ["float", "modular"])
def test_the_immersion_codings_do_not_warn_on_seeds(fresh_process, coding):
    """Their guarantees are per-element DP / uniformity, not a computational key (docs)."""
    assert _security_warnings(rng=0, **CODINGS[coding]) == []


@pytest.mark.parametrize("coding", sorted(CODINGS))
@pytest.mark.parametrize("key_options", [{}, {"rng": 3}, {"secure": True}])
def test_every_handle_takes_the_same_key_options_and_reports(coding, key_options):
    handle = immerse_system(SYSTEM, **key_options, **CODINGS[coding])
    assert handle.report() is not None
    with pytest.raises(ValueError, match="rng"):
        immerse_system(SYSTEM, rng=0, secure=True, **CODINGS[coding])
