"""Kinds of cloud target ``immersion serve`` runs: set up from public arrays, advanced per sample.

Each kind is one :class:`TargetKind` in :data:`TARGET_KINDS`, keyed by the ``coding`` attribute
of the user's handle (``"immersion"`` when it has none):

* the user side calls ``public_arrays(imm)`` for what the cloud needs (never a secret key);
* the server calls ``build(header, arrays)`` and gets an object with
  ``advance(encoded_state, encoded_input) -> (encoded_output, next_encoded_state)``,
  ``n_state_encoded`` and ``n_input_encoded``;
* vectors travel as raw bytes of ``wire_dtype``.

A linear controller made by :func:`~immersion.immerse_system` travels as data (kinds ``linear``
and ``linear-modular``, :mod:`immersion.remote.linear`); any other ``f``, ``g`` is code, which
never travels: the server builds it from an algorithm registered by a plugin.

A new coding (an integer or lattice target) adds one entry here; the session layer, transport,
keys and limits stay the same.

Examples
--------
>>> sorted(TARGET_KINDS)
['immersion', 'linear', 'linear-modular', 'lwe']
>>> TARGET_KINDS["immersion"].wire_dtype
<class 'numpy.float64'>
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import InvalidArgumentError
from .linear import (
    LINEAR_ARRAYS,
    LINEAR_MODULAR_ARRAYS,
    is_linear,
    linear_arrays,
    linear_modular_arrays,
    linear_modular_target,
    linear_target,
)

#: The dense matrices of seed 002 eq. 17 that a remote cloud receives (never N1, Pi3_left, noise).
PUBLIC_MATRICES = ("Pi1_left", "Pi2", "Pi2_left", "Pi3", "Pi4")


class CloudTarget(Protocol):
    """What the server needs of a target: its sizes and one sample's ``advance``."""

    n_state_encoded: int
    n_input_encoded: int

    def advance(self, encoded_state: Any, encoded_input: Any) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class TargetKind:
    """One kind of cloud target (see the module docstring).

    Parameters
    ----------
    name:
        The ``coding`` of the handles it serves, sent in the set-up header.
    wire_dtype:
        numpy dtype of ``x~``, ``y~``, ``u~`` on the wire.
    public_arrays:
        User side: ``public_arrays(imm)``, the arrays the cloud needs.
    build:
        Server side: ``build(header, arrays)``, the target.
    needs_algorithm:
        True if the set-up names a registered algorithm (the server builds ``f``, ``g`` from its
        own plugins, never from code on the wire).
    array_names:
        The names ``public_arrays`` returns: the server reads exactly these from a set-up or
        a rekey and refuses any other (None: any distinct names, at most 64).
    replay_depth:
        None: the state travels with every sample (the client holds it). Otherwise the server
        keeps the session's state (it starts at zero) and ``replay_depth(imm)`` is how many of
        the last encoded inputs rebuild it: a client resuming after a server restart sends them
        again before its next sample.
    """

    name: str
    wire_dtype: Any
    public_arrays: Callable[[Any], dict[str, np.ndarray]]
    build: Callable[[dict[str, Any], dict[str, np.ndarray]], CloudTarget]
    needs_algorithm: bool = False
    array_names: frozenset[str] | None = None
    replay_depth: Callable[[Any], int] | None = None


def public_target_matrices(keys: Any) -> dict[str, np.ndarray]:
    """The matrices the cloud needs for eq. 17 (dense keys only: remote mode ships them once)."""
    if keys.kind != "dense":
        raise InvalidArgumentError(
            "keys", "remote mode ships dense target matrices; use keys='dense'"
        )
    return {name: np.ascontiguousarray(getattr(keys, name)) for name in PUBLIC_MATRICES}


def _immersion_arrays(imm: Any) -> dict[str, np.ndarray]:
    return public_target_matrices(imm.keys)


def _immersion_target(header: dict[str, Any], matrices: dict[str, np.ndarray]) -> CloudTarget:
    """Seed 002 eq. 17 from the five public matrices and a registered algorithm's ``f``, ``g``."""
    from ..backends import make_backend
    from ..coding.probing import uses_public
    from ..coding.target import CheckedFunction, TargetAlgorithm
    from ..plugins.manager import registry

    name = header.get("algorithm")
    if not isinstance(name, str):
        raise InvalidArgumentError("algorithm", f"expected a registered name, got {name!r}")
    if name not in registry().algorithms:
        raise InvalidArgumentError(
            "algorithm",
            f"unknown algorithm {name!r} on this server (registered: "
            f"{sorted(registry().algorithms)})."
            f" No code travels: {UNREGISTERED_HINT}",
        )
    spec = registry().algorithm(name)
    params = header.get("params") or {}
    if not isinstance(params, dict):
        raise InvalidArgumentError("params", "expected a JSON object")
    missing = [m for m in PUBLIC_MATRICES if m not in matrices]
    if missing:
        raise InvalidArgumentError("setup", f"missing matrices {missing}")
    try:
        algo = spec.build(**params)
    except TypeError as exc:
        raise InvalidArgumentError("params", f"{name!r} does not take them ({exc})") from None
    be = make_backend("numpy", dtype=None, device=None)
    f = CheckedFunction(algo.f, "f", algo.n_state, uses_public(algo.f, "f"), be)
    g = CheckedFunction(algo.g, "g", algo.n_output, uses_public(algo.g, "g"), be)
    arrays = {m: np.asarray(matrices[m], dtype=np.float64) for m in PUBLIC_MATRICES}
    return TargetAlgorithm.from_matrices(f=f, g=g, backend=be, **arrays)


def _lwe_arrays(imm: Any) -> dict[str, np.ndarray]:
    """The encrypted coefficients and public sizes of an LWE handle's target (never its key)."""
    return imm.target.public_arrays()


def _lwe_target(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> CloudTarget:
    """An encrypted controller (:mod:`immersion.lwe`) from its public arrays."""
    from ..lwe import ControllerTarget

    return ControllerTarget.from_public_arrays(arrays)


#: How to serve an ``f``, ``g`` of one's own (said by every error about a missing algorithm).
UNREGISTERED_HINT = (
    "an arbitrary f, g runs on a server only as an algorithm registered there by a plugin "
    "(hook immersion_register_algorithms of immersion.plugins.hookspecs, installed on the server "
    "under the 'immersion' entry-point group; plugins/immersion_reactor is one); a linear "
    "controller made with immerse_system(StateSpace or (A, B, C, D)) needs none (target "
    "kinds 'linear', 'linear-modular', 'lwe')"
)

#: The kinds this installation serves, by ``coding``.
TARGET_KINDS: dict[str, TargetKind] = {
    "immersion": TargetKind(
        "immersion",
        np.float64,
        _immersion_arrays,
        _immersion_target,
        needs_algorithm=True,
        array_names=frozenset(PUBLIC_MATRICES),
    ),
    "linear": TargetKind(
        "linear",
        np.float64,
        linear_arrays,
        linear_target,
        array_names=frozenset(LINEAR_ARRAYS),
    ),
    "linear-modular": TargetKind(
        "linear-modular",
        np.uint64,
        linear_modular_arrays,
        linear_modular_target,
        array_names=frozenset(LINEAR_MODULAR_ARRAYS),
    ),
    "lwe": TargetKind(
        "lwe",
        np.uint32,
        _lwe_arrays,
        _lwe_target,
        array_names=frozenset(("header", "primes", "prg", "theta_b", "theta_a")),
        replay_depth=lambda imm: int(imm.design.window),  # the encrypted history, kept there
    ),
}


def kind_of(
    imm: Any, kinds: dict[str, TargetKind] | None = None, *, algorithm: str | None = None
) -> TargetKind:
    """The kind of a user handle, from its ``coding`` attribute (``"immersion"`` by default).

    A handle of a linear controller (``immerse_system`` of a ``StateSpace`` or ``(A, B, C, D)``)
    is ``"linear"`` (float) or ``"linear-modular"``, unless ``algorithm`` names a registered one.

    Parameters
    ----------
    imm:
        The user's handle (:class:`~immersion.Immersion` or another coding's).
    kinds:
        The table to look in (default :data:`TARGET_KINDS`).
    algorithm:
        The registered algorithm the caller names, if any.

    Returns
    -------
    TargetKind
    """
    table = TARGET_KINDS if kinds is None else kinds
    coding = getattr(imm, "coding", "immersion")
    if coding == "immersion" and algorithm is None and is_linear(imm):
        coding = "linear-modular" if getattr(imm.keys, "arithmetic", "") == "modular" else "linear"
    if coding not in table:
        raise InvalidArgumentError(
            "imm", f"remote mode has no target kind for coding {coding!r}; known: {sorted(table)}"
        )
    return table[coding]
