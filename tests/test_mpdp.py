"""MP-DP (seed 004): perturbation, recovery, noise laws, pairwise cancellation, dropouts,
calibration."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy import stats

torch = pytest.importorskip("torch")
pytest.importorskip("cryptography")

from immersion import InvalidArgumentError  # noqa: E402
from immersion_fl.runtime.engine import RunConfig, run_federated  # noqa: E402
from immersion_fl.runtime.faults import FaultPlan  # noqa: E402
from immersion_mpdp import laws  # noqa: E402
from immersion_mpdp.agreement import KeyAgreement, build_graph  # noqa: E402
from immersion_mpdp.calibration import calibrate, meets_eq23, nout_preconditions  # noqa: E402
from immersion_mpdp.ddp import (  # noqa: E402
    Layout,
    NoiseSettings,
    ddp_client,
    mean_local_result,
    sum_uploads,
)
from immersion_mpdp.lmt import autograd_lmt, local_model_training  # noqa: E402
from immersion_mpdp.mlp import (  # noqa: E402
    forward,
    init_weights,
    mse_gradient,
    one_hot,
    weights_from_module,
)
from immersion_mpdp.perturbation import draw_keys, perturb, recover  # noqa: E402

SIZES = {"L2": (12, 7, 4), "L3": (12, 9, 7, 4), "L4": (12, 9, 8, 7, 4)}


def _batch(n_in: int, n_out: int, batch: int, seed: int) -> tuple[object, object]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(batch, n_in, generator=gen, dtype=torch.float64)
    return x, one_hot(torch.randint(0, n_out, (batch,), generator=gen), n_out)


@pytest.mark.parametrize("sizes", [*SIZES.values(), (64, 20, 12, 10), (6, 5, 4, 4, 4, 2)])
def test_outer_product_lmt_is_bit_identical_to_autograd(sizes):
    """The hand-written backward pass (batched outer products per layer) gives the same bits as
    the vjp + vmap over the n_L + 2 cotangents, for every output of LMT, on several draws
    (ReLU kinks included: some inputs are negative)."""
    for seed in range(4):
        model, _ = perturb(init_weights(sizes, seed=seed), np.random.default_rng(seed))
        x, t = _batch(sizes[0], sizes[-1], 9, seed=seed)
        x = 2 * x - 0.5
        fast, ref = local_model_training(model, x, t), autograd_lmt(model, x, t)
        for name in ("grad_hat", "psi", "phi"):
            for got, want in zip(getattr(fast, name), getattr(ref, name), strict=True):
                assert torch.equal(got, want), (name, sizes, seed)
        assert torch.equal(fast.psi_last, ref.psi_last)


@pytest.mark.parametrize("depth", sorted(SIZES))
@pytest.mark.parametrize("dn2_law", laws.DN2_LAWS)
def test_theorem12_forward_identity(depth, dn2_law):
    """y^hat = y + alpha r on the perturbed 2L-1 layer model, and the hidden layers are r o y, y /
    s."""
    sizes = SIZES[depth]
    w = init_weights(sizes, seed=3)
    model, keys = perturb(w, np.random.default_rng(5), dn2_law=dn2_law)
    x, _ = _batch(sizes[0], sizes[-1], 16, seed=1)
    y_hat, alpha = model.forward(x)
    torch.testing.assert_close(
        y_hat, forward(w, x) + alpha[:, None] * keys.r_out, rtol=1e-12, atol=1e-12
    )
    h, h_hat = x, x
    for layer in range(
        len(sizes) - 2
    ):  # hidden layers: y^hat^(2l-1) = r^(l) o y, y^hat^(2l) = y / s^(l)
        h = (h @ w[layer].T).clamp_min(0)
        h_hat = (h_hat @ model.odd[layer].T).clamp_min(0)
        torch.testing.assert_close(h_hat, keys.r[layer] * h, rtol=1e-12, atol=1e-12)
        h_hat = (h_hat * model.transitional[layer]).clamp_min(0)
        torch.testing.assert_close(h_hat, h / keys.s[layer], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(alpha, h_hat.sum(1))


@pytest.mark.parametrize("depth", sorted(SIZES))
def test_recovery_equals_autograd_per_sample_and_per_batch(depth):
    """Theorem 4: R o (grad^hat - r^T Psi + v Phi) is the true gradient of the original MLP."""
    sizes = SIZES[depth]
    w = init_weights(sizes, seed=0)
    model, keys = perturb(w, np.random.default_rng(1))
    for batch in (1, 9):
        x, t = _batch(sizes[0], sizes[-1], batch, seed=batch)
        out = local_model_training(model, x, t)
        assert [tuple(p.shape) for p in out.psi] == [
            (sizes[-1], b, a) for a, b in zip(sizes[:-2], sizes[1:-1], strict=True)
        ]
        recovered = recover(keys, out.grad_hat, out.psi, out.psi_last, out.phi)
        for got, want in zip(recovered, mse_gradient(w, x, t), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_keys_positive_diagonal_transitional_and_fresh_each_round():
    w = init_weights(SIZES["L4"], seed=0)
    rng = np.random.default_rng(2)
    (m1, k1), (m2, k2) = perturb(w, rng), perturb(w, rng)
    for keys in (k1, k2):
        assert all(bool((v > 0).all()) for v in (*keys.r, *keys.s))
    assert all(bool((d > 0).all()) and d.dim() == 1 for d in m1.transitional)
    assert not any(torch.equal(a, b) for a, b in zip(k1.r, k2.r, strict=True))
    assert not torch.equal(m1.odd[0], m2.odd[0])


def _ks_normal(samples: np.ndarray, sigma: float) -> float:
    return float(stats.kstest(samples / sigma, "norm").pvalue)


@pytest.mark.parametrize("dn2_law", laws.DN2_LAWS)
def test_masked_noise_is_gaussian_at_first_middle_last_layer(dn2_law):
    """Theorems 5/6: R^(2l-1)_ij eta_ij ~ N(0, sigma^2), R from Eq. 13 and eta ~ DN(sigma, 1)."""
    sizes, sigma = (3, 4, 4, 4, 2), 0.7
    rng = np.random.default_rng(11)
    samples: dict[int, list[float]] = {0: [], 2: [], 3: []}  # first, a middle, the last layer
    for _ in range(2000):  # one element per key draw: elements of one R share factors
        keys = draw_keys(sizes, rng, dn2_law=dn2_law)
        for layer in samples:
            samples[layer].append(
                float(keys.mask(layer)[0, 0]) * float(laws.uniform_dn(sigma, (1,), rng)[0])
            )
    for layer, values in samples.items():
        assert _ks_normal(np.array(values), sigma) > 1e-3, f"layer {layer}"


def test_products_of_laws_by_ks():
    """|DN*(1)| DN(sigma,1) ~ N(0, sigma^2); the DN*(2) pair and the series give |DN*(1)|."""
    rng, n = np.random.default_rng(0), 40_000
    sigma = 2.0
    assert (
        _ks_normal(laws.abs_dn_star_1((n,), rng) * laws.uniform_dn(sigma, (n,), rng), sigma) > 1e-3
    )
    target = laws.abs_dn_star_1((n,), rng)
    pair = laws.abs_dn_star_2((n,), rng, factor="left") * laws.abs_dn_star_2(
        (n,), rng, factor="right"
    )
    series = laws.abs_dn_star_2((4000,), rng, law="series") * laws.abs_dn_star_2(
        (4000,), rng, law="series"
    )
    assert stats.ks_2samp(pair, target).pvalue > 1e-3
    assert stats.ks_2samp(series, target).pvalue > 1e-3
    assert np.abs(laws.uniform_dn(sigma, (n,), rng)).max() <= np.sqrt(2) * sigma


def test_naive_gaussian_noise_is_not_gaussian_after_masking():
    """The MP-DP-Naive ablation: Gaussian eta on the perturbed gradient gives E[R^2] sigma^2, not
    sigma^2."""
    rng, n = np.random.default_rng(4), 50_000
    r = laws.abs_dn_star_1((n,), rng)
    naive = r * rng.normal(0, 1.0, n)
    assert stats.kstest(naive, "norm").pvalue < 1e-6
    assert abs(naive.var() - 1.5) < 0.05


@pytest.mark.parametrize("graph", ["complete", "nout:2"])
def test_pairwise_noise_and_masks_cancel_in_the_sum(graph):
    """Eq. 20: the Delta cancel up to float rounding; the 64-bit masks cancel exactly."""
    sizes, k = (5, 4, 3), 6
    layout = Layout(sizes)
    w = init_weights(sizes, seed=0)
    model, _ = perturb(w, np.random.default_rng(0))
    agreements = {c: KeyAgreement(c, 0, bytes([c + 1]) * 32) for c in range(k)}
    publics = {c: a.public_bytes for c, a in agreements.items()}
    neighbours = build_graph(list(range(k)), graph, np.random.default_rng(1))
    locals_ = [local_model_training(model, *_batch(5, 3, 4, seed=c)) for c in range(k)]
    for noise in (NoiseSettings(0.0, 0.0, False), NoiseSettings(0.0, 50.0, True)):
        uploads = []
        for c in range(k):
            seeds = {
                v: {p: agreements[c].pair_seed(v, publics[v], p) for p in ("delta", "mask")}
                for v in neighbours[c]
            }
            uploads.append(
                ddp_client(
                    locals_[c],
                    layout,
                    me=c,
                    seeds=seeds,
                    n_clients=k,
                    noise=noise,
                    rng=np.random.default_rng(c),
                )
            )
        mean = mean_local_result(
            sum_uploads(uploads, masked=noise.mask_corrections),
            k,
            layout,
            masked=noise.mask_corrections,
        )
        if noise.sigma_delta:
            assert (
                float(np.abs(uploads[0].gradient - layout.flatten(locals_[0])[0]).max()) > 1.0
            )  # noisy uploads
        plain_grad = sum(layout.flatten(lr)[0] for lr in locals_) / k
        plain_corr = sum(layout.flatten(lr)[1] for lr in locals_) / k
        got_grad, got_corr = layout.flatten(mean)
        assert np.abs(got_grad - plain_grad).max() < 1e-13 * max(1.0, 10 * noise.sigma_delta)
        assert np.abs(got_corr - plain_corr).max() < 1e-14 * max(1.0, np.abs(plain_corr).max())


def test_corrections_beyond_the_fixed_point_range_are_refused_by_name():
    """DDP_Client's masked corrections use the core's fixed point (tests/test_securesum.py); a
    correction whose sum could overflow is refused naming ``corrections``."""
    sizes = (5, 4, 3)
    model, _ = perturb(init_weights(sizes, seed=0), np.random.default_rng(0))
    local = local_model_training(model, *_batch(5, 3, 4, seed=0))
    huge = dataclasses.replace(local, psi_last=local.psi_last * 0 + 1e13)
    with pytest.raises(InvalidArgumentError, match="corrections"):
        ddp_client(
            huge,
            Layout(sizes),
            me=0,
            seeds={},
            n_clients=10,
            noise=NoiseSettings(0.0, 0.0, True),
            rng=np.random.default_rng(0),
        )


def test_key_agreement_is_symmetric_and_purpose_bound():
    a, b = KeyAgreement(0, 3), KeyAgreement(5, 3)
    assert a.pair_seed(5, b.public_bytes, "delta") == b.pair_seed(0, a.public_bytes, "delta")
    assert a.pair_seed(5, b.public_bytes, "delta") != a.pair_seed(5, b.public_bytes, "mask")
    assert KeyAgreement(0, 4).public_bytes != a.public_bytes  # fresh key pair each round
    with pytest.raises(InvalidArgumentError, match="peer_public"):
        a.pair_seed(5, b"short", "delta")


def test_graphs():
    members = list(range(20))
    nout = build_graph(members, "nout:3", np.random.default_rng(0))
    assert all(len(v) >= 3 for v in nout.values())
    assert all(k in nout[v] for k in nout for v in nout[k])
    complete = build_graph(members, "complete", np.random.default_rng(0))
    assert all(len(v) == 19 for v in complete.values())
    for bad in ("ring", "nout:0", "nout:x"):
        with pytest.raises(InvalidArgumentError, match="graph"):
            build_graph(members, bad, np.random.default_rng(0))


def test_calibration_meets_eq23_and_refuses_theorem11_outside_preconditions():
    for eps in (0.5, 1.0, 3.0):
        cal = calibrate(eps, 1e-5, 10)
        assert meets_eq23(eps, 1e-5, cal.theta) and not meets_eq23(eps, 1e-5, cal.theta * 1.01)
        assert cal.theta == pytest.approx(
            1 / (cal.sigma_eta**2 * 10) + 1 / (cal.sigma_delta**2 * 10)
        )
    literal = calibrate(1.0, 1e-5, 10, reading="literal")
    assert literal.theta == pytest.approx(
        1 / (literal.sigma_eta * 10) + 1 / (literal.sigma_delta * 10)
    )
    with pytest.raises(InvalidArgumentError, match="K >= 81"):
        calibrate(1.0, 1e-5, 100 // 2, "nout:5")  # the paper's own experiments are outside
    assert "floor((n-1)/3) > 1, i.e. n >= 7" in nout_preconditions(100, 5, 1e-5)
    cal = calibrate(1.0, 1e-5, 100, "nout:70")
    assert cal.theorem.startswith("Theorem 11") and meets_eq23(1.0, 1e-5 / 3, cal.theta)
    assert calibrate(1.0, 1e-5, 10, sensitivity=4.0).sigma_eta == pytest.approx(
        4 * calibrate(1.0, 1e-5, 10).sigma_eta
    )


def _cfg(**kw):
    base = dict(
        scheme="mpdp", noise="off", clients=4, rounds=3, hidden=(16, 8), batch_size=8, lr=0.1
    )
    base.update(kw)
    return RunConfig.from_flat(base)


@pytest.mark.parametrize("mask_corrections", [True, False])
def test_noise_off_equals_plain_fedsgd_every_round(mask_corrections):
    res = run_federated(_cfg(mask_corrections=mask_corrections))
    assert len(res.diff_vs_plain) == 3 and max(res.diff_vs_plain) < 1e-9
    assert res.accuracy == res.accuracy_plain
    summary = res.summary()
    for key in (
        "max_abs_diff_vs_plain",
        "accuracy",
        "accuracy_plain",
        "round_time_ratio",
        "upload_bytes_ratio",
        "epsilon",
        "delta",
    ):
        assert key in summary
    assert summary["upload_bytes_ratio"] > 8  # Psi is n_L times the gradient


def test_dropout_after_key_agreement_is_recovered():
    """A client crashing after the key agreement: its neighbours reveal their seeds; still equal to
    FedSGD."""
    res = run_federated(_cfg(), faults=FaultPlan({(1, 1): "raise", (2, 2): "malformed"}))
    assert [(d["round"], d["client"]) for d in res.dropped] == [(1, 1), (2, 2)]
    assert max(res.diff_vs_plain) < 1e-9


def test_dropout_recovery_removes_pairwise_noise():
    """sigma_eta = 0, large sigma_Delta: after recovery the aggregate is FedSGD's up to rounding."""
    from immersion_mpdp import engine

    cfg = _cfg(noise="on")
    setup = engine.make_setup(cfg)
    w0 = init_weights(setup.sizes, 0)
    server = engine.MpdpServer(
        [w.clone() for w in w0],
        cfg.lr,
        NoiseSettings(0.0, 20.0, True),
        rng=np.random.default_rng(0),
    )
    clients = {c.index: c for c in setup.clients}
    survivors, _ = engine.mpdp_round(
        server,
        clients,
        sorted(clients),
        0,
        plan=FaultPlan({(3, 0): "raise"}),
        dropped=[],
        aborted=[],
        phase_s={},
    )
    plain = engine.fedsgd_step(w0, [clients[k] for k in survivors], 0, cfg.lr)
    assert survivors == [0, 1, 2]
    assert (
        max(float((a - b).abs().max()) for a, b in zip(server.weights, plain, strict=True)) < 1e-9
    )


def test_round_aborted_when_a_survivor_does_not_reveal_then_retried():
    res = run_federated(_cfg(), faults=FaultPlan({(0, 1): "raise", (2, 1): "no-recovery"}))
    assert [a["round"] for a in res.aborted] == [1]
    assert "client 2 did not reveal" in res.aborted[0]["reason"]
    assert max(res.diff_vs_plain) < 1e-9  # the retry aggregates clients 1 and 3


def test_a_round_aborted_every_attempt_raises_the_named_error(monkeypatch):
    """Recovery keeps failing (one attempt allowed here): SecureAggregationError, not a plain
    RuntimeError."""
    import immersion_fl
    from immersion_mpdp import engine

    monkeypatch.setattr(engine, "MAX_ATTEMPTS", 1)
    with pytest.raises(immersion_fl.SecureAggregationError, match="round 1: aborted 1 times"):
        run_federated(_cfg(), faults=FaultPlan({(0, 1): "raise", (2, 1): "no-recovery"}))


def test_every_client_failing_raises_the_named_error():
    import immersion_fl

    plan = FaultPlan({(k, 0): "raise" for k in range(4)})
    with pytest.raises(immersion_fl.EveryClientFailedError, match="round 0"):
        run_federated(_cfg(), faults=plan)


def test_noise_on_reports_privacy_and_measured_sensitivity():
    out = run_federated(_cfg(noise="on", epsilon=3.0, rounds=2)).summary()
    assert out["epsilon"] == 3.0 and out["delta"] == 1e-5 and out["epsilon_total"] == 6.0
    assert out["theorem"].startswith("Theorem 10") and out["sigma_eta"] > 0
    assert out["sensitivity_observed_max"] > 0 and out["max_abs_diff_vs_plain"] > 1e-6


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("model", "cnn", "model"),
        ("optimizer", "adam", "optimizer"),
        ("local_epochs", 2, "local_epochs"),
        ("noise", "laplace", "noise"),
        ("graph", "star", "graph"),
        ("hidden", (), "hidden"),
        ("clients", 1, "clients"),
    ],
)
def test_bad_options_are_refused_by_name(field, value, match):
    with pytest.raises(InvalidArgumentError, match=match):
        run_federated(_cfg(**{field: value}))


def test_modules_with_biases_or_other_layers_are_refused():
    nn = torch.nn
    ok = nn.Sequential(
        nn.Flatten(), nn.Linear(4, 3, bias=False), nn.ReLU(), nn.Linear(3, 2, bias=False)
    )
    assert [tuple(w.shape) for w in weights_from_module(ok)] == [(3, 4), (2, 3)]
    with pytest.raises(InvalidArgumentError, match="bias"):
        weights_from_module(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2, bias=False)))
    with pytest.raises(InvalidArgumentError, match="Tanh"):
        weights_from_module(
            nn.Sequential(nn.Linear(4, 3, bias=False), nn.Tanh(), nn.Linear(3, 2, bias=False))
        )
    with pytest.raises(InvalidArgumentError, match="L >= 2"):
        perturb([torch.ones(2, 3, dtype=torch.float64)], np.random.default_rng(0))


def test_cli_json(tmp_path):
    from click.testing import CliRunner
    from immersion.cli.main import main

    out = CliRunner().invoke(
        main,
        [
            "fl",
            "run",
            "--scheme",
            "mpdp",
            "--noise",
            "off",
            "--clients",
            "3",
            "--rounds",
            "2",
            "--hidden",
            "8",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    assert summary["scheme"] == "mpdp" and summary["max_abs_diff_vs_plain"] < 1e-9
    bad = CliRunner().invoke(main, ["fl", "run", "--scheme", "sifl-m1", "--noise", "on"])
    assert bad.exit_code != 0 and "noise" in bad.output


def test_an_aborted_round_counts_twice_in_epsilon_total():
    res = run_federated(
        _cfg(noise="on", rounds=2), faults=FaultPlan({(0, 1): "raise", (2, 1): "no-recovery"})
    )
    out = res.summary()
    assert (
        len(res.aborted) == 1
        and out["releases"] == 3
        and out["epsilon_total"] == pytest.approx(3 * out["epsilon"])
    )


def test_round_outside_the_one_word_range_is_retried_with_two_words(monkeypatch):
    """With a one-word range made tiny, every round falls back to two words (recorded, logged)
    and MP-DP still equals plain FedSGD; the default one word equals it as well."""
    from immersion.securesum import protocol as securesum

    one = run_federated(_cfg(rounds=2))
    assert max(one.diff_vs_plain) < 1e-9 and not one.aborted
    monkeypatch.setattr(securesum, "ONE_LIMB_BITS", 61)  # range 2 / K
    res = run_federated(_cfg(rounds=2))
    assert max(res.diff_vs_plain) < 1e-9
    assert [a["round"] for a in res.aborted] == [0, 1]
    assert all("two words" in a["reason"] for a in res.aborted)


def test_delta_summed_in_integers_is_the_sum_of_the_pairs_deltas():
    """add_pair_deltas (one integer sum over the peers' keystreams, one rounding) equals the
    signed sum of every pair's Delta within float rounding, and each pair's Delta is
    DN(sigma_Delta, 1) = Uniform(-sqrt(2) sigma, sqrt(2) sigma) (KS test)."""
    from immersion_mpdp.ddp import add_pair_deltas, pair_delta

    seeds = {v: bytes([v + 1]) * 32 for v in (0, 1, 4, 7)}
    sigma, n, me = 50.0, 20_000, 3
    got = add_pair_deltas(np.zeros(n), me, seeds, sigma)
    want = sum((1 if me < v else -1) * pair_delta(s, sigma, n) for v, s in seeds.items())
    assert np.abs(got - want).max() < 1e-13 * sigma * len(seeds)
    one = pair_delta(seeds[4], sigma, n)
    bound = np.sqrt(2) * sigma
    assert one.min() >= -bound and one.max() < bound
    assert stats.kstest(one, "uniform", args=(-bound, 2 * bound)).pvalue > 1e-3
    with pytest.raises(InvalidArgumentError, match="seeds"):
        add_pair_deltas(np.zeros(4), 3, {3: bytes(32)}, sigma)


def test_auto_graphs_keep_the_accountant_honest():
    """graph="auto": Theorem 10 (complete) below the client count where Theorem 11 allows an
    n-out graph with n <= (K - 1) / 4, Theorem 11 at delta / 3 above (a larger sigma_eta, stated);
    mask_graph="auto": complete up to 7 clients, nout:2 above; both reported in the summary."""
    from immersion_mpdp.agreement import resolve_mask_graph
    from immersion_mpdp.calibration import resolve_noise_graph

    below, above = calibrate(1.0, 1e-5, 288, "auto"), calibrate(1.0, 1e-5, 289, "auto")
    assert below.theorem.startswith("Theorem 10") and below.graph == "complete"
    assert above.theorem.startswith("Theorem 11") and above.graph == "nout:72"
    assert not nout_preconditions(289, 72, 1e-5 / 3) and nout_preconditions(289, 71, 1e-5 / 3)
    assert meets_eq23(1.0, 1e-5 / 3, above.theta)
    assert above.sigma_eta > below.sigma_eta * 1.04  # the price of delta / 3
    assert calibrate(1.0, 1e-5, 289, "nout:72") == above
    assert resolve_noise_graph("auto", 10, 1e-5) == "complete"
    assert resolve_noise_graph("nout:3", 10, 1e-5) == "nout:3"  # explicit: as given
    assert [resolve_mask_graph("auto", k) for k in (2, 7, 8)] == ["complete"] * 2 + ["nout:2"]
    out = run_federated(_cfg(noise="on", clients=8, rounds=1)).summary()
    assert (out["graph"], out["mask_graph"], out["theorem"][:10]) == (
        "complete",
        "nout:2",
        "Theorem 10",
    )


def test_round_graph_purposes_connectivity_and_components():
    from immersion_mpdp.agreement import components, edges_of, round_graph

    rng = np.random.default_rng(0)
    for _ in range(20):
        g = round_graph(list(range(12)), "complete", "nout:1", rng)
        masks = edges_of(g, "mask")
        assert len(components(masks, range(12))) == 1  # drawn again until connected
        assert all(len(edges_of(g, "delta")[k]) == 11 for k in g)
        assert all(("mask" in g[k][v]) == (v in masks[k]) for k in g for v in g[k])
        assert all(g[k][v] == g[v][k] for k in g for v in g[k])  # symmetric
    only_masks = round_graph([0, 1, 2], None, "complete", rng)
    assert only_masks[1] == {0: ("mask",), 2: ("mask",)}
    assert components({0: [1], 1: [0, 2], 2: [1]}, [0, 2]) == [[0], [2]]


def test_a_dropout_that_splits_the_mask_graph_aborts_the_round(monkeypatch):
    """Masks on a path 0-1-2-3: client 1 drops, so 0 would be alone among the survivors and the
    reveal would give the server its corrections; the round is aborted (no seed revealed) and
    retried among the survivors, and the model still equals plain FedSGD."""
    from immersion_mpdp import protocol

    def path(clients, noise_spec, mask_spec, rng):
        order = sorted(clients)
        out = {k: {} for k in order}
        for a, b in zip(order[:-1], order[1:], strict=True):
            out[a][b] = out[b][a] = ("mask",)
        return out

    monkeypatch.setattr(protocol, "round_graph", path)
    res = run_federated(_cfg(rounds=2), faults=FaultPlan({(1, 0): "raise"}))
    assert [(a["round"], a["attempt"]) for a in res.aborted] == [(0, 1)]
    assert "falls apart (0; 2, 3)" in res.aborted[0]["reason"]
    assert max(res.diff_vs_plain) < 1e-9


def test_one_key_pair_per_client_and_run_with_fresh_seeds_every_round():
    from immersion_mpdp import engine

    setup = engine.make_setup(_cfg(clients=2))
    a, b = setup.clients
    publics = [{0: a.advertise(t), 1: b.advertise(t)} for t in range(2)]
    assert publics[0] == publics[1]  # the same key pair
    seeds = a.reveal(1, [1], publics[1])[1]
    assert seeds == b.reveal(1, [0], publics[1])[0]
    a.advertise(1, attempt=1)
    assert a.reveal(1, [1], publics[1])[1] != seeds  # a retry gets fresh seeds
    a.forget(1)
    with pytest.raises(InvalidArgumentError, match="round_t"):
        a.reveal(1, [1], publics[1])
