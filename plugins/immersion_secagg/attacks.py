"""Audit rows for seed 001's schemes: ``immersion audit --attack secagg-mask-seed``.

Seed 001's privacy rests on the server seeing only the sum of the users' updates. Flower 1.41's
SecAgg+ expands every mask with ``pseudo_rand_gen`` (``flwr/common/secure_aggregation/
secaggplus_utils.py``, lines 83-100): the shared key is XOR-folded into a 32-bit ``seed32`` and
fed to ``np.random.RandomState`` (Mersenne Twister). The pairwise key is
``generate_shared_key`` (``crypto/symmetric_encryption.py``, lines 26-43): an HKDF output
*base64-encoded* (44 ASCII bytes), so every byte of ``seed32`` is below 0x80 and the seed space is
2^28, not 2^32. The self mask's seed is ``os.urandom(32)`` (``secaggplus_mod.py`` line 376),
folded the same way (line 468): 2^32 seeds.

The attack: an aggregator that knows a user's self-mask seed (SecAgg+ reconstructs it for every
surviving user at unmasking) and faces one unknown pairwise mask (two users, or all but one of
the user's peers colluding) subtracts the self mask and searches ``seed32``: the right seed leaves
values inside the quantisation range ``[0, T]`` (``T = 2^22`` of ``M = 2^32``), a wrong one passes
with probability ``2^-30`` for three words. The first outputs of ``RandomState(seed)`` for a
million seeds at once come from a vectorised Mersenne Twister (:func:`mt_first_outputs`, checked
against numpy). The masked vector is built with flwr's own helpers, as ``secaggplus_mod`` does
(``flwr/client/mod/secure_aggregation/secaggplus_mod.py``, lines 443-486).

Rows, per scheme (the user's update is that scheme's, from :mod:`immersion_secagg.engine`): the
error of the user's update the aggregator recovers (baseline: the error of the mean of the two
users, all the sum gives), without a mitigation (SecAgg+) and with ``core-secure-sum`` (the same
search against a vector whose pairwise mask is the core's AES-CTR keystream,
:mod:`immersion.securesum.protocol`: nothing passes, the aggregator is left with the mean). The full
2^28 search runs unless ``quick`` (then a 2^20 window that contains the seed, and the full search's
time is extrapolated from the measured rate). The ``core-secure-sum`` row's cost is measured in
the same run (:func:`round_costs`): one in-process round of the two users' updates through the
core sum against SecAgg+'s arithmetic and a plain mean.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from immersion.audit.runner import AttackResult

SCHEMES = ("sgd-dp", "gsgd-dp", "gd-dp")
#: SecAgg+ settings of seed 001's Flower engine (``immersion_secagg.engine._flower_models``).
MODULUS = 2**32
LEVELS = 2**22
#: Words of the masked vector each candidate seed is tested on.
TEST_WORDS = 3
CHUNK = 2**20


def mt_first_outputs(seeds: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` 32-bit outputs of ``np.random.RandomState(seed)`` for many seeds at once.

    ``init_genrand`` (numpy's legacy seeding of MT19937), one twist of the first ``k`` words and
    the tempering, vectorised over ``seeds``. ``RandomState.randint(0, 2**32 - 1)`` returns these
    words unchanged unless one is ``2**32 - 1`` (rejected; probability ``2^-32`` per word).

    Parameters
    ----------
    seeds : np.ndarray
        32-bit seeds (any integer dtype).
    k : int
        Outputs per seed (at most 227).

    Returns
    -------
    np.ndarray
        ``uint32``, shape ``(len(seeds), k)``.

    Examples
    --------
    >>> r = np.random.RandomState(12345)
    >>> mt_first_outputs(np.array([12345]), 2)[0].tolist() == r.randint(0, 2**32 - 1, 2).tolist()
    True
    """
    x = np.asarray(seeds).astype(np.uint32)
    keep = {0: x}
    need = set(range(k + 1)) | set(range(397, 397 + k))
    mult = np.uint32(1812433253)
    for i in range(1, 397 + k):
        x = (x ^ (x >> np.uint32(30))) * mult + np.uint32(i)
        if i in need:
            keep[i] = x
    out = []
    for i in range(k):
        y = (keep[i] & np.uint32(0x80000000)) | (keep[i + 1] & np.uint32(0x7FFFFFFF))
        odd = np.where(y & np.uint32(1), np.uint32(0x9908B0DF), np.uint32(0))
        v = keep[i + 397] ^ (y >> np.uint32(1)) ^ odd
        v = v ^ (v >> np.uint32(11))
        v = v ^ ((v << np.uint32(7)) & np.uint32(0x9D2C5680))
        v = v ^ ((v << np.uint32(15)) & np.uint32(0xEFC60000))
        out.append(v ^ (v >> np.uint32(18)))
    return np.stack(out, axis=1)


def fold32(key: bytes) -> int:
    """``seed32`` of flwr's ``pseudo_rand_gen``: the XOR of the key's little-endian 32-bit words.

    Parameters
    ----------
    key : bytes
        A key whose length is a multiple of 4.

    Returns
    -------
    int
        The 32-bit seed.
    """
    seed = 0
    for i in range(0, len(key), 4):
        seed ^= int.from_bytes(key[i : i + 4], "little")
    return seed


def ascii_seed(index: np.ndarray) -> np.ndarray:
    """The ``index``-th 32-bit seed whose four bytes are all below 0x80 (2^28 of them).

    Parameters
    ----------
    index : np.ndarray
        Integers in ``[0, 2^28)``.

    Returns
    -------
    np.ndarray
        ``uint32`` seeds.

    Examples
    --------
    >>> ascii_seed(np.array([0, 1, 128, 2**28 - 1])).tolist()
    [0, 1, 256, 2139062143]
    """
    i = np.asarray(index).astype(np.uint64)
    parts = [((i >> np.uint64(7 * b)) & np.uint64(0x7F)) << np.uint64(8 * b) for b in range(4)]
    return (parts[0] | parts[1] | parts[2] | parts[3]).astype(np.uint32)


def _ascii_index(seed: int) -> int:
    return sum(((seed >> (8 * b)) & 0x7F) << (7 * b) for b in range(4))


def secaggplus_masked(
    update: np.ndarray, rd_seed: bytes, shared_key: bytes, *, clip: float, higher_id: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A user's masked vector as flwr 1.41's ``secaggplus_mod`` builds it (two users).

    Parameters
    ----------
    update : np.ndarray
        The user's update.
    rd_seed : bytes
        Its self-mask seed.
    shared_key : bytes
        ``generate_shared_key`` with the other user.
    clip : float
        The clipping range ``c``.
    higher_id : bool
        Whether this user's node id is the larger (the pairwise mask is added, else subtracted).

    Returns
    -------
    masked, quantized
        The words the server receives (factor first, flattened) and the user's quantised vector
        (the ground truth of the attack).
    """
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_combine,
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import quantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    quantized = factor_combine(LEVELS, quantize([update], clip, LEVELS))  # weight ratio 1
    dims = [a.shape for a in quantized]
    masked = parameters_addition(quantized, pseudo_rand_gen(rd_seed, MODULUS, dims))
    pairwise = pseudo_rand_gen(shared_key, MODULUS, dims)
    combine = parameters_addition if higher_id else parameters_subtraction
    masked = parameters_mod(combine(masked, pairwise), MODULUS)
    return np.concatenate([a.ravel() for a in masked]), np.concatenate(
        [a.ravel() for a in quantized]
    )


def _unmasked_by_server(masked: np.ndarray, rd_seed: bytes) -> np.ndarray:
    """What the server holds after removing the self mask it reconstructs at unmasking."""
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    self_mask = np.concatenate(
        [a.ravel() for a in pseudo_rand_gen(rd_seed, MODULUS, [(1,), (masked.size - 1,)])]
    )
    return (masked - self_mask) % MODULUS


def search(targets: list[np.ndarray], start: int, count: int) -> tuple[list[list[int]], float]:
    """Scan ``count`` ASCII seeds from index ``start`` for each target's pairwise mask.

    Parameters
    ----------
    targets : list of np.ndarray
        The server's vectors with the self mask removed (int64 words modulo ``2^32``).
    start, count : int
        The slice of the 2^28 ASCII seeds scanned.

    Returns
    -------
    hits, seconds
        Per target, the seeds whose first :data:`TEST_WORDS` mask words (either sign) leave every
        tested value in ``[0, T]``; the scan's seconds.
    """
    heads = [t[:TEST_WORDS].astype(np.int64) for t in targets]
    hits: list[list[int]] = [[] for _ in targets]
    tick = time.perf_counter()
    for lo in range(start, start + count, CHUNK):
        seeds = ascii_seed(np.arange(lo, min(lo + CHUNK, start + count)))
        mask = mt_first_outputs(seeds, TEST_WORDS).astype(np.int64)
        for k, head in enumerate(heads):
            for sign in (1, -1):
                q = (head - sign * mask) % MODULUS
                ok = np.flatnonzero((q <= LEVELS).all(axis=1))
                hits[k] += [int(s) for s in seeds[ok]]
    return hits, time.perf_counter() - tick


def _recover(target: np.ndarray, seed: int) -> np.ndarray | None:
    """The quantised vector if the whole mask of ``seed`` fits (either sign), else None."""
    r = np.random.RandomState(seed)
    mask = np.concatenate(
        [
            r.randint(0, MODULUS - 1, 1, dtype=np.int64),
            r.randint(0, MODULUS - 1, target.size - 1, dtype=np.int64),
        ]
    )
    for sign in (1, -1):
        q = (target - sign * mask) % MODULUS
        if (q <= LEVELS).all():
            return q
    return None


def _attack(
    vector: np.ndarray, candidates: list[int], clipped: np.ndarray, clip: float, baseline: float
) -> tuple[np.ndarray | None, float]:
    """The quantised vector the first candidate seed whose whole mask fits gives, and its
    error against the clipped update (``(None, baseline)`` if no candidate fits).

    A seed passes :func:`search`'s test on the first :data:`TEST_WORDS` words by chance with
    probability ``(T / 2^32)^TEST_WORDS = 2^-30`` per sign: about one false candidate per target
    in a full scan of the 2^28 seeds, which only a whole-mask check (:func:`_recover`) tells
    apart.
    """
    found = next((q for q in (_recover(vector, h) for h in candidates) if q is not None), None)
    if found is None:
        return None, baseline
    estimate = found[1:].astype(np.float64) * (2 * clip / LEVELS) - clip
    return found, float(np.abs(estimate - clipped).max())


#: Repetitions of each timed round in :func:`round_costs` (the median is reported).
COST_REPEATS = 15


def round_costs(x1: np.ndarray, x2: np.ndarray, clip: float) -> dict[str, float]:
    """Time one in-process round of two users' updates: core secure sum, SecAgg+, plain sum.

    Each round starts from fresh keys and ends with the mean of the two updates: the core's
    (:class:`immersion.securesum.protocol.SecureSumClient`: X25519, two-limb fixed point,
    AES-128-CTR masks, the modular sum, unmask) and SecAgg+'s arithmetic with flwr 1.41's own
    helpers (its ECDH key pairs and shared key, stochastic quantisation, self and pairwise Mersenne
    Twister masks, the modular sum, removal of the self masks, dequantisation; no Shamir shares, no
    messages). Median of :data:`COST_REPEATS` rounds each.

    Parameters
    ----------
    x1, x2 : np.ndarray
        The two users' updates (float64, same shape).
    clip : float
        SecAgg+'s clipping range.

    Returns
    -------
    dict
        ``core_ms``, ``secaggplus_ms``, ``plain_us`` (median round times), ``core_over_secaggplus``
        and the max abs error of each mean against the exact one (SecAgg+: of the clipped
        updates).
    """
    import os

    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import generate_key_pairs
    from immersion.securesum.protocol import SecureSumClient, sum_words, unmask

    exact = (x1 + x2) / 2
    exact_clipped = (np.clip(x1, -clip, clip) + np.clip(x2, -clip, clip)) / 2

    def core() -> np.ndarray:
        clients = [SecureSumClient(k, 0) for k in range(2)]
        publics = {c.index: c.public_bytes for c in clients}
        masked = [c.mask(v, publics, n_summands=2) for c, v in zip(clients, (x1, x2), strict=True)]
        return unmask(sum_words(masked)) / 2

    def secaggplus() -> np.ndarray:
        (sk1, pk1), (sk2, pk2) = generate_key_pairs(), generate_key_pairs()
        seeds = [os.urandom(32), os.urandom(32)]
        m1, _ = secaggplus_masked(
            x1, seeds[0], generate_shared_key(sk1, pk2), clip=clip, higher_id=True
        )
        m2, _ = secaggplus_masked(
            x2, seeds[1], generate_shared_key(sk2, pk1), clip=clip, higher_id=False
        )
        total = (m1 + m2) % MODULUS
        for rd_seed in seeds:
            total = _unmasked_by_server(total, rd_seed)
        factor, q = int(total[0]), total[1:].astype(np.float64)
        return (q * (2 * clip / LEVELS) - 2 * clip) * (LEVELS / factor)

    def timed(work: Any) -> tuple[float, np.ndarray]:
        times, out = [], None
        for _ in range(COST_REPEATS):
            tick = time.perf_counter()
            out = work()
            times.append(time.perf_counter() - tick)
        return float(np.median(times)), out

    core_s, core_mean = timed(core)
    secagg_s, secagg_mean = timed(secaggplus)
    plain_s, _ = timed(lambda: (x1 + x2) / 2)
    return {
        "core_ms": core_s * 1e3,
        "secaggplus_ms": secagg_s * 1e3,
        "plain_us": plain_s * 1e6,
        "core_over_secaggplus": core_s / secagg_s,
        "core_mean_error": float(np.abs(core_mean - exact).max()),
        "secaggplus_mean_error": float(np.abs(secagg_mean - exact_clipped).max()),
    }


def _user_updates(scheme: str, seed: int, sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    """Two users' updates of ``scheme`` at the initial model (seed 001 engine, digits, linear)."""
    import torch
    from immersion_fl.runtime.engine import RunConfig

    from .users import make_users

    cfg = RunConfig.from_flat(
        dict(scheme=scheme, model="linear", clients=2, batch_size=16, seed=seed, rounds=1)
    )
    users, model, _ = make_users(cfg)
    w = torch.as_tensor(model.initial_vector(seed))
    a, b = (np.asarray(u.update(cfg, model, w, sigma2, 0)) for u in users)
    return a, b


#: The users' noise variance in the audit (within the calibrated range, 0.04-16).
SIGMA2 = 0.1


def run_secagg_mask_seed(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """The 32-bit (2^28) mask seeds of Flower's SecAgg+ against the core secure sum.

    Parameters
    ----------
    quick : bool
        Scan a 2^20 window holding the seed and extrapolate the full search's time (else scan
        all 2^28 ASCII seeds: about a minute on one core).
    seed : int
        Seeds the users' data split and the keys' randomness of the run (keys from OS entropy).

    Returns
    -------
    list of AttackResult
        Two rows per scheme (none, ``core-secure-sum``).
    """
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.supercore.primitives.asymmetric import generate_key_pairs
    from immersion.securesum.protocol import keystream

    rng = np.random.default_rng(seed)
    folds = [
        fold32(generate_shared_key(generate_key_pairs()[0], generate_key_pairs()[1]))
        for _ in range(200)
    ]
    high_bits = sum(bin(f & 0x80808080).count("1") for f in folds)
    cases = []
    for scheme in SCHEMES:
        x1, x2 = _user_updates(scheme, seed, SIGMA2)
        clip = 10.0 + 8.0 * float(np.sqrt(SIGMA2 + 100.0 / 16))  # the engine's clipping range
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        shared = generate_shared_key(sk1, pk2)
        assert shared == generate_shared_key(sk2, pk1)
        rd_seed = rng.bytes(32)
        masked, truth = secaggplus_masked(x1, rd_seed, shared, clip=clip, higher_id=True)
        target = _unmasked_by_server(masked, rd_seed)
        # the control: the same vector with the core's keystream as the pairwise mask
        core_mask = (keystream(rng.bytes(32), masked.size) % np.uint64(MODULUS)).astype(np.int64)
        control = (truth.astype(np.int64) + core_mask) % MODULUS
        cases.append((scheme, x1, x2, clip, fold32(shared), target, control, truth))
    found: list[tuple[list[int], list[int], float]] = []
    if quick:  # a window holding each seed; the full search's time is extrapolated
        window = 2**20
        for case in cases:
            start = max(0, min(2**28 - window, _ascii_index(case[4]) - int(rng.integers(window))))
            (hits, control_hits), seconds = search([case[5], case[6]], start, window)
            found.append((hits, control_hits, seconds))
        rate = window * len(cases) / sum(f[2] for f in found)
    else:  # every ASCII seed, all targets in one scan
        window = 2**28
        hits_all, seconds = search([t for c in cases for t in (c[5], c[6])], 0, window)
        found = [(hits_all[2 * k], hits_all[2 * k + 1], seconds) for k in range(len(cases))]
        rate = window / seconds
    full_s = 2**28 / rate
    rows = []
    for (scheme, x1, x2, clip, seed32, target, control, truth), (
        hits,
        control_hits,
        seconds,
    ) in zip(cases, found, strict=True):
        costs = round_costs(x1, x2, clip)
        step = 2 * clip / LEVELS
        clipped = np.clip(x1, -clip, clip)
        guess = (np.clip(x1, -clip, clip) + np.clip(x2, -clip, clip)) / 2
        baseline = float(np.abs(guess - clipped).max())

        recovered, value = _attack(target, hits, clipped, clip, baseline)
        control_recovered, control_value = _attack(control, control_hits, clipped, clip, baseline)
        setting = {
            "users": 2,
            "n_params": int(x1.size),
            "modulus": MODULUS,
            "levels": LEVELS,
            "clipping_range": clip,
            "seed_space": "2^28 (seed32 folds a base64 key: every byte below 0x80)",
            "fold_high_bits_seen": f"{high_bits} set top bits in 200 fresh shared keys' seed32",
            "scanned": window,
            "scan_seconds": seconds,
            "seeds_per_second": rate,
            "full_search_seconds": full_s,
            "full_search_run": not quick,
            "flwr": "1.41: secaggplus_utils.py pseudo_rand_gen lines 83-100; "
            "symmetric_encryption.py generate_shared_key lines 26-43; secaggplus_mod.py lines "
            "443-486",
            "scenario": "the server knows the user's self-mask seed (reconstructed at unmasking) "
            "and one pairwise mask is unknown: two users, or every other peer colluding",
        }
        rows.append(
            AttackResult(
                "secagg-mask-seed",
                scheme,
                "max abs error of user 1's update recovered from its SecAgg+ masked vector",
                value,
                baseline,
                "leaks"
                if value <= 2 * step
                else ("resists" if value >= 0.5 * baseline else "partial"),
                detail={
                    **setting,
                    "seed_found": seed32 in hits,
                    "quantized_vector_exact": bool(
                        recovered is not None and np.array_equal(recovered, truth)
                    ),
                    "quantisation_step": step,
                    "baseline_is": "max |mean of the two users - user 1|: what the sum alone gives",
                },
            )
        )
        rows.append(
            AttackResult(
                "secagg-mask-seed",
                scheme,
                "max abs error of user 1's update recovered from its SecAgg+ masked vector",
                control_value,
                baseline,
                "resists" if control_recovered is None else "leaks",
                "core-secure-sum",
                f"the core sum (immersion_secagg.core_flower, the default of --engine flower), "
                f"measured here: an in-process round of the 2 users' {x1.size} values takes "
                f"{costs['core_ms']:.2f} ms (fresh X25519 keys, two-limb fixed point, "
                f"AES-128-CTR masks, sum, unmask), {costs['core_over_secaggplus']:.2f}x the "
                f"{costs['secaggplus_ms']:.2f} ms of SecAgg+'s arithmetic with flwr's helpers "
                f"(plain mean {costs['plain_us']:.1f} us; median of {COST_REPEATS} rounds each, "
                f"no messages, no Shamir shares); uploads 16 bytes per value instead of 8; max "
                f"abs error of the mean {costs['core_mean_error']:.1e} (SecAgg+: "
                f"{costs['secaggplus_mean_error']:.1e} against the clipped mean, {LEVELS} "
                f"levels); no seed to search",
                {
                    **setting,
                    **{f"cost_{k}": v for k, v in costs.items()},
                    "candidates_passing": len(control_hits),
                    "candidates_whose_whole_mask_fits": int(control_recovered is not None),
                    "reading": "the same scan against the core's keystream mask finds no seed; "
                    "the aggregator is left with the mean of the sum",
                },
            )
        )
    return rows
