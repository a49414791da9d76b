"""The eavesdropper's attacks against the modular immersion (scheme ``"immerse-modular"``).

With ``arithmetic="modular"`` every input crosses the link as ``y~_k = Pi1 q(y_k) + N1 s_k``
modulo ``2^64`` (:mod:`immersion.coding.modular`); each element is uniform (per-element epsilon 0),
but the key is fixed, so the two stream attacks of :mod:`.eavesdropper` have integer analogues:

* ``known-plaintext``: ``Pi1_left y~ = q(y)`` for every encoding, so ``K`` pairs
  ``(q(y_k), y~_k)`` whose ``y~_k`` span ``(Z/2^64)^n~`` (full rank modulo 2, needs
  ``K >= n~ = n_input + extra_input``, a few more when the first ones are dependent modulo 2)
  determine ``L = Pi1_left`` by Gauss-Jordan elimination with odd pivots
  (:func:`known_plaintext_attack_mod`); ``L`` then decodes every later encoding bit for bit.
* ``subspace`` has two rows: PCA as in the float audit (on the encodings read as numbers in
  ``[0, 2^64)``: they look uniform, nothing is found), and lattice reduction
  (:func:`lattice_attack`): for every integer row ``l`` with ``l N1 = 0 (mod 2^64)``,
  ``(l y~_1, ..., l y~_K) = (l Pi1) (q(y_1), ..., q(y_K)) (mod 2^64)``. The rows of ``Pi1_left``
  give ``K``-vectors of entries ``|q| ~ 2^f |y|``, while a random vector of the lattice
  ``{(l y~_k)_k mod 2^64}`` (determinant ``2^(64 (K - n~))``) has entries near
  ``2^(64 (1 - n~/K))``. When ``2^f |y|`` is far below that, LLL (fpylll) returns the planted
  vectors: ``q(y)`` up to an unknown ``n_input x n_input`` integer map (for scalar ``y``: up to
  sign). Filling the 64-bit range (``fraction_bits`` near ``62 - log2 max|y|``) removes the gap;
  the row with that setting measures it.

Each ``run_*`` returns :class:`immersion.audit.runner.AttackResult` rows for the same scalar and
vector controllers as the float audit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..coding.factory import immerse
from ..errors import InvalidArgumentError, OptionalDependencyError
from ..integer import (
    as_uint64,
    decode_fixed,
    encode_fixed,
    solve_mod,
    to_signed,
)
from .eavesdropper import (
    EXTRA_INPUT,
    KPA_LEAK,
    KPA_RESIST,
    SCALAR,
    VECTOR,
    _best_raw,
    _Case,
    _subspace_verdict,
    aligned_recovery,
    relative_error,
    subspace_attack,
)
from .runner import AttackResult

SCHEME = "immerse-modular"
#: ``fraction_bits`` of the audited design (``immerse``'s default) and of the "fill the range"
#: setting: |y| < 2 in the audited signals, so q(y) reaches 2^62 at 61 bits.
FRACTION_BITS, FILLING_FRACTION_BITS = 32, 61


# ---------------------------------------------------------------- the attacks
def known_plaintext_attack_mod(plain_fixed: Any, encoded: Any) -> np.ndarray:
    """``L`` with ``L y~_k = q_k (mod 2^64)`` for every pair, by elimination modulo ``2^64``.

    Parameters
    ----------
    plain_fixed:
        ``(K, n_input)`` fixed-point values ``q(y_k)`` (``uint64``), e.g. from
        :func:`immersion.integer.encode_fixed`.
    encoded:
        ``(K, n~)`` encodings ``y~_k`` (``uint64``).

    Returns
    -------
    ``(n_input, n~)`` ``uint64`` matrix; with pairs spanning ``(Z/2^64)^n~`` it is ``Pi1_left``.
    Raises :class:`numpy.linalg.LinAlgError` when the encodings do not have full rank modulo 2
    (too few pairs).

    Examples
    --------
    >>> import numpy as np
    >>> from immersion import immerse
    >>> from immersion.integer import encode_fixed
    >>> imm = immerse(lambda x, y: x, lambda x, y: x, 1, 1, 1, arithmetic="modular", rng=0)
    >>> y = np.sin(np.arange(20.0))[:, None]
    >>> yt = imm.encode_input(y)
    >>> L = known_plaintext_attack_mod(encode_fixed(y[:8], 32), yt[:8])
    >>> bool((yt[8:] @ L.T == encode_fixed(y[8:], 32)).all())          # exact on fresh encodings
    True
    """
    q, enc = as_uint64("plain_fixed", plain_fixed), as_uint64("encoded", encoded)
    if q.ndim != 2 or enc.ndim != 2 or q.shape[0] != enc.shape[0]:
        raise InvalidArgumentError(
            "plain_fixed",
            f"expected (K, n) values for (K, n~) encodings, got {q.shape}, {enc.shape}",
        )
    return np.ascontiguousarray(solve_mod(enc, q).T)


def _fpylll() -> Any:
    try:
        import fpylll
    except ImportError:
        raise OptionalDependencyError(
            "fpylll", "lattice", "The lattice-reduction attack on modular encodings"
        ) from None
    return fpylll


def lattice_available() -> bool:
    """True if fpylll (extra ``lattice``) can be imported."""
    try:
        _fpylll()
    except OptionalDependencyError:
        return False
    return True


def lattice_attack(encoded: Any, *, n_signal: int) -> np.ndarray:
    """LLL on the lattice ``{(l y~_1, .., l y~_K) mod 2^64 : l integer}``: its shortest rows.

    Parameters
    ----------
    encoded:
        ``(K, n~)`` encodings under one key, ``K > n~``.
    n_signal:
        ``n_input`` (the design's ``n~ - extra_input``; not secret).

    Returns
    -------
    ``(K, n_signal)`` float64 estimate: the shortest vectors of the LLL-reduced basis, as
    columns. For small fixed-point values it is ``q(y) M`` with ``M`` an unknown integer matrix.

    The lattice is generated by the ``n~`` columns of the stream and ``2^64`` times the unit
    vectors; LLL (fpylll) reduces the generating set (linear dependencies become zero rows).
    """
    enc = as_uint64("encoded", encoded)
    if enc.ndim != 2 or enc.shape[0] <= enc.shape[1]:
        raise InvalidArgumentError(
            "encoded", f"expected (K, n~) encodings with K > n~, got shape {enc.shape}"
        )
    n_samples, n_total = enc.shape
    if not 1 <= n_signal < n_total:
        raise InvalidArgumentError("n_signal", f"expected 1 <= n_signal < {n_total}")
    fpylll = _fpylll()
    modulus = 1 << 64
    # generators: the n~ rows (l = e_i) and 2^64 e_k; fplll's LLL drops the dependencies
    rows = [[int(x) for x in column] for column in enc.T]
    rows += [[modulus * int(i == k) for k in range(n_samples)] for i in range(n_samples)]
    basis = fpylll.IntegerMatrix.from_matrix(rows)
    fpylll.LLL.reduction(basis)
    reduced = np.array([[float(basis[i, j]) for j in range(n_samples)] for i in range(basis.nrows)])
    reduced = reduced[np.abs(reduced).sum(axis=1) > 0]
    shortest = reduced[np.argsort(np.linalg.norm(reduced, axis=1), kind="stable")[:n_signal]]
    return np.ascontiguousarray(shortest.T)


# ---------------------------------------------------------------- the audited runs
def _stream(case: _Case, ys: np.ndarray, fraction_bits: int, seed: int) -> tuple[Any, np.ndarray]:
    """The closed loop in modular arithmetic (checked bit for bit) and the encodings it sent."""
    from ..coding.modular import FixedPointTwin

    imm = immerse(
        case.f, case.g, **case.dims(), arithmetic="modular", fraction_bits=fraction_bits, rng=seed
    )
    twin = FixedPointTwin(case.f, case.g, fraction_bits=fraction_bits)
    x, xt, sent = case.x0, imm.encode_state(case.x0), []
    x = decode_fixed(encode_fixed(x, fraction_bits), fraction_bits)
    for y in ys:
        yt = imm.encode_input(y)
        ut, xt = imm.target.advance(xt, yt)
        if imm.decode_output(ut, yt).tobytes() != twin.output(x, y).tobytes():
            raise AssertionError("modular decoding differs from the fixed-point twin")
        x = twin.step(x, y)
        sent.append(yt)
    return imm, np.array(sent)


def _budget(quick: bool) -> dict[str, int]:
    # LLL on K x K bases with 64-bit entries: K = 40 takes milliseconds, 80 about a second
    return {"samples": 40 if quick else 80, "fresh": 100 if quick else 500}


def run_subspace_modular(quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """PCA rows and lattice-reduction rows on a stream of modular encodings under one key."""
    b = _budget(quick)
    seeds = np.random.SeedSequence(seed + 2).spawn(4)
    lattice = lattice_available()
    rows = []
    for c_i, case in enumerate((SCALAR, VECTOR)):
        scalar = case.n_input == 1
        ys = case.signal(b["samples"], np.random.default_rng(seeds[c_i]))
        _, enc = _stream(case, ys, FRACTION_BITS, int(seeds[2 + c_i].generate_state(1)[0]))
        as_float = enc.astype(np.float64)
        baseline = _best_raw(as_float, ys, len(ys))
        label = "|corr| with y [scalar y]" if scalar else "R^2 of y [vector y]"
        pca = aligned_recovery(subspace_attack(as_float, n_noise=EXTRA_INPUT), ys)
        rows.append(
            AttackResult(
                "subspace",
                SCHEME,
                f"{label}, PCA on the encodings read as numbers in [0, 2^64)",
                pca,
                baseline,
                _subspace_verdict(pca, baseline, len(ys), scalar),
                detail={
                    "case": case.label,
                    "samples": len(ys),
                    "fraction_bits": FRACTION_BITS,
                    "note": "uniform elements: PCA sees no low-variance signal subspace",
                    "lattice_attack_run": lattice,
                },
            )
        )
        if not lattice:
            continue
        for bits in (FRACTION_BITS, FILLING_FRACTION_BITS):
            _, enc = _stream(case, ys, bits, int(seeds[2 + c_i].generate_state(1)[0]))
            estimate = lattice_attack(enc, n_signal=case.n_input)
            value = aligned_recovery(estimate, ys)
            q = to_signed(encode_fixed(ys, bits)).astype(np.float64)
            exact = scalar and any(
                np.array_equal(sign * estimate[:, 0], q[:, 0]) for sign in (1.0, -1.0)
            )
            gap_bits = 64 * (1 - case.n_encoded / len(ys)) - (bits + math.log2(np.abs(ys).max()))
            filling = bits == FILLING_FRACTION_BITS
            rows.append(
                AttackResult(
                    "subspace",
                    SCHEME,
                    f"{label}, lattice reduction (LLL) on the stream",
                    value,
                    baseline,
                    _subspace_verdict(value, baseline, len(ys), scalar),
                    mitigation=(
                        f"fraction_bits={bits}: values fill the 64-bit range" if filling else None
                    ),
                    cost=(
                        f"values must stay below 2^{63 - bits} = {2.0 ** (63 - bits):g} in "
                        "magnitude (encoding refuses larger ones)"
                        if filling
                        else None
                    ),
                    detail={
                        "case": case.label,
                        "samples": len(ys),
                        "fraction_bits": bits,
                        "recovers_q_exactly_up_to_sign": exact if scalar else None,
                        "gap_bits": gap_bits,
                        "gap_is": "log2 of (typical lattice entry 2^(64 (1 - n~/K))) / max |q|: "
                        "positive = the planted vectors are shorter than random ones",
                        "baseline_is": "same metric for the best raw encoded coordinate(s)",
                    },
                )
            )
    return rows


def _kpa_verdict(value: float) -> str:
    return "leaks" if value <= KPA_LEAK else "resists" if value >= KPA_RESIST else "partial"


def run_known_plaintext_modular(quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """One key: pairs until the encodings have full rank modulo 2, then decode fresh encodings."""
    b = _budget(quick)
    seeds = np.random.SeedSequence(seed + 3).spawn(4)
    rows = []
    for c_i, case in enumerate((SCALAR, VECTOR)):
        n_tot = case.n_encoded
        ys = case.signal(4 * n_tot + b["fresh"], np.random.default_rng(seeds[c_i]))
        _, enc = _stream(case, ys, FRACTION_BITS, int(seeds[2 + c_i].generate_state(1)[0]))
        q = encode_fixed(ys, FRACTION_BITS)
        fresh_y, fresh_enc = ys[4 * n_tot :], enc[4 * n_tot :]
        needed, L = None, None
        for j in range(n_tot, 4 * n_tot + 1):
            try:
                L = known_plaintext_attack_mod(q[:j], enc[:j])
            except np.linalg.LinAlgError:
                continue
            needed = j
            break
        if L is None:
            decoded = np.zeros_like(fresh_y)
        else:
            decoded = decode_fixed(fresh_enc @ L.T, FRACTION_BITS)
        value = relative_error(decoded, fresh_y)
        exact = L is not None and bool(
            (fresh_enc @ L.T == encode_fixed(fresh_y, FRACTION_BITS)).all()
        )
        baseline = relative_error(np.broadcast_to(ys[:n_tot].mean(axis=0), fresh_y.shape), fresh_y)
        rows.append(
            AttackResult(
                "known-plaintext",
                SCHEME,
                f"relative decode error on fresh encodings (1 = predicting the mean) "
                f"[{'scalar' if case.n_input == 1 else 'vector'} y]",
                value,
                baseline,
                _kpa_verdict(value),
                detail={
                    "case": case.label,
                    "n_encoded_input": n_tot,
                    "pairs_needed_full_rank_mod_2": needed,
                    "fresh_encodings": len(fresh_y),
                    "fresh_decoded_bit_for_bit": exact,
                    "fraction_bits": FRACTION_BITS,
                    "baseline_is": "relative error of predicting the mean of the known y's",
                    "note": "elimination modulo 2^64 with odd pivots: n~ pairs (a few more when "
                    "they are dependent modulo 2) give Pi1_left exactly; uniform elements do not "
                    "help against known plaintext",
                },
            )
        )
    return rows
