"""Seed 001: update models, WF-NA noise and diagnostics; exact Renyi divergences against eqs. 19 and
35.

``G`` is the paper's ``(K, D)`` matrix, one clipped per-example gradient per column.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from immersion import InvalidArgumentError
from immersion_secagg.accountant import Setting, rdp_theorem2, rdp_theorem4
from immersion_secagg.diagnostics import (
    covariance_is_singular,
    gaussian_renyi_divergence,
    in_span,
    lemma2_holds,
    min_eigenvalue_sum,
)
from immersion_secagg.updates import (
    clip_rows,
    full_gradient_update,
    gaussian_sampling_update,
    iid_sampling_update,
    isotropic_noise,
)
from immersion_secagg.wfna import wfna_covariance, wfna_noise, wfna_noise_full, wfna_noise_lowrank
from scipy import integrate, stats

PROPERTY = settings(derandomize=True, max_examples=60, deadline=None, database=None)
ALPHAS = (1.5, 2.0, 4.0, 8.0)


def _clipped(rng: np.random.Generator, k: int, d: int, clip: float, scale: float) -> np.ndarray:
    """``(K, D)`` clipped Gaussian gradients, columns of norm ``<= clip``."""
    return clip_rows(rng.normal(size=(d, k)) * scale, clip).T


def _lowrank_covariance(G: np.ndarray, batch: int, sigma2: float) -> np.ndarray:
    """Covariance implied by the notes 6(b) formula:
    ``sigma2 (I - U_r U_r^T) + U_r diag((sigma2 - lambda)_+) U_r^T``."""
    k, d = G.shape
    u, s, _ = np.linalg.svd(G, full_matrices=False)
    lam = s**2 / (batch * d)
    return sigma2 * (np.eye(k) - u @ u.T) + (u * np.maximum(sigma2 - lam, 0.0)) @ u.T


def _aggregate(Gs: list[np.ndarray], cov) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of ``sum_j x_j`` for independent Gaussian updates (eq. 18)."""
    return sum(G.mean(axis=1) for G in Gs), sum(cov(G) for G in Gs)


def _neighbour(
    Gs: list[np.ndarray], rng: np.random.Generator, clip: float, scale: float, kind: int
) -> list[np.ndarray]:
    """Replace user 0's first record: a fresh clipped gradient, its negation at norm C, or C times
    the least-variance direction of the aggregate (the hardest directions for the bounds)."""
    g_old = Gs[0][:, 0]
    k = g_old.size
    if kind == 0:
        g_new = clip_rows(rng.normal(size=k) * scale, clip)
    elif kind == 1:
        g_new = -clip * g_old / max(float(np.linalg.norm(g_old)), 1e-300)
    else:
        g_new = clip * np.linalg.eigh(sum(G @ G.T for G in Gs))[1][:, 0]
    changed = Gs[0].copy()
    changed[:, 0] = g_new
    return [changed] + Gs[1:]


# -------------------------------------------------------------- updates (Assumptions 1-2, Remark 1)


def test_gaussian_sampling_is_the_linear_map_of_eq17():
    rng = np.random.default_rng(11)
    G = _clipped(rng, 4, 6, 1.0, 0.7)
    x = gaussian_sampling_update(G, 3, np.random.default_rng(5))
    xi = np.random.default_rng(5).standard_normal(6)
    np.testing.assert_allclose(x, G.mean(axis=1) + G @ xi / math.sqrt(3 * 6), rtol=0, atol=1e-15)


def test_gaussian_sampling_mean_and_covariance():
    """Monte Carlo: mean ``(1/D) sum g`` and covariance ``G G^T / (B D)`` (eqs. 16-17)."""
    rng = np.random.default_rng(2)
    k, d, b, n = 3, 5, 2, 20_000
    G = _clipped(rng, k, d, 1.0, 1.0)
    xs = np.array([gaussian_sampling_update(G, b, rng) for _ in range(n)])
    cov = G @ G.T / (b * d)
    se_mean = np.sqrt(np.diag(cov) / n)
    assert np.all(np.abs(xs.mean(axis=0) - full_gradient_update(G)) < 4.5 * se_mean)
    assert np.abs(np.cov(xs.T) - cov).max() < 0.05 * np.abs(cov).max()


def test_iid_sampling_draws_b_distinct_columns():
    G = 2.0 ** np.arange(7)[None, :]  # B x is a sum of distinct powers of two
    rng = np.random.default_rng(0)
    for b in (1, 3, 7):
        for _ in range(20):
            total = int(round(b * float(iid_sampling_update(G, b, rng)[0])))
            assert bin(total).count("1") == b
    xs = np.array([iid_sampling_update(G, 3, rng)[0] for _ in range(4000)])
    assert abs(xs.mean() - G.mean()) < 4 * G.std() / math.sqrt(3 * 4000)


def test_isotropic_noise_variance():
    n = isotropic_noise(100_000, 0.25, np.random.default_rng(1))
    assert n.shape == (100_000,) and abs(n.var() - 0.25) < 0.005
    assert not np.any(isotropic_noise(5, 0.0, np.random.default_rng(1)))


@PROPERTY
@given(
    grads=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 12), st.integers(1, 5)),
        elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
    ),
    clip=st.floats(0.5, 2.0),
)
def test_lemma2_holds_for_clipped_gradients(grads, clip):
    """Lemma 2: ``lambda_max(G G^T / D) <= C^2`` once every example is clipped."""
    clipped = clip_rows(grads, clip)
    assert np.all(np.linalg.norm(clipped, axis=1) <= clip * (1 + 1e-12))
    assert lemma2_holds(clipped.T, clip)


def test_lemma2_fails_without_clipping():
    assert not lemma2_holds(np.full((3, 4), 2.0), 1.0)


# ---------------------------------------------------------------- WF-NA (section 5.1, notes 6(b))


@PROPERTY
@given(
    k=st.integers(1, 8),
    d=st.integers(1, 12),
    b=st.integers(1, 4),
    clip=st.floats(0.5, 2.0),
    log_sigma=st.floats(-2.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_wfna_floors_the_spectrum(k, d, b, clip, log_sigma, seed):
    """``Sigma_i + Delta Sigma`` has eigenvalues ``max(lambda, sigma2)`` (so
    ``lambda_min >= sigma2``), ``tr(Delta Sigma) <= K sigma2``, and the low-rank formula has exactly
    the same covariance."""
    b = min(b, d)
    rng = np.random.default_rng(seed)
    G = _clipped(rng, k, d, clip, clip * rng.uniform(0.2, 3.0) / math.sqrt(k))
    sigma2 = clip**2 / (k * b) * 10.0**log_sigma
    sigma = G @ G.T / (b * d)
    delta = wfna_covariance(G, b, sigma2)
    total = np.linalg.eigvalsh(sigma + delta)
    assert total.min() >= sigma2 * (1 - 1e-9)
    np.testing.assert_allclose(
        total,
        np.maximum(np.maximum(np.linalg.eigvalsh(sigma), 0), sigma2),
        rtol=0,
        atol=1e-12 * max(sigma2, clip**2),
    )
    assert np.linalg.eigvalsh(delta).min() >= -1e-12 * sigma2
    assert np.trace(delta) <= k * sigma2 * (1 + 1e-12)
    np.testing.assert_allclose(
        _lowrank_covariance(G, b, sigma2), delta, rtol=0, atol=1e-10 * max(sigma2, 1.0)
    )


def _spectrum(k: int, singular: list[float], rng: np.random.Generator) -> np.ndarray:
    """``(K, D)`` matrix with the given singular values and random orthonormal factors."""
    d = len(singular)
    q = np.linalg.qr(rng.normal(size=(k, k)))[0][:, :d]
    v = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return (q * np.asarray(singular)) @ v.T


@pytest.mark.parametrize("sampler", [wfna_noise_full, wfna_noise_lowrank])
def test_wfna_noise_has_the_exact_covariance(sampler):
    """Monte Carlo, K = 6 > D = 3: the samples have covariance ``Delta Sigma`` (both samplers)."""
    rng = np.random.default_rng(4)
    k, d, b, sigma2, n = 6, 3, 1, 1.0, 20_000
    G = _spectrum(k, list(np.sqrt(np.array([4.0, 0.5, 0.1]) * b * d)), rng)  # lambda = 4, 0.5, 0.1
    exact = wfna_covariance(G, b, sigma2)
    draws = np.array([sampler(G, b, sigma2, rng) for _ in range(n)])
    assert np.abs(draws.T @ draws / n - exact).max() < 0.06 * sigma2
    assert np.abs(draws.mean(axis=0)).max() < 4.5 * math.sqrt(sigma2 / n)


@pytest.mark.parametrize("sampler", [wfna_noise_full, wfna_noise_lowrank])
def test_wfna_adds_nothing_where_lambda_reaches_sigma2(sampler):
    rng = np.random.default_rng(8)
    k, d, b, sigma2 = 7, 4, 2, 0.5
    lam = np.array([3.0, 1.01, 0.5, 0.05]) * sigma2  # two directions above the floor
    G = _spectrum(k, list(np.sqrt(lam * b * d)), rng)
    evals, evecs = np.linalg.eigh(G @ G.T / (b * d))
    quiet = evecs[:, evals >= sigma2 * (1 - 1e-9)]
    assert quiet.shape[1] == 2
    for _ in range(200):
        n = sampler(G, b, sigma2, rng)
        assert np.abs(quiet.T @ n).max() < 1e-12
    assert np.allclose(quiet.T @ wfna_covariance(G, b, sigma2) @ quiet, 0, atol=1e-14)


def test_wfna_dispatch():
    rng = np.random.default_rng(0)
    wide, tall = rng.normal(size=(6, 3)), rng.normal(size=(3, 6))  # D < K, D >= K
    for G, chosen in ((wide, wfna_noise_lowrank), (tall, wfna_noise_full)):
        auto = wfna_noise(G, 2, 0.3, np.random.default_rng(9))
        assert np.array_equal(auto, chosen(G, 2, 0.3, np.random.default_rng(9)))
    for method, sampler in (("full", wfna_noise_full), ("lowrank", wfna_noise_lowrank)):
        assert np.array_equal(
            wfna_noise(wide, 2, 0.3, np.random.default_rng(3), method=method),
            sampler(wide, 2, 0.3, np.random.default_rng(3)),
        )


def test_blockwise_wfna_counterexample():
    """Notes 9.7: ``Sigma = [[1, 1], [1, 1]]``, ``sigma2 = 1``, two 1 x 1 blocks. Each block already
    has variance 1, so a blockwise floor adds nothing and leaves ``lambda_min = 0``; exact WF-NA
    adds noise."""
    G = np.array([[1.0], [1.0]])  # B = D = 1: Sigma = G G^T
    sigma = G @ G.T
    exact = wfna_covariance(G, 1, 1.0)
    assert np.linalg.eigvalsh(sigma + exact).min() >= 1 - 1e-12
    np.testing.assert_allclose(exact, 0.5 * np.array([[1.0, -1.0], [-1.0, 1.0]]), atol=1e-15)
    blockwise = np.diag(
        [max(1.0 - sigma[i, i], 0.0) for i in range(2)]
    )  # floor each 1 x 1 block separately
    assert not np.any(blockwise)
    assert np.linalg.eigvalsh(sigma + blockwise).min() < 1e-12


# ---------------------------------------------------------------- diagnostics


def test_covariance_is_singular():
    rng = np.random.default_rng(0)
    assert covariance_is_singular(rng.normal(size=(5, 4)))  # D < K: rank <= D
    assert not covariance_is_singular(rng.normal(size=(5, 9)))
    repeated = rng.normal(size=(3, 1)) @ np.ones((1, 6))  # D >= K but rank 1
    assert covariance_is_singular(repeated)


def test_min_eigenvalue_sum():
    rng = np.random.default_rng(1)
    Gs = [rng.normal(size=(3, 7)) for _ in range(4)]
    expected = sum(np.linalg.eigvalsh(G @ G.T / 7)[0] for G in Gs)
    assert min_eigenvalue_sum(Gs) == pytest.approx(expected, rel=1e-10)
    assert min_eigenvalue_sum([rng.normal(size=(5, 3))]) == 0.0  # singular: D < K


def test_theorem1_span_condition():
    """Theorem 1: a replacement outside the span moves the Gaussian-sampling aggregate off the
    support."""
    rng = np.random.default_rng(3)
    basis = np.linalg.qr(rng.normal(size=(6, 2)))[0]
    Gs = [basis @ rng.normal(size=(2, 3)) for _ in range(3)]  # every gradient in a 2-D subspace
    assert in_span(basis @ np.array([0.3, -2.0]), Gs)
    outside = rng.normal(size=6)
    assert not in_span(outside, Gs) and not in_span(outside, np.hstack(Gs))
    changed = Gs[0].copy()
    changed[:, 0] = outside
    aggregate = np.sum([gaussian_sampling_update(G, 1, rng) for G in [changed] + Gs[1:]], axis=0)
    assert not in_span(aggregate, Gs)
    original = np.sum([gaussian_sampling_update(G, 1, rng) for G in Gs], axis=0)
    assert in_span(original, Gs)


def _renyi_1d_quadrature(alpha: float, m1: float, v1: float, m2: float, v2: float) -> float:
    p, q = stats.norm(m1, math.sqrt(v1)), stats.norm(m2, math.sqrt(v2))
    precision = alpha / v1 + (1 - alpha) / v2  # p^alpha q^(1-alpha) is a scaled Gaussian:
    centre = (
        alpha * m1 / v1 + (1 - alpha) * m2 / v2
    ) / precision  # integrate 40 of its sds either side
    lo, hi = centre - 40 / math.sqrt(precision), centre + 40 / math.sqrt(precision)
    value, _ = integrate.quad(
        lambda x: math.exp(alpha * p.logpdf(x) + (1 - alpha) * q.logpdf(x)),
        lo,
        hi,
        epsabs=0,
        epsrel=1e-12,
        limit=200,
    )
    return math.log(value) / (alpha - 1)


@pytest.mark.parametrize("alpha", [0.5, 1.5, 2.0, 4.0])
def test_gaussian_renyi_divergence_matches_quadrature(alpha):
    m1, v1, m2, v2 = 0.3, 1.3, -0.4, 1.0
    expected = _renyi_1d_quadrature(alpha, m1, v1, m2, v2)
    got = gaussian_renyi_divergence(
        alpha, np.array([m1]), np.array([[v1]]), np.array([m2]), np.array([[v2]])
    )
    assert got == pytest.approx(expected, rel=1e-8)


def test_gaussian_renyi_divergence_is_additive_and_rotation_invariant():
    """Independent coordinates add; a common rotation of both laws changes nothing."""
    alpha, m1, v1, m2, v2 = (
        3.0,
        np.array([0.1, 1.0]),
        np.array([1.2, 0.9]),
        np.array([-0.2, 0.4]),
        np.array([1.0, 1.1]),
    )
    parts = sum(
        gaussian_renyi_divergence(
            alpha, m1[i : i + 1], np.diag(v1[i : i + 1]), m2[i : i + 1], np.diag(v2[i : i + 1])
        )
        for i in range(2)
    )
    assert gaussian_renyi_divergence(alpha, m1, np.diag(v1), m2, np.diag(v2)) == pytest.approx(
        parts, rel=1e-12
    )
    rot = np.linalg.qr(np.random.default_rng(0).normal(size=(2, 2)))[0]
    rotated = gaussian_renyi_divergence(
        alpha, rot @ m1, rot @ np.diag(v1) @ rot.T, rot @ m2, rot @ np.diag(v2) @ rot.T
    )
    assert rotated == pytest.approx(parts, rel=1e-10)


def test_gaussian_renyi_divergence_edge_values():
    eye = np.eye(3)
    assert gaussian_renyi_divergence(2.0, np.ones(3), eye, np.ones(3), eye) == 0.0
    assert (
        gaussian_renyi_divergence(4.0, np.zeros(3), eye, np.zeros(3), 0.5 * eye) == math.inf
    )  # Sigma_alpha = -eye


# ---------------------------------------------------- Theorems 2 and 4 against the exact divergence


@st.composite
def _federation(draw: st.DrawFn, theorem2: bool) -> dict:
    k = draw(st.integers(1, 5))
    d = draw(st.integers(k, 12) if theorem2 else st.integers(1, 12))  # Assumption 3 needs D >= K
    return {
        "k": k,
        "d": d,
        "n": draw(st.integers(1, 6)),
        "b": min(draw(st.integers(1, 4)), d),
        "clip": draw(st.floats(0.5, 2.0)),
        "alpha": draw(st.sampled_from(ALPHAS)),
        "kind": draw(st.integers(0, 2)),
        "spread": draw(st.floats(-1.0, 1.0)),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def test_theorem2_bound_holds_for_exact_divergence():
    """Eq. 22 between neighbouring Assumption 2 aggregates never exceeds eq. 19.

    Aggregate: ``N(sum_j mean_j, sum_j G_j G_j^T / (B D))`` (eqs. 16, 18). The proof (notes section
    4) bounds ``D_alpha(M(D) || M(D'))`` with ``Lambda`` of the first argument's datasets; each
    direction is checked with its own ``Lambda``, only where Assumption 3 holds and
    ``alpha < D Lambda / C^2``.
    """
    ratios: list[float] = []

    @PROPERTY
    @given(f=_federation(theorem2=True))
    def check(f: dict) -> None:
        rng = np.random.default_rng(f["seed"])
        k, d, b, clip = f["k"], f["d"], f["b"], f["clip"]
        scale = clip * 10.0 ** f["spread"] / math.sqrt(k)
        Gs = [_clipped(rng, k, d, clip, scale) for _ in range(f["n"])]
        neighbour = _neighbour(Gs, rng, clip, scale, f["kind"])
        setting = Setting(users=f["n"], samples=d, batch=b, clip=clip)
        laws = [_aggregate(datasets, lambda G: G @ G.T / (b * d)) for datasets in (Gs, neighbour)]
        for first, second, datasets in ((0, 1, Gs), (1, 0, neighbour)):
            if any(covariance_is_singular(G) for G in datasets):
                continue
            bound = rdp_theorem2(f["alpha"], setting, min_eigenvalue_sum(datasets))
            if not math.isfinite(bound):
                continue
            actual = gaussian_renyi_divergence(f["alpha"], *laws[first], *laws[second])
            assert actual <= bound * (1 + 1e-9)
            ratios.append(actual / bound)

    check()
    assert len(ratios) >= 20, "too few instances inside eq. 19's range"
    print(f"Theorem 2: {len(ratios)} checks, max ratio {max(ratios):.3f}")


def test_theorem4_bound_holds_for_exact_divergence():
    """Eq. 22 with WF-NA covariances on both sides (``Sigma_{i,+} = G G^T / (B D) + Delta Sigma``)
    never exceeds eq. 35, in both directions. ``sigma2`` puts ``alpha`` at a drawn fraction of the
    positivity range ``alpha < N B D sigma2 / (2 C^2)``. The Loewner claim of eq. 38 is false and is
    not checked."""
    ratios: list[float] = []

    @PROPERTY
    @given(f=_federation(theorem2=False), fraction=st.floats(0.05, 0.95))
    def check(f: dict, fraction: float) -> None:
        rng = np.random.default_rng(f["seed"])
        k, d, b, clip, n, alpha = f["k"], f["d"], f["b"], f["clip"], f["n"], f["alpha"]
        sigma2 = alpha / fraction * 2 * clip**2 / (n * b * d)
        scale = math.sqrt(sigma2 * b) * 10.0 ** f["spread"]  # eigenvalues around the floor
        Gs = [_clipped(rng, k, d, clip, scale) for _ in range(n)]
        neighbour = _neighbour(Gs, rng, clip, scale, f["kind"])
        bound = rdp_theorem4(alpha, Setting(users=n, samples=d, batch=b, clip=clip), sigma2)
        assert math.isfinite(bound)
        floored = [
            _aggregate(datasets, lambda G: G @ G.T / (b * d) + wfna_covariance(G, b, sigma2))
            for datasets in (Gs, neighbour)
        ]
        for first, second in ((0, 1), (1, 0)):
            actual = gaussian_renyi_divergence(alpha, *floored[first], *floored[second])
            assert actual <= bound * (1 + 1e-9)
            ratios.append(actual / bound)

    check()
    print(f"Theorem 4: {len(ratios)} checks, max ratio {max(ratios):.3f}")


# ---------------------------------------------------------------- bad input names the argument

G3 = np.ones((3, 3))
RNG = np.random.default_rng(0)
BAD = [
    (lambda: clip_rows(G3, 0.0), "clip"),
    (lambda: clip_rows(np.ones((2, 2, 2)), 1.0), "grads"),
    (lambda: clip_rows([[np.nan]], 1.0), "grads"),  # type: ignore[arg-type]
    (lambda: full_gradient_update(np.ones(3)), "G"),
    (lambda: full_gradient_update([[np.inf]]), "G"),  # type: ignore[arg-type]
    (lambda: gaussian_sampling_update(G3, 0, RNG), "batch"),
    (lambda: gaussian_sampling_update(G3, 4, RNG), "batch"),
    (lambda: gaussian_sampling_update(G3, 1.5, RNG), "batch"),  # type: ignore[arg-type]
    (lambda: gaussian_sampling_update(G3, 1, 42), "rng"),  # type: ignore[arg-type]
    (lambda: iid_sampling_update(G3, 5, RNG), "batch"),
    (lambda: isotropic_noise(0, 1.0, RNG), "K"),
    (lambda: isotropic_noise(3, -1.0, RNG), "sigma2"),
    (lambda: wfna_covariance(G3, 0, 1.0), "batch"),
    (lambda: wfna_noise_full(G3, 1, -1.0, RNG), "sigma2"),
    (lambda: wfna_noise_lowrank(G3, 1, math.nan, RNG), "sigma2"),
    (lambda: wfna_noise_lowrank(G3, 1, 1.0, None), "rng"),  # type: ignore[arg-type]
    (lambda: wfna_noise(G3, 1, 1.0, RNG, method="blockwise"), "method"),
    (lambda: lemma2_holds(G3, 0.0), "clip"),
    (lambda: covariance_is_singular(np.ones(3)), "G"),
    (lambda: in_span(np.ones(2), G3), "g_new"),
    (lambda: in_span(np.ones(3), G3, tol=-1.0), "tol"),
    (lambda: in_span(np.ones(3), []), "G_all"),
    (lambda: min_eigenvalue_sum([]), "Gs"),
    (lambda: min_eigenvalue_sum([np.ones((2, 2)), np.ones((3, 2))]), "Gs"),
    (
        lambda: gaussian_renyi_divergence(1.0, np.zeros(1), np.eye(1), np.zeros(1), np.eye(1)),
        "alpha",
    ),
    (
        lambda: gaussian_renyi_divergence(
            2.0, np.zeros(2), np.zeros((2, 2)), np.zeros(2), np.eye(2)
        ),
        "cov1",
    ),
    (lambda: gaussian_renyi_divergence(2.0, np.zeros(2), np.eye(2), np.zeros(3), np.eye(2)), "mu2"),
    (
        lambda: gaussian_renyi_divergence(
            2.0, np.zeros(2), np.eye(2), np.zeros(2), np.array([[1, 0.5], [0, 1]])
        ),
        "cov2",
    ),
]


@pytest.mark.parametrize("call, argument", BAD, ids=[f"{i}-{a}" for i, (_, a) in enumerate(BAD)])
def test_bad_input_names_the_argument(call, argument):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ")
