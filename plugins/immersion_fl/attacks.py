"""Audit rows for federated learning by immersion (seeds 000 and 003).

``immersion audit --scheme sifl-m1`` runs three attacks on small federations (digits, an MLP with
a tiny hidden layer, a few clients with one local step per round):

* ``shared-noise-difference`` (``sifl-m1``, ``sifl-m2``, ``sifl-rm``): every upload of a round
  carries the same round noise, so the difference of two uploads is noise-free
  (:func:`run_shared_noise_difference`); mitigations ``client-noise`` and ``secure-aggregation``
  (the real option, ``secure_aggregation=True``: the engine's secure round), each with a measured
  cost.
* ``client-decodes`` (the same schemes): a client's kit decodes the global model every round
  (:func:`run_client_decodes`).
* ``m2-scalar-leak`` (``sifl-m2``): the server's ``w_bar`` gives ``w`` up to a scalar
  (:func:`run_m2_scalar_leak`).

Notes
-----
What every row measures, its baseline and verdict rule, and how the mitigations are simulated are
described in ``docs/notes/sifl_audit.md``; the measured figures are in THREAT_MODEL.md.

References
----------
Seed 000, Algorithms 1-2, eqs. 19-21, 25, 31-32 and section 7; seed 003 (random-matrix SIFL).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
from immersion.audit.runner import AttackResult

from .runtime.faults import FaultPlan

if TYPE_CHECKING:
    import torch

    from .runtime.client import Client
    from .schemes import ClientKit, SiflM1

DIFFERENCE_SCHEMES = ("sifl-m1", "sifl-m2", "sifl-rm")


# -------------------------------------------------------------------------------------- federations
@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Torch and BLAS on one thread while an attack runs (restored after).

    The audit's matrices and models are tiny, and more threads made its steps slower here
    (docs/notes/sifl_audit.md).
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

    #: The local model of the last :meth:`train` call.
    last: torch.Tensor

    def __init__(self, client: Client) -> None:
        self.client = client
        self.index = client.index
        self.n_samples = client.n_samples

    def train(self, w_start: torch.Tensor, round_t: int) -> torch.Tensor:
        self.last = self.client.train(w_start, round_t)
        return self.last


@dataclass
class _Federation:
    scheme: SiflM1
    clients: list[_Recorder]
    weights: list[float]
    sizes: list[int]
    n_params: int
    w0: torch.Tensor


@dataclass
class _Round:
    """What one round showed: the broadcast, each upload, each true local model, the true global
    model."""

    broadcast: torch.Tensor | None
    uploads: list[torch.Tensor]
    local: list[torch.Tensor]
    global_model: torch.Tensor
    seconds: float
    masked: list[np.ndarray] = field(
        default_factory=list
    )  # secure aggregation: what the aggregator receives, by client
    gap: float = 0.0  # |decoded global model - FedAvg|


def _federation(
    scheme: str,
    *,
    seed: int,
    hidden: tuple[int, ...],
    clients: int,
    batch_size: int = 512,
    client_noise: bool = False,
    secure_aggregation: bool = False,
    p: int = 2,
    epsilon_local: float = 1.0,
) -> _Federation:
    from .runtime.engine import RunConfig, Server, task_from_config
    from .schemes import SiflM1, SiflOptions

    cfg = RunConfig(
        scheme=scheme,
        hidden=hidden,
        clients=clients,
        batch_size=batch_size,
        seed=seed,
        compare_plain=False,
        options=SiflOptions(
            p=p,
            epsilon_local=epsilon_local,
            client_noise=client_noise,
            secure_aggregation=secure_aggregation,
        ),
    )
    task = task_from_config(cfg)
    server = Server.create(cfg, task, task.sizes)
    sifl = server.scheme
    assert isinstance(sifl, SiflM1), sifl  # the audited schemes are SIFL's
    recorders = [_Recorder(c) for c in task.clients(cfg, sifl.model_norm_bound)]
    sifl.client_entropy = seed  # reproducible client noise
    sizes = task.sizes
    return _Federation(
        sifl, recorders, [s / sum(sizes) for s in sizes], sizes, task.model.n_params, task.w0
    )


def _play(fed: _Federation, round_t: int, *, faults: FaultPlan | None = None) -> _Round:
    """One round of the scheme as the engine runs it; a federation built with
    ``secure_aggregation`` runs the engine's secure round
    (:func:`immersion_fl.runtime.secure.local_round`) and the view keeps what its aggregator
    received (masked words, by client)."""
    scheme = fed.scheme
    start = time.perf_counter()
    if scheme.secure_aggregation:
        from .runtime.secure import local_round

        seen: dict[int, np.ndarray] = {}
        seconds, contributors = local_round(
            scheme,
            fed.clients,  # type: ignore[arg-type]  # recorders train like clients
            [c.n_samples for c in fed.clients],
            round_t,
            plan=faults or FaultPlan(),
            timeout_s=None,
            dropped=[],
            aborted=[],
            observe=seen.update,
        )
        local = [c.last.clone() for c in fed.clients]
        kept = [fed.weights[k] for k in contributors]
        view = _Round(
            None,  # the broadcast stayed inside the engine's round
            [],
            local,
            sum(w / sum(kept) * local[k] for w, k in zip(kept, contributors, strict=True)),
            seconds,
            [seen[k] for k in sorted(seen)],
        )
    else:
        received = scheme.broadcast(round_t)
        uploads = [scheme.client_upload(c, received, round_t) for c in fed.clients]
        scheme.server_update(scheme.aggregate(uploads, fed.sizes))
        local = [c.last.clone() for c in fed.clients]
        view = _Round(
            received,
            uploads,
            local,
            sum(w * v for w, v in zip(fed.weights, local, strict=True)),
            time.perf_counter() - start,
        )
    view.gap = float((scheme.global_model() - view.global_model).abs().max())
    return view


def _rounds_for(n_samples_needed: int, clients: int) -> int:
    return -(-n_samples_needed // (clients - 1))


# ----------------------------------------------------------------------------------------- measures
def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _rank_ratio(rows: list[np.ndarray], r: int) -> float | None:
    """``sigma_{r+1} / sigma_1`` of the stacked rows: at rounding level iff they lie in an r-dim
    subspace (None with r rows or fewer)."""
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
) -> tuple[list[np.ndarray], list[np.ndarray], list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Within-round upload differences ``w~_i - w~_0`` and the true ``w_i - w_0``: flat, then
    grouped per round."""
    enc: list[np.ndarray] = []
    true: list[np.ndarray] = []
    enc_per_round: list[list[np.ndarray]] = []
    true_per_round: list[list[np.ndarray]] = []
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
    """Max abs error of the cosines between the clients' model differences read from
    ``enc_rounds``, and the spread of the true cosines (max abs deviation from their mean: the
    error of a constant guess)."""
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
    rows: list[np.ndarray], true: list[np.ndarray], m: int, kit: ClientKit
) -> tuple[float, float] | None:
    """Remove the top-``m`` principal directions of the noisy differences (the attacker's estimate
    of ``range(N1)``, ``m = n~ - n`` being public) and compare with the noise-free
    ``Pi1 (w_i - w_0)``.

    Returns ``(||projected - Pi1 d||_F / ||Pi1 d||_F, the same without the projection)``, or None
    with ``m`` samples or fewer (the estimate needs more samples than noise dimensions).
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


def _collusion(views: list[_Round], kit: ClientKit) -> tuple[float, float, float]:
    """Client 0's kit against the others' uploads: (max error decoding each upload, the same
    through the difference ``w_0 + Pi1_left (w~_i - w~_0)``, the error of the colluder's guess
    without uploads: the global model). Sizes are maxima over rounds and clients 1..K-1."""
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


def _collusion_secure(
    views: list[_Round], kit: ClientKit, weights: list[float]
) -> tuple[float, float]:
    """Client 0's kit under secure aggregation: (error of its best estimate of client i, the mean
    of the others from the sum minus its own share; error of decoding client i's masked upload as
    it is)."""
    import torch
    from immersion.securesum.protocol import from_fixed

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
    """``leaks`` at or below ``exact``; ``resists`` at half the baseline or more; ``partial``
    between."""
    if value <= exact:
        return "leaks"
    return "resists" if value >= 0.5 * baseline else "partial"


# ----------------------------------------------------------------------------------------- attack 1
def run_shared_noise_difference(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """Shared round noise cancels in the difference of two uploads (seed 000 eqs. 19-20, seed 003).

    An aggregator (or an eavesdropper on the uploads) subtracts two uploads of one round:
    ``w~_i - w~_k = Pi1 (w_i - w_k)``. Rows per scheme: the noise left in a difference (with the
    attacker's rank test in the detail), the cosines between the clients' model differences read
    without any key, and what one colluding client's kit decodes; each again with the mitigations
    ``client-noise`` (plus a row projecting out the attacker's estimate of ``range(N1)``) and
    ``secure-aggregation`` (the real ``secure_aggregation=True`` run of the engine), with their
    measured costs.

    Parameters
    ----------
    quick:
        Smaller federations and no projection row (a smoke run).
    seed:
        Seeds the federations, the baselines' noise and the simulated key agreement.

    Returns
    -------
    list of AttackResult
        The rows of ``sifl-m1``, ``sifl-m2`` and ``sifl-rm``.

    Notes
    -----
    Every row, baseline and verdict rule is described in ``docs/notes/sifl_audit.md``.
    """
    hidden, clients, pca_factor = ((1,), 8, 0) if quick else ((4,), 10, 5)
    rows: list[AttackResult] = []
    with single_thread():
        for scheme_name in DIFFERENCE_SCHEMES:
            rows += _difference_rows(
                scheme_name, hidden=hidden, clients=clients, seed=seed, pca_factor=pca_factor
            )
    return rows


def _noise_left(
    enc_rounds: list[list[np.ndarray]], first: list[np.ndarray], kit: ClientKit
) -> float:
    """``rms ||P_N (w~_i - w~_0)|| / rms ||P_N w~_0||`` over rounds and clients: the noise left in
    a difference (its part in ``ker(Pi1_left)``, ``P_N = I - Pi1 Pi1_left``) relative to the noise
    of one upload. An auditor's measure (it needs the kit); the attacker-side tests are the rank
    and cosine ones."""
    import torch

    from .schemes import kernel_noise

    def energy(x: np.ndarray) -> float:
        return float(np.sum(_numpy(kernel_noise(kit, torch.as_tensor(x))) ** 2))

    left = np.mean([energy(d) for e in enc_rounds for d in e])
    one = np.mean([energy(u0) for u0 in first])
    return float(np.sqrt(left / one))


def _client_noise_seconds(fed: _Federation, repeats: int = 20) -> float:
    """Median time of one client's extra work with ``client_noise``: draw ``z``,
    ``z - Pi1 (Pi1_left z)``."""
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
    from immersion.securesum.protocol import from_fixed

    base = _federation(scheme_name, seed=seed, hidden=hidden, clients=clients)
    kit, n, n_total = base.scheme.kit, base.n_params, base.scheme.n_encoded
    m = n_total - n
    n_rounds = _rounds_for(n + 10, clients)  # more differences than parameters: rank test
    views = [_play(base, t) for t in range(n_rounds)]
    # the real option: the same federation (same seed, keys, data) run with secure aggregation
    secured = _federation(
        scheme_name, seed=seed, hidden=hidden, clients=clients, secure_aggregation=True
    )
    sviews = [_play(secured, t) for t in range(n_rounds)]
    dropout = _play(secured, n_rounds, faults=FaultPlan({(1, n_rounds): "raise"}))
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
    masked = [[from_fixed(w) - from_fixed(v.masked[0]) for w in v.masked[1:]] for v in sviews]
    s_true_r = [[_numpy(w - v.local[0]) for w in v.local[1:]] for v in sviews]
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
            "true": s_true_r,
            "first": [from_fixed(v.masked[0]) for v in sviews],
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
    sec_best, sec_naive = _collusion_secure(sviews, secured.scheme.kit, secured.weights)
    collusion: dict[str | None, tuple[float, dict[str, Any]]] = {
        None: (direct, {"via_difference": via_diff}),
        "client-noise": (
            n_direct,
            {
                "via_difference": n_via,
                "reading": (
                    "no help against a kit holder: the client noise lies in ker(Pi1_left), which "
                    "every client computes from its kit (kernel_noise needs nothing else)"
                ),
            },
        ),
        "secure-aggregation": (
            sec_best,
            {
                "decoding_a_masked_upload_error": sec_naive,
                "reading": (
                    "the estimate is the mean of the other clients (sum minus own share); the sum "
                    "stays exact and decodable, so with K - 1 colluders (or K = 2) the last model "
                    "is exact: secure aggregation hides who, not the sum"
                ),
            },
        ),
    }

    t_base = float(np.median([v.seconds for v in views]))
    t_noisy = float(np.median([v.seconds for v in noisy]))
    t_secure = float(np.median([v.seconds for v in sviews]))  # the same rounds, the real option
    t_kernel = _client_noise_seconds(base)
    costs = {
        None: None,
        "client-noise": (
            f"client work +{t_kernel * 1e3:.2f} ms per upload (draw z, z - Pi1 Pi1_left z), "
            f"{clients} uploads = {clients * t_kernel / t_base:.1%} of a {t_base * 1e3:.1f} ms "
            f"round of this tiny model; round time measured x{t_noisy / t_base:.2f} (median of "
            f"{n_rounds}, busy machine); accuracy: none, the decoded model still equals FedAvg "
            f"(max |w - w_fedavg| {_fedavg_gap(noisy):.1e}); epsilon_local unchanged "
            f"(post-processing)"
        ),
        "secure-aggregation": (
            f"round time x{t_secure / t_base:.2f} ({t_secure * 1e3:.1f} ms vs "
            f"{t_base * 1e3:.1f} ms, median of {n_rounds} rounds of the engine's secure round: "
            f"X25519 and {clients - 1} AES-CTR masks per client, the aggregator's sum and unmask; "
            f"in process, no network); a round with one dropout (its masks recovered from the "
            f"{clients - 1} survivors' seeds) {dropout.seconds * 1e3:.1f} ms "
            f"(x{dropout.seconds / t_base:.2f}); uploads 2x the bytes (two 64-bit words per "
            f"number); decoded model equals FedAvg (max |w - w_fedavg| "
            f"{max(_fedavg_gap(sviews), dropout.gap):.1e})"
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
                    "baseline_is": (
                        "the same local models encoded with independent noise draws (about sqrt 2)"
                    ),
                    "verdict_rule": (
                        "leaks at rounding level, resists from half the noise of one upload"
                    ),
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
                    "reading": (
                        "Pi1 = a Q_S is a scaled isometry: a noise-free difference gives every "
                        "angle and norm ratio between client updates (which clients hold similar "
                        "data)"
                    ),
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
                        "reading": (
                            "the client noise lives in the fixed m-dim range(N1), orthogonal to "
                            "range(Pi1): an eavesdropper estimates it from more than m noisy "
                            "differences and projects it out; the residual falls like "
                            "sqrt(m / samples) (sifl-m1, n = 310, m = 201, synthetic differences "
                            "with the measured spread: 0.73, 0.34, 0.14, 0.08 at 400, 2000, 10000, "
                            "40000 samples)"
                        ),
                    },
                )
            )
        value, extra = collusion[mitigation]
        rows.append(
            AttackResult(
                a,
                scheme_name,
                "max abs error of other clients' local models decoded with a colluding "
                "client's kit",
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


# ----------------------------------------------------------------------------------------- attack 2
def run_client_decodes(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """A client decodes the global model every round with its kit (seed 000 Algorithm 1 and
    section 7).

    The target optimizer needs ``w = Pi1_left w~`` (eq. 21; in M2 first ``w~ = w' Pi2^R``,
    eq. 32), so the kit that every client holds is a decoding key: it gives the global model every
    round, and the round noise ``N1 r_t = (I - Pi1 Pi1_left) w~`` too.

    Parameters
    ----------
    quick:
        Fewer rounds (a smoke run).
    seed:
        Seeds the federations.

    Returns
    -------
    list of AttackResult
        One row per scheme: the max abs error of the client's decoded model against the true
        global model over the rounds; baseline: guessing the (public) initial model.
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
                assert received is not None  # a federation without secure aggregation
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
                        "baseline_is": (
                            "max |w_t - w_0| over rounds: guessing the (public) initial model"
                        ),
                        "guess_zeros_error": zeros,
                        "round_noise_relative_error": noise_error,
                        "mitigation": (
                            "none in the scheme: the target optimizer decodes the broadcast, so "
                            "the kit (Pi1, Pi1_left; Pi2^R in M2) is a decoding key; neither "
                            "client_noise nor secure aggregation changes the broadcast"
                        ),
                    },
                )
            )
    return rows


# ----------------------------------------------------------------------------------------- attack 3
def run_m2_scalar_leak(*, quick: bool = False, seed: int = 0) -> list[AttackResult]:
    """The M2 server recovers ``w`` up to a scalar from ``w_bar = w Pi2 + Pi1_left R2 N2`` (seed
    000 eq. 25).

    ``N2`` has ``p - 1`` rows and ``N2 Pi2^R = 0``, so one combination of the ``p`` columns of
    ``w_bar`` (the one along ``Pi2^R``) is exactly ``w``; the server does not hold ``Pi2^R``, but
    the aggregator's noise is large and nearly orthogonal to ``w``, so the least-norm unit
    combination (the left singular vector of ``w_bar`` for its smallest singular value) lands on
    ``w`` up to scale and sign.

    Parameters
    ----------
    quick:
        Fewer settings and rounds (a smoke run).
    seed:
        Seeds the federations.

    Returns
    -------
    list of AttackResult
        One row per setting (``p = 2`` and larger, and a weaker ``epsilon_local``): ``|cos|`` of
        that combination with the true ``w`` (minimum over rounds); baseline: the best ``|cos|``
        of a single column.
    """
    from .schemes import SiflM2

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
            scheme = fed.scheme
            assert isinstance(scheme, SiflM2), scheme
            cos, single, exact = 1.0, 0.0, 0.0
            for t in range(rounds):
                view = _play(fed, t)
                w_bar, w = _numpy(scheme.w_bar), _numpy(view.global_model)
                u, _, _ = np.linalg.svd(w_bar, full_matrices=False)
                combo = u[:, -1] @ w_bar
                cos = min(cos, _abs_cos(combo, w))
                single = max(single, max(_abs_cos(c, w) for c in w_bar))
                exact = max(exact, float(np.abs(_numpy(scheme.pi2_right[:, 0]) @ w_bar - w).max()))
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
                        "noise_scale": scheme.noise_scale,
                        "baseline_is": "max |cos| of a single column of w_bar with w",
                        "with_a_clients_pi2_right_error": exact,
                        "reading": (
                            "w up to scale and sign; with any client's Pi2^R (every client holds "
                            "it) the server decodes w exactly (w_bar Pi2^R = w)"
                        ),
                    },
                )
            )
    return rows


def _abs_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)))
