"""Audit rows for federated learning by immersion (seeds 000 and 003): ``immersion audit --scheme sifl-m1``.

Three attacks, each measured on small federations (digits, an MLP with a tiny hidden layer, a few
clients with one local step per round: the leaks are algebraic, so the model size only sets how many
samples an attacker needs):

* ``shared-noise-difference`` (``sifl-m1``, ``sifl-m2``, ``sifl-rm``): every upload of a round carries
  the same round noise (seed 000 eq. 19 and the target optimizer's lift, eq. 20: ``w~_i = Pi1 w_i + N1
  r_t``), so ``w~_i - w~_k = Pi1 (w_i - w_k)`` is noise-free. Measured: the noise left in a difference
  (an auditor's figure), what an attacker without keys computes (the rank of the differences over
  rounds, in the detail; cosines between client model differences, exact because ``Pi1 = a Q_S`` is a
  scaled isometry here) and what one client's kit gives (collusion: every local model). Mitigations,
  each in its own rows with a measured cost: ``client-noise`` (each client adds its own noise in
  ``ker(Pi1_left)``, :func:`immersion_fl.schemes.kernel_noise`; ``RunConfig(client_noise=True)``) and
  ``secure-aggregation`` (pairwise 64-bit masks that cancel in the sum, simulated in process).
* ``client-decodes`` (``sifl-m1``, ``sifl-m2``, ``sifl-rm``): a client's kit decodes the broadcast
  (eq. 21 is what the target optimizer needs), so every client learns the global model every round.
* ``m2-scalar-leak`` (``sifl-m2``): the server's ``w_bar = w Pi2 + Pi1_left R2 N2`` (eq. 25) gives ``w``
  up to a scalar from the least-norm combination of its ``p`` columns, for ``p = 2`` and beyond.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
from immersion.audit import AttackResult

DIFFERENCE_SCHEMES = ("sifl-m1", "sifl-m2", "sifl-rm")


# ---------------------------------------------------------------------------------------------- federations
@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Torch and BLAS on one thread while an attack runs (restored after).

    The audit's matrices and models are tiny: on a busy 2-core machine two threads made a training step
    2-9x and an SVD 15x slower than one thread did here.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - ships with scikit-learn
            yield
        else:
            with threadpool_limits(1):
                yield
    finally:
        torch.set_num_threads(before)


class _Recorder:
    """A client that remembers the local model it trained last (the ground truth of the audit)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.index = client.index
        self.n_samples = client.n_samples
        self.last: Any = None

    def train(self, w_start: Any, round_t: int) -> Any:
        self.last = self.client.train(w_start, round_t)
        return self.last


@dataclass
class _Federation:
    scheme: Any
    clients: list[_Recorder]
    weights: list[float]
    n_params: int
    w0: Any


@dataclass
class _Round:
    """What one round showed: the broadcast, each upload, each true local model, the true global model."""

    broadcast: Any
    uploads: list[Any]
    local: list[Any]
    global_model: Any
    seconds: float
    masked: list[np.ndarray] = field(
        default_factory=list
    )  # secure aggregation: what the aggregator sees
    secure_seconds: float = 0.0
    secure_error: float = 0.0  # |masked sum - plain weighted sum|
    gap: float = 0.0  # |decoded global model - FedAvg|


def _federation(
    scheme: str,
    *,
    seed: int,
    hidden: tuple[int, ...],
    clients: int,
    batch_size: int = 512,
    client_noise: bool = False,
    p: int = 2,
    epsilon_local: float = 1.0,
) -> _Federation:
    from .engine import RunConfig, Server, task_from_config
    from .schemes import SiflOptions

    cfg = RunConfig(
        scheme=scheme,
        hidden=hidden,
        clients=clients,
        batch_size=batch_size,
        seed=seed,
        compare_plain=False,
        options=SiflOptions(p=p, epsilon_local=epsilon_local, client_noise=client_noise),
    )
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    recorders = [_Recorder(c) for c in task.clients(cfg, server.scheme.model_norm_bound)]
    server.scheme.client_entropy = seed  # type: ignore[attr-defined]  # reproducible client noise
    sizes = task.sizes
    return _Federation(
        server.scheme, recorders, [s / sum(sizes) for s in sizes], task.model.n_params, task.w0
    )


def _pair_seed(seed: int, round_t: int, client: int) -> bytes:
    return hashlib.sha256(f"immersion-fl-audit/{seed}/{round_t}/{client}".encode()).digest()


def secure_sum(
    uploads: list[Any], weights: list[float], round_t: int, *, seed: int = 0
) -> tuple[list[np.ndarray], Any]:
    """Secure aggregation of the weighted uploads: each client masks ``weight_i w~_i`` and the aggregator
    sums, so it sees one-time-padded vectors and only their sum in the clear.

    Each client makes an X25519 key pair per round (:class:`immersion_mpdp.agreement.KeyAgreement`, its
    private key derived from ``seed`` for reproducibility), converts its weighted upload to two-limb
    fixed point (2^-60 resolution, :func:`immersion_mpdp.ddp.to_fixed`) and adds, mod 2^64, a pairwise
    AES-CTR mask per other client, with opposite signs on the two sides, so the masks cancel exactly in
    the sum. No dropout recovery and no double masking (Bonawitz et al.): an in-process simulation of
    what the aggregator sees, not a protocol.

    Returns
    -------
    masked, total
        The masked uploads (uint64, two words per number) and the unmasked weighted sum (float64 tensor).
    """
    import torch
    from immersion_mpdp.agreement import KeyAgreement
    from immersion_mpdp.ddp import from_fixed, pair_mask, to_fixed

    k = len(uploads)
    agreements = [
        KeyAgreement(i, round_t, private_bytes=_pair_seed(seed, round_t, i)) for i in range(k)
    ]
    publics = [a.public_bytes for a in agreements]
    masked = []
    for i, (agreement, upload, weight) in enumerate(zip(agreements, uploads, weights, strict=True)):
        words = to_fixed(weight * upload.cpu().numpy(), k)
        for j in range(k):
            if j != i:
                mask = pair_mask(agreement.pair_seed(j, publics[j], "mask"), upload.numel())
                (np.add if i < j else np.subtract)(words, mask, out=words)
        masked.append(words)
    total = masked[0].copy()
    for words in masked[1:]:
        total += words
    return masked, torch.as_tensor(from_fixed(total), dtype=uploads[0].dtype)


def _play(fed: _Federation, round_t: int, *, secure: bool = False, seed: int = 0) -> _Round:
    """One round of the scheme; with ``secure`` the server updates from the securely aggregated sum."""
    scheme = fed.scheme
    start = time.perf_counter()
    received = scheme.broadcast(round_t)
    uploads = [scheme.client_upload(c, received, round_t) for c in fed.clients]
    plain = scheme.aggregate(uploads, fed.weights)
    seconds = time.perf_counter() - start
    local = [c.last.clone() for c in fed.clients]
    view = _Round(
        received,
        uploads,
        local,
        sum(w * v for w, v in zip(fed.weights, local, strict=True)),
        seconds,
    )
    if secure:
        start = time.perf_counter()
        view.masked, total = secure_sum(uploads, fed.weights, round_t, seed=seed)
        view.secure_seconds = time.perf_counter() - start
        aggregated = scheme.aggregate([total], [1.0])  # M2: the aggregator codes the sum (eq. 31)
        view.secure_error = float(
            (total - sum(w * u for w, u in zip(fed.weights, uploads, strict=True))).abs().max()
        )
        start = time.perf_counter()
        scheme.server_update(aggregated)
    else:
        start = time.perf_counter()
        scheme.server_update(plain)
    view.seconds += time.perf_counter() - start
    view.gap = float((scheme.global_model() - view.global_model).abs().max())
    return view


def _rounds_for(n_samples_needed: int, clients: int) -> int:
    return -(-n_samples_needed // (clients - 1))


# ---------------------------------------------------------------------------------------------- measures
def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _rank_ratio(rows: list[np.ndarray], r: int) -> float | None:
    """``sigma_{r+1} / sigma_1`` of the stacked rows: at rounding level iff they lie in an r-dim subspace
    (None with r rows or fewer)."""
    s = np.linalg.svd(np.array(rows), compute_uv=False)
    return float(s[r] / s[0]) if len(s) > r else None


def _numerical_rank(rows: list[np.ndarray]) -> int:
    s = np.linalg.svd(np.array(rows), compute_uv=False)
    return int((s > 1e-9 * s[0]).sum())


def _cosines(rows: list[np.ndarray]) -> np.ndarray:
    m = np.array(rows)
    m = m / np.linalg.norm(m, axis=1, keepdims=True)
    g = m @ m.T
    return g[np.triu_indices(len(rows), 1)]


def _differences(
    views: list[_Round],
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Within-round upload differences ``w~_i - w~_0`` and the true ``w_i - w_0``, grouped per round."""
    enc, true, enc_per_round, true_per_round = [], [], [], []
    for v in views:
        e = [_numpy(u - v.uploads[0]) for u in v.uploads[1:]]
        t = [_numpy(w - v.local[0]) for w in v.local[1:]]
        enc += e
        true += t
        enc_per_round.append(e)
        true_per_round.append(t)
    return enc, true, enc_per_round, true_per_round


def _cosine_error(
    enc_rounds: list[list[np.ndarray]], true_rounds: list[list[np.ndarray]]
) -> tuple[float, float]:
    """Max abs error of the cosines between the clients' model differences read from ``enc_rounds``, and
    the spread of the true cosines (max abs deviation from their mean: the error of a constant guess)."""
    errors, truth = [], []
    for e, t in zip(enc_rounds, true_rounds, strict=True):
        errors.append(np.abs(_cosines(e) - _cosines(t)))
        truth.append(_cosines(t))
    all_truth = np.concatenate(truth)
    return float(np.concatenate(errors).max()), float(np.abs(all_truth - all_truth.mean()).max())


def _independent_encodings(
    fed: _Federation, views: list[_Round], seed: int, repeat: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Baseline: the same local models encoded with independent round-noise draws (no shared noise).

    Returns the differences ``enc_i - enc_0`` (flat, in round order) and each round's ``enc_0``.
    """
    import torch

    scheme = fed.scheme
    rng = np.random.default_rng([seed, 7, repeat])
    draw = rng.laplace if scheme.noise == "laplace" else rng.normal
    rows, first = [], []
    for v in views:
        enc = [
            scheme._encode_noisy(
                w, torch.as_tensor(draw(0.0, scheme.noise_scale, scheme.code.n_noise))
            )
            for w in v.local
        ]
        rows += [_numpy(e - enc[0]) for e in enc[1:]]
        first.append(_numpy(enc[0]))
    return rows, first


def _pca_residual(
    rows: list[np.ndarray], true: list[np.ndarray], m: int, kit: Any
) -> tuple[float, float] | None:
    """Remove the top-``m`` principal directions of the noisy differences (the attacker's estimate of
    ``range(N1)``, ``m = n~ - n`` being public) and compare with the noise-free ``Pi1 (w_i - w_0)``.

    Returns ``(||projected - Pi1 d||_F / ||Pi1 d||_F, the same without the projection)``, or None with
    ``m`` samples or fewer (the estimate needs more samples than noise dimensions).
    """
    import torch

    if len(rows) <= m:
        return None
    x = np.array(rows)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    basis = vt[:m]
    projected = x - (x @ basis.T) @ basis
    signal = _numpy(kit.encode(torch.as_tensor(np.array(true))))
    norm = np.linalg.norm(signal)
    return float(np.linalg.norm(projected - signal) / norm), float(
        np.linalg.norm(x - signal) / norm
    )


def _regroup(flat: list[np.ndarray], like: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    out, i = [], 0
    for group in like:
        out.append(flat[i : i + len(group)])
        i += len(group)
    return out


def _collusion(views: list[_Round], kit: Any) -> tuple[float, float, float]:
    """Client 0's kit against the others' uploads: (max error decoding each upload, the same through the
    difference ``w_0 + Pi1_left (w~_i - w~_0)``, the error of the colluder's guess without uploads: the
    global model). Sizes are maxima over rounds and clients 1..K-1."""
    direct = via_difference = guess = 0.0
    for v in views:
        for upload, w in zip(v.uploads[1:], v.local[1:], strict=True):
            direct = max(direct, float((kit.decode(upload) - w).abs().max()))
            via_difference = max(
                via_difference,
                float((v.local[0] + kit.decode(upload - v.uploads[0]) - w).abs().max()),
            )
            guess = max(guess, float((v.global_model - w).abs().max()))
    return direct, via_difference, guess


def _collusion_secure(views: list[_Round], kit: Any, weights: list[float]) -> tuple[float, float]:
    """Client 0's kit under secure aggregation: (error of its best estimate of client i, the mean of the
    others from the sum minus its own share; error of decoding client i's masked upload as it is)."""
    import torch
    from immersion_mpdp.ddp import from_fixed

    best = naive = 0.0
    w0 = weights[0]
    for v in views:
        others = (v.global_model - w0 * v.local[0]) / (1.0 - w0)
        for words, w in zip(v.masked[1:], v.local[1:], strict=True):
            best = max(best, float((others - w).abs().max()))
            naive = max(
                naive, float((kit.decode(torch.as_tensor(from_fixed(words))) - w).abs().max())
            )
    return best, naive


def _verdict(value: float, baseline: float, *, exact: float) -> str:
    """``leaks`` at or below ``exact``; ``resists`` at half the baseline or more; ``partial`` between."""
    if value <= exact:
        return "leaks"
    return "resists" if value >= 0.5 * baseline else "partial"


# ---------------------------------------------------------------------------------------------- attack 1
def run_shared_noise_difference(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """Shared round noise cancels in the difference of two uploads (seed 000 eqs. 19-20, seed 003).

    An aggregator (or an eavesdropper on the uploads) subtracts two uploads of one round:
    ``w~_i - w~_k = Pi1 (w_i - w_k)``. Rows per scheme (R rounds, K clients, differences ``w~_i - w~_0``):

    1. *Noise left* (the auditor's measure, it uses the kit): ``rms ||P_N d|| / rms ||P_N w~_0||`` with
       ``P_N = I - Pi1 Pi1_left``. Baseline: the same local models encoded with independent noise draws
       (about sqrt 2). The detail holds the attacker's *rank test*: stacked over rounds, the differences'
       spectrum falls to rounding level after the rank of the true model differences (one fixed subspace
       of ``range(Pi1)``), visible once the attacker holds more differences than that rank.
    2. *Geometry, no key.* The keys here have ``Pi1 = a Q_S`` (orthonormal columns times one scalar), so a
       noise-free difference keeps angles: the cosines between ``w_i - w_0`` and ``w_j - w_0`` come out
       exact. Baseline: the same on the independently encoded differences.
    3. *Collusion.* Client 0's kit decodes every other client's local model from its upload (``Pi1_left``
       removes all of ``range(N1)``, eq. 21; the difference route ``w_0 + Pi1_left (w~_i - w~_0)`` too).
       Baseline: the colluder's guess without the uploads, the global model.

    Mitigations, in rows of their own with measured cost: ``client-noise`` (the server's decode, eq. 21,
    or eq. 25 column by column in M2, removes any noise in ``ker(Pi1_left)``, so each client can add its
    own; one more row then projects out the top ``n~ - n`` principal directions of the differences, the
    attacker's estimate of ``range(N1)``) and ``secure-aggregation`` (the aggregator sees only masked
    uploads and their sum, :func:`secure_sum`).
    """
    hidden, clients, pca_factor = ((1,), 8, 0) if quick else ((4,), 10, 5)
    rows: list[AttackResult] = []
    with single_thread():
        for scheme_name in DIFFERENCE_SCHEMES:
            rows += _difference_rows(
                scheme_name, hidden=hidden, clients=clients, seed=seed, pca_factor=pca_factor
            )
    return rows


def _noise_left(enc_rounds: list[list[np.ndarray]], first: list[np.ndarray], kit: Any) -> float:
    """``rms ||P_N (w~_i - w~_0)|| / rms ||P_N w~_0||`` over rounds and clients: the noise left in a
    difference (its part in ``ker(Pi1_left)``, ``P_N = I - Pi1 Pi1_left``) relative to the noise of one
    upload. An auditor's measure (it needs the kit); the attacker-side tests are the rank and cosine ones."""
    import torch

    from .schemes import kernel_noise

    def energy(x: np.ndarray) -> float:
        return float(np.sum(_numpy(kernel_noise(kit, torch.as_tensor(x))) ** 2))

    left = np.mean([energy(d) for e in enc_rounds for d in e])
    one = np.mean([energy(u0) for u0 in first])
    return float(np.sqrt(left / one))


def _client_noise_seconds(fed: _Federation, repeats: int = 20) -> float:
    """Median time of one client's extra work with ``client_noise``: draw ``z``, ``z - Pi1 (Pi1_left z)``."""
    import torch

    from .schemes import kernel_noise

    rng, size, times = np.random.default_rng(0), fed.scheme.n_encoded, []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel_noise(fed.scheme.kit, torch.as_tensor(rng.laplace(0.0, 1.0, size)))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _difference_rows(
    scheme_name: str, *, hidden: tuple[int, ...], clients: int, seed: int, pca_factor: int
) -> list[AttackResult]:
    from immersion_mpdp.ddp import from_fixed

    base = _federation(scheme_name, seed=seed, hidden=hidden, clients=clients)
    kit, n, n_total = base.scheme.kit, base.n_params, base.scheme.n_encoded
    m = n_total - n
    n_rounds = _rounds_for(n + 10, clients)  # more differences than parameters: rank test
    views = [_play(base, t, secure=True, seed=seed) for t in range(n_rounds)]
    noisy_fed = _federation(
        scheme_name, seed=seed, hidden=hidden, clients=clients, client_noise=True
    )
    noisy = [
        _play(noisy_fed, t) for t in range(max(n_rounds, _rounds_for(pca_factor * m + 1, clients)))
    ]

    enc, true, enc_r, true_r = _differences(views)
    r = _numerical_rank(true)
    indep, _ = _independent_encodings(base, views, seed)
    indep_r = _regroup(indep, enc_r)
    masked = [[from_fixed(w) - from_fixed(v.masked[0]) for w in v.masked[1:]] for v in views]
    noisy_enc, noisy_true, noisy_r, noisy_true_r = _differences(noisy)
    settings: dict[str | None, dict[str, Any]] = {
        None: {"rounds": enc_r, "true": true_r, "first": [_numpy(v.uploads[0]) for v in views]},
        "client-noise": {
            "rounds": noisy_r,
            "true": noisy_true_r,
            "first": [_numpy(v.uploads[0]) for v in noisy],
        },
        "secure-aggregation": {
            "rounds": masked,
            "true": true_r,
            "first": [from_fixed(v.masked[0]) for v in views],
        },
    }
    draws = [
        _independent_encodings(base, views, seed, repeat) for repeat in range(1, 9)
    ]  # a steadier figure
    base_noise = _noise_left(
        [g for rows_, _ in draws for g in _regroup(rows_, enc_r)],
        [f for _, firsts in draws for f in firsts],
        kit,
    )
    cos_base = _cosine_error(indep_r, true_r)[0]
    rank_base = {"at_n": _rank_ratio(indep, n), "at_r": _rank_ratio(indep, r)}
    direct, via_diff, guess = _collusion(views, kit)
    n_direct, n_via, _ = _collusion(noisy, noisy_fed.scheme.kit)
    sec_best, sec_naive = _collusion_secure(views, kit, base.weights)
    collusion = {
        None: (direct, {"via_difference": via_diff}),
        "client-noise": (
            n_direct,
            {
                "via_difference": n_via,
                "reading": (
                    "no help against a kit holder: the client noise lies in ker(Pi1_left), which every client "
                    "computes from its kit (kernel_noise needs nothing else)"
                ),
            },
        ),
        "secure-aggregation": (
            sec_best,
            {
                "decoding_a_masked_upload_error": sec_naive,
                "reading": (
                    "the estimate is the mean of the other clients (sum minus own share); the sum stays exact and "
                    "decodable, so with K - 1 colluders (or K = 2) the last model is exact: secure aggregation "
                    "hides who, not the sum"
                ),
            },
        ),
    }

    t_base = float(np.median([v.seconds for v in views]))
    t_noisy = float(np.median([v.seconds for v in noisy]))
    t_secure = float(
        np.median([v.seconds + v.secure_seconds for v in views])
    )  # same rounds: paired
    t_kernel = _client_noise_seconds(base)
    costs = {
        None: None,
        "client-noise": (
            f"client work +{t_kernel * 1e3:.2f} ms per upload (draw z, z - Pi1 Pi1_left z), {clients} "
            f"uploads = {clients * t_kernel / t_base:.1%} of a {t_base * 1e3:.1f} ms round of this tiny "
            f"model; round time measured x{t_noisy / t_base:.2f} (median of {n_rounds}, busy machine); "
            f"accuracy: none, the decoded model still equals FedAvg (max |w - w_fedavg| "
            f"{_fedavg_gap(noisy):.1e}); epsilon_local unchanged (post-processing)"
        ),
        "secure-aggregation": (
            f"round time x{t_secure / t_base:.2f} ({t_secure * 1e3:.1f} ms vs {t_base * 1e3:.1f} ms: "
            f"X25519 and {clients - 1} AES-CTR masks per client, compute only, no extra round trips "
            f"or dropout recovery); uploads 2x the bytes (two 64-bit words per number); masked sum "
            f"exact to {max(v.secure_error for v in views):.1e}, decoded model equals FedAvg "
            f"(max |w - w_fedavg| {_fedavg_gap(views):.1e})"
        ),
    }
    setting = {
        "clients": clients,
        "rounds": n_rounds,
        "n_params": n,
        "n_encoded": n_total,
        "noise_dims": m,
        "differences": len(enc),
        "hidden": list(hidden),
        "noise": base.scheme.noise,
        "noise_scale": base.scheme.noise_scale,
    }
    a = "shared-noise-difference"
    rows = []
    for mitigation, got in settings.items():
        cost = costs[mitigation]
        flat = [d for group in got["rounds"] for d in group][
            : len(enc)
        ]  # same sample count in each
        noise_left = _noise_left(got["rounds"], got["first"], kit)
        rank_test = {
            "sigma_n+1/sigma_1": _rank_ratio(flat, n),
            "sigma_r+1/sigma_1": _rank_ratio(flat, r),
            "r": r,
            "baseline": rank_base,
            "note": (
                "attacker-computable: the differences lie in one fixed subspace when sigma_{k+1}/"
                "sigma_1 is at rounding level (k = n, the public model size, or r, the rank of the "
                "true model differences, below n here since some pixels are always 0); with "
                "m = 1 noise dimension (sifl-rm) a rank test at n cannot tell, the cosine row can"
            ),
        }
        rows.append(
            AttackResult(
                a,
                scheme_name,
                "noise left in w~_i - w~_0 (its part in ker Pi1_left) / noise in one upload",
                noise_left,
                base_noise,
                _verdict(noise_left, 1.0, exact=1e-8),
                mitigation,
                cost,
                {
                    **setting,
                    "baseline_is": "the same local models encoded with independent noise draws (about sqrt 2)",
                    "verdict_rule": "leaks at rounding level, resists from half the noise of one upload",
                    "attacker_rank_test": rank_test,
                },
            )
        )
        cos_err, spread = _cosine_error(got["rounds"], got["true"])
        rows.append(
            AttackResult(
                a,
                scheme_name,
                "max abs error of cosines between clients' model differences, from uploads, no key",
                cos_err,
                cos_base,
                _verdict(cos_err, cos_base, exact=1e-6),
                mitigation,
                cost,
                {
                    **setting,
                    "baseline_is": "the same on differences with independent noise draws",
                    "true_cosine_spread": spread,
                    "reading": "Pi1 = a Q_S is a scaled isometry: a noise-free difference gives every angle and norm ratio "
                    "between client updates (which clients hold similar data)",
                },
            )
        )
        pca = _pca_residual(noisy_enc, noisy_true, m, kit) if mitigation == "client-noise" else None
        if pca is not None:  # needs more samples than noise dimensions (not in quick M1/M2)
            rows.append(
                AttackResult(
                    a,
                    scheme_name,
                    "relative error of Pi1 (w_i - w_0) recovered by projecting out the top n~ - n "
                    "principal directions of the differences",
                    pca[0],
                    pca[1],
                    _verdict(*pca, exact=1e-6),
                    mitigation,
                    cost,
                    {
                        **setting,
                        "rounds": len(noisy),
                        "samples": len(noisy_enc),
                        "baseline_is": "the same error without the projection (noise over signal)",
                        "reading": "the client noise lives in the fixed m-dim range(N1), orthogonal to range(Pi1): "
                        "an eavesdropper estimates it from more than m noisy differences and projects it "
                        "out; the residual falls like sqrt(m / samples) (sifl-m1, n = 310, m = 201, "
                        "synthetic differences with the measured spread: 0.73, 0.34, 0.14, 0.08 at 400, "
                        "2000, 10000, 40000 samples)",
                    },
                )
            )
        value, extra = collusion[mitigation]
        rows.append(
            AttackResult(
                a,
                scheme_name,
                "max abs error of other clients' local models decoded with a colluding client's kit",
                value,
                guess,
                _verdict(value, guess, exact=1e-6),
                mitigation,
                cost,
                {
                    **setting,
                    **extra,
                    "baseline_is": "max |w_global - w_i|: the colluder's guess without uploads",
                },
            )
        )
    return rows


def _fedavg_gap(views: list[_Round]) -> float:
    """Max over rounds of |decoded global model - FedAvg of the true local models|."""
    return max(v.gap for v in views)


# ---------------------------------------------------------------------------------------------- attack 2
def run_client_decodes(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """A client decodes the global model every round with its kit (seed 000 Algorithm 1 and section 7).

    The target optimizer needs ``w = Pi1_left w~`` (eq. 21; in M2 first ``w~ = w' Pi2^R``, eq. 32), so the
    kit that every client holds is a decoding key: it gives the global model every round, and the round
    noise ``N1 r_t = (I - Pi1 Pi1_left) w~`` too. Metric: max abs error of the client's decoded model
    against the true global model (FedAvg of the true local models) over the rounds; baseline: the error
    of guessing the initial model (public), and in the detail of guessing zeros.
    """
    from .schemes import kernel_noise

    rounds = 2 if quick else 5
    rows = []
    with single_thread():
        for scheme_name in DIFFERENCE_SCHEMES:
            fed = _federation(scheme_name, seed=seed, hidden=(16,), clients=4, batch_size=64)
            kit = fed.scheme.kit
            truth, error, noise_error, initial, zeros = fed.w0, 0.0, 0.0, 0.0, 0.0
            for t in range(rounds):
                view = _play(fed, t)
                received = view.broadcast
                encoded = (
                    received
                    if kit.pi2_right is None or received.dim() == 1
                    else kit.pi2_right @ received
                )
                error = max(error, float((kit.decode(encoded) - truth).abs().max()))
                round_noise = encoded - kit.encode(truth)
                noise_error = max(
                    noise_error,
                    float(
                        (kernel_noise(kit, encoded) - round_noise).abs().max()
                        / round_noise.abs().max()
                    ),
                )
                initial = max(initial, float((truth - fed.w0).abs().max()))
                zeros = max(zeros, float(truth.abs().max()))
                truth = view.global_model
            rows.append(
                AttackResult(
                    "client-decodes",
                    scheme_name,
                    "max abs error of the global model decoded by a client's kit",
                    error,
                    initial,
                    _verdict(error, initial, exact=1e-8),
                    detail={
                        "rounds": rounds,
                        "clients": 4,
                        "hidden": [16],
                        "n_params": fed.n_params,
                        "baseline_is": "max |w_t - w_0| over rounds: guessing the (public) initial model",
                        "guess_zeros_error": zeros,
                        "round_noise_relative_error": noise_error,
                        "mitigation": "none in the scheme: the target optimizer decodes the broadcast, so the kit "
                        "(Pi1, Pi1_left; Pi2^R in M2) is a decoding key; neither client_noise nor "
                        "secure aggregation changes the broadcast",
                    },
                )
            )
    return rows


# ---------------------------------------------------------------------------------------------- attack 3
def run_m2_scalar_leak(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """The M2 server recovers ``w`` up to a scalar from ``w_bar = w Pi2 + Pi1_left R2 N2`` (seed 000 eq. 25).

    ``N2`` has ``p - 1`` rows and ``N2 Pi2^R = 0``, so one combination of the ``p`` columns of ``w_bar``
    (the one along ``Pi2^R``) is exactly ``w``; the server does not hold ``Pi2^R``, but the aggregator's
    noise is large and nearly orthogonal to ``w``, so the least-norm unit combination (the left singular
    vector of ``w_bar`` for its smallest singular value; for ``p = 2`` the projection used in
    ``tests/test_fl.py``) lands on ``w`` up to scale and sign. Metric: ``|cos|`` of that combination with
    the true ``w`` (minimum over rounds); baseline: the best ``|cos|`` of a single column. Measured for
    ``p = 2`` and larger ``p`` (more columns do not hide ``w``), and at a weaker ``epsilon_local``.
    """
    settings = (
        [(2, 1.0), (3, 1.0)] if quick else [(2, 1.0), (3, 1.0), (5, 1.0), (10, 1.0), (2, 100.0)]
    )
    rounds = 1 if quick else 2
    rows = []
    with single_thread():
        for p, eps in settings:
            fed = _federation(
                "sifl-m2", seed=seed, hidden=(32,), clients=4, batch_size=64, p=p, epsilon_local=eps
            )
            cos, single, exact = 1.0, 0.0, 0.0
            for t in range(rounds):
                view = _play(fed, t)
                w_bar, w = _numpy(fed.scheme.w_bar), _numpy(view.global_model)
                u, _, _ = np.linalg.svd(w_bar, full_matrices=False)
                combo = u[:, -1] @ w_bar
                cos = min(cos, _abs_cos(combo, w))
                single = max(single, max(_abs_cos(c, w) for c in w_bar))
                exact = max(
                    exact, float(np.abs(_numpy(fed.scheme.pi2_right[:, 0]) @ w_bar - w).max())
                )
            rows.append(
                AttackResult(
                    "m2-scalar-leak",
                    "sifl-m2",
                    f"|cos| with w of the least-norm combination of w_bar's columns (p = {p})",
                    cos,
                    single,
                    "leaks" if cos > 0.99 else ("partial" if cos > 2 * single else "resists"),
                    detail={
                        "p": p,
                        "epsilon_local": eps,
                        "rounds": rounds,
                        "clients": 4,
                        "n_params": fed.n_params,
                        "noise_scale": fed.scheme.noise_scale,
                        "baseline_is": "max |cos| of a single column of w_bar with w",
                        "with_a_clients_pi2_right_error": exact,
                        "reading": "w up to scale and sign; with any client's Pi2^R (every client holds it) the "
                        "server decodes w exactly (w_bar Pi2^R = w)",
                    },
                )
            )
    return rows


def _abs_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)))
