"""Attacks on MP-DP (seed 004) on the data available here: gradient inversion and membership inference.

    .venv/bin/python fl_demos/mpdp_attacks.py [--json] [--quick] [--seed 0] [--hidden 64] [--clients 10]

Seed 004's Tables 2-4 compare reconstruction (GIFD on CIFAR/BreakHis ResNets) and membership
inference (ASR) against FedAvg and MP-DP at a privacy budget of 3. The scheme is derived only for
bias-free ReLU MLPs with the MSE loss, so this demo uses the model the algebra covers: sklearn's
8x8 digits, an MLP 64-h-10 without biases, one-hot targets, float64 throughout.

Gradient inversion (Tables 2-3). A DLG-style attacker optimises dummy images (and, where the loss
needs them, dummy one-hot targets, as iDLG) with L-BFGS until their gradient matches what the
*server* observes from one client with a small batch (1, and 4 in the full run); see
:func:`invert`. PSNR (data range 1, capped at 100 dB for exact reconstructions) and MSE to the true
images are averaged over the attacked images, dummies paired with true images by the best
assignment. ``baseline_mean_image`` is the score of guessing the average training digit: a
reconstruction below it carries no information. Settings:

* ``fedsgd``: the client's plain gradient (no protection). For a bias-free ReLU MLP and batch 1
  every row of the first layer's gradient is proportional to the image, so it falls exactly.
* ``mpdp_noise_off``: MP-DP without DP noise. The server holds the keys ``R, r``, so Eq. 22 on this
  client's own upload gives back its exact true gradient (``checks`` reports the difference): model
  perturbation hides nothing from the server, only the noise does.
* ``mpdp_eps1``, ``mpdp_eps3``: noise on, ``(sigma_eta, sigma_Delta)`` calibrated by Theorem 10 for
  ``K`` clients at per-round ``epsilon`` 1 and 3. What the server recovers for one client is
  ``R o (grad_hat + eta + sum Delta - r^T Psi + v Phi)``: the true gradient plus noise of the
  calibrated scale, tens of times its norm (``noise_to_signal``); the ``Delta`` only cancel in the
  sum over clients. This is the attack target of the paper's Table 2, and the attack fails.
* ``mpdp_phi_clear``: the paper sends the corrections ``Psi`` and ``Phi`` in the clear
  (``mask_corrections=False``), here taken from the same noisy upload. ``Phi = d/dW^hat mean 1/2
  alpha^2`` carries no noise, depends on the inputs only (no labels) and is a gradient of the
  perturbed model ``W^hat``, which the server built. Its structure,
  ``Phi^(1) = 1/N sum_i alpha_i (d o m_i) x_i^T`` with 0/1 activation patterns ``m_i``, admits an
  exact algebraic inversion (:func:`invert_phi_algebraic`) whenever ``N`` is small: the inputs
  come back to rounding error, whatever the DP noise on the gradient. Notes section 10.11(c).
* ``mpdp_phi_sum_K10``: with ``mask_corrections=True`` (this SDK's default) the server learns only
  the sum of ``Phi`` over the ``K`` clients of the round (pairwise masks, as in secure aggregation),
  still noise-free. The same inversion applies to the sum with ``N = K x batch``: for ``K = 10``
  clients with one image each it recovers all 10 images exactly (not which client sent which).
  Masking removes the per-client channel, not the leak of the aggregate; the exhaustive step costs
  ``2^N``, so at ``N = 40`` (batch 4) it is not run and DLG alone fails here, which is no evidence
  that a better attack would fail too. The PSNR is over every image in the sum.

The attacked model is the initial one (``init_weights(sizes, seed)``). In the JSON, the entries
directly under ``gradient_inversion`` are batch 1's; ``batch_N`` holds each batch size's details
(per-trial PSNR, the method that inverted ``Phi``, the noise-to-gradient norm ratio).

Membership inference (Tables 3-4). An MLP is trained without noise (full-batch Adam, 400 steps)
on 200 members, the union of the clients' data, until it fits them; the perturbed models are
perturbations of these same weights, so only the effect of the perturbation is measured (not
that of DP noise during training). The attacker knows half of the members and as many non-members, picks the
loss threshold that best separates them (Yeom et al.), and is scored on the other half against
as many unseen non-members: the attack success rate is the balanced accuracy (50% = guessing).

* ``plain``: the trained model itself, what FedAvg/FedSGD clients hold.
* ``perturbed``: the perturbed model ``W^hat`` MP-DP clients hold, its outputs
  ``y_hat = y + alpha r`` used as if they were the model's (the paper's attack; averaged over
  several key draws). The large ``alpha r`` term hides the loss gap.
* ``perturbed_corrected``: notes section 10.11(d). The client also knows ``alpha`` for any input,
  so with its labelled calibration data it fits ``r`` by least squares,
  ``r_est = sum_i alpha_i (y_hat_i - t_i) / sum_i alpha_i^2`` (the trained model is close to its
  targets), and attacks ``y_hat - alpha r_est``: a model functionally close to the true one.
  Theorem 7 rules out recovering the exact weights, not this.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from immersion_fl.data import load_dataset
from immersion_mpdp.calibration import calibrate
from immersion_mpdp.ddp import Layout, NoiseSettings, ddp_client, mean_local_result, sum_uploads
from immersion_mpdp.lmt import local_model_training
from immersion_mpdp.mlp import accuracy, forward, init_weights, mse_gradient, one_hot
from immersion_mpdp.perturbation import PerturbedModel, perturb, recover
from scipy.optimize import linear_sum_assignment

N_CLASSES = 10
DELTA = 1e-5
MSE_FLOOR = 1e-10          # PSNR is capped at 100 dB (exact reconstructions)

QUICK = {"images": 2, "batches": (1,), "restarts": 1, "lbfgs_iter": 200, "mia_members": 200, "mia_steps": 400,
         "mia_key_draws": 3}
FULL = {"images": 8, "batches": (1, 4), "restarts": 6, "lbfgs_iter": 500, "mia_members": 200, "mia_steps": 400,
        "mia_key_draws": 10}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# metrics


def psnr_mse(recon: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """Mean PSNR (dB, range 1, capped at 100) and mean MSE over images, dummies paired with the
    true images by the assignment of least total MSE."""
    recon = recon.clamp(0.0, 1.0)
    cost = ((recon[:, None, :] - truth[None, :, :]) ** 2).mean(-1).numpy()
    rows, cols = linear_sum_assignment(cost)
    mse = cost[rows, cols]
    psnr = 10.0 * np.log10(1.0 / np.maximum(mse, MSE_FLOOR))
    return float(psnr.mean()), float(mse.mean())


# ----------------------------------------------------------------------------------------------
# what the server observes


def random_seeds(me: int, n_clients: int, rng: np.random.Generator) -> dict[int, dict[str, bytes]]:
    """Pair seeds with every other client (complete graph). The server never learns them."""
    return {v: {p: rng.bytes(32) for p in ("delta", "mask")} for v in range(n_clients) if v != me}


def server_view_one_client(weights: list[torch.Tensor], x: torch.Tensor, t: torch.Tensor, *, epsilon: float | None,
                           n_clients: int, rng: np.random.Generator) -> tuple[list[torch.Tensor], Any, PerturbedModel]:
    """One client's round with the corrections in the clear, as the server sees it.

    Returns the server's Eq. 22 recovery from this client's upload alone (its noisy true-space
    gradient), the corrections it received (``LocalResult``) and the perturbed model it sent.
    """
    layout = Layout.of(weights)
    if epsilon is None:
        noise = NoiseSettings(0.0, 0.0, mask_corrections=False)
    else:
        cal = calibrate(epsilon, DELTA, n_clients)
        noise = NoiseSettings(cal.sigma_eta, cal.sigma_delta, mask_corrections=False)
    model, keys = perturb(weights, rng)
    local = local_model_training(model, x, t)
    upload = ddp_client(local, layout, me=0, seeds=random_seeds(0, n_clients, rng), n_clients=n_clients,
                        noise=noise, rng=rng)
    seen = layout.unflatten(upload.gradient, upload.corrections)
    return recover(keys, seen.grad_hat, seen.psi, seen.psi_last, seen.phi), seen, model


def server_phi_sum(weights: list[torch.Tensor], batches: Sequence[torch.Tensor], targets: Sequence[torch.Tensor], *,
                   epsilon: float, rng: np.random.Generator) -> tuple[list[torch.Tensor], PerturbedModel]:
    """A round of ``K = len(batches)`` clients with masked corrections: the server unmasks only the
    sum; returns the mean ``Phi`` over clients (Eq. 21) and the perturbed model."""
    k = len(batches)
    layout = Layout.of(weights)
    cal = calibrate(epsilon, DELTA, k)
    noise = NoiseSettings(cal.sigma_eta, cal.sigma_delta, mask_corrections=True)
    model, _ = perturb(weights, rng)
    pair = {(a, b): {p: rng.bytes(32) for p in ("delta", "mask")} for a in range(k) for b in range(a + 1, k)}
    uploads = []
    for me, (x, t) in enumerate(zip(batches, targets, strict=True)):
        seeds = {v: pair[(min(me, v), max(me, v))] for v in range(k) if v != me}
        uploads.append(ddp_client(local_model_training(model, x, t), layout, me=me, seeds=seeds, n_clients=k,
                                  noise=noise, rng=rng))
    mean = mean_local_result(sum_uploads(uploads, masked=True), k, layout, masked=True)
    return list(mean.phi), model


def phi_of(model: PerturbedModel, x: torch.Tensor) -> list[torch.Tensor]:
    """``Phi = d/dW^hat mean 1/2 alpha^2`` for the odd layers but the last, differentiable in ``x``."""
    params = [w.detach().requires_grad_(True) for w in model.odd]
    _, alpha = PerturbedModel(tuple(params), model.transitional).forward(x)
    return list(torch.autograd.grad(0.5 * (alpha ** 2).mean(), params[:-1], create_graph=True))


def plain_gradient_of(weights: list[torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> list[torch.Tensor]:
    """The MSE gradient, differentiable in ``x`` and ``t``."""
    params = [w.detach().requires_grad_(True) for w in weights]
    loss = 0.5 * ((forward(params, x) - t) ** 2).sum(1).mean()
    return list(torch.autograd.grad(loss, params, create_graph=True))


# ----------------------------------------------------------------------------------------------
# gradient inversion


def invert(match: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]], target: list[torch.Tensor],
           n_images: int, n_inputs: int, *, with_labels: bool, rng: np.random.Generator, restarts: int,
           max_iter: int) -> tuple[torch.Tensor, float]:
    """DLG with L-BFGS: dummy images (and targets) whose gradient matches ``target`` in relative L2.

    * The first layer's gradient (or ``Phi``) of a bias-free MLP is ``sum_i u_i x_i^T``: its row
      space holds the images. The dummies are searched in its top ``n_images`` right singular
      vectors first, then polished in pixel space.
    * With labels, a first pass optimises free targets too. Free targets leave the scale of each
      image undetermined (``x -> s x`` with ``y - t -> (y - t) / s`` gives the same gradient), so,
      as with iDLG, the targets are then fixed to the one-hot vectors of their argmax, the images
      rescaled by the best factor on a grid and optimised again.
    * One image: an analytic start as well (the top singular vector is the image's direction; the
      label and the scale are searched on a grid).

    The restart with the smallest matching loss is kept (the attacker sees that loss, not the
    truth). Returns the images and that loss.
    """
    target = [g.detach() for g in target]
    scale = float(sum((g ** 2).sum() for g in target))
    basis = torch.linalg.svd(target[0], full_matrices=False)[2][:n_images]          # (n_images, n_inputs)
    subspace = basis.shape[0] == n_images

    def matching_loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return sum(((g - h) ** 2).sum() for g, h in zip(match(x, t), target, strict=True)) / scale

    def lbfgs(params: list[torch.Tensor], loss_fn: Callable[[], torch.Tensor]) -> float:
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, history_size=50, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-12, tolerance_change=1e-14)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            return loss

        opt.step(closure)
        value = float(loss_fn().detach())
        return value if np.isfinite(value) else np.inf

    def pixels(c: torch.Tensor) -> torch.Tensor:
        return c @ basis if subspace else c

    candidates: list[tuple[float, torch.Tensor, torch.Tensor]] = []
    for _ in range(restarts):
        start = torch.as_tensor(rng.uniform(0.0, 1.0, size=(n_images, n_inputs)))
        c = (start @ basis.T if subspace else start).requires_grad_(True)
        t = torch.as_tensor(rng.uniform(0.0, 1.0, size=(n_images, N_CLASSES))).requires_grad_(with_labels)
        if with_labels:
            lbfgs([c, t], lambda c=c, t=t: matching_loss(pixels(c), t))
            t = one_hot(t.detach().argmax(1), N_CLASSES)
            factors = np.geomspace(0.2, 5.0, 41)
            values = [float(matching_loss(pixels(c.detach() * f), t).detach()) for f in factors]
            c = (c.detach() * factors[int(np.nanargmin(values))]).requires_grad_(True)
        value = lbfgs([c], lambda c=c, t=t: matching_loss(pixels(c), t))
        candidates.append((value, pixels(c.detach()), t))
    if with_labels and n_images == 1:
        direction = basis[0] * torch.sign(basis[0].sum())
        factors = np.geomspace(0.05, 50.0, 121) / float(direction.abs().max())
        options = [(float(matching_loss(direction[None] * f, one_hot(torch.tensor([c]), N_CLASSES)).detach()), f, c)
                   for c in range(N_CLASSES) for f in factors]
        value, factor, label = min(options)
        candidates.append((value, direction[None] * factor, one_hot(torch.tensor([label]), N_CLASSES)))
    _, x0, t = min(candidates, key=lambda item: item[0])
    x = x0.clone().requires_grad_(True)
    lbfgs([x], lambda: matching_loss(x, t))                  # polish in pixel space
    return x.detach(), float(matching_loss(x, t).detach())


def invert_phi_algebraic(model: PerturbedModel, phi_first: torch.Tensor, *, max_rank: int = 16,
                         max_subsets: int = 5000) -> torch.Tensor | None:
    """Exact inversion of a (summed) ``Phi`` of the first layer, when few samples are in it.

    ``Phi^(1) = 1/N sum_i alpha_i (d o m_i) x_i^T`` with ``d`` the public transitional diagonal and
    ``m_i = 1[W^hat^(1) x_i > 0]`` the sample's activation pattern, so ``P = Phi / d`` (row-wise)
    is ``M^T Y`` with a 0/1 matrix ``M`` (N x h) and ``y_i = alpha_i x_i / N``. Its rank is ``N``.
    Each pattern ``m_i`` is a 0/1 vector in the column space of ``P``: with ``C = U S`` from the
    SVD and ``R`` any ``N`` independent rows of ``C``, ``m_i = C R^-1 b`` for ``b = m_i`` on those
    rows, so trying the ``2^N`` vectors ``b`` finds every pattern (and a few spurious 0/1
    combinations, removed by checking ``1[W^hat^(1) y_i > 0] = m_i``). Then ``Y`` follows by least
    squares and ``x_i = y_i / sqrt(alpha(y_i) / N)`` (``alpha`` is positively homogeneous).
    Returns ``None`` where ``N > max_rank`` or no consistent set of patterns is found.
    """
    from itertools import combinations, product

    from scipy.linalg import qr

    if model.n_layers != 2:                   # alpha below is that of one hidden layer
        return None
    w1, d = model.odd[0].numpy(), model.transitional[0].numpy()
    p = phi_first.detach().numpy() / d[:, None]
    u, s, _ = np.linalg.svd(p, full_matrices=False)
    n = int((s > s[0] * 1e-9).sum()) if s[0] > 0 else 0
    if not 0 < n <= max_rank:
        return None
    c = u[:, :n] * s[:n]
    rows = qr(c.T, pivoting=True)[2][:n]
    b = np.array(list(product((0.0, 1.0), repeat=n)))[1:]
    v = c @ np.linalg.solve(c[rows], b.T)
    binary = (np.abs(v - np.round(v)) < 1e-6).all(0) & ((np.round(v) == 0) | (np.round(v) == 1)).all(0)
    candidates = np.round(v[:, binary]).T
    for count, chosen in enumerate(combinations(range(len(candidates)), n)):
        if count >= max_subsets:
            break
        m = candidates[list(chosen)]
        if np.linalg.matrix_rank(m) < n:
            continue
        y = np.linalg.lstsq(m.T, p, rcond=None)[0]
        pre = y @ w1.T
        alpha = (np.maximum(pre, 0.0) * d).sum(1)
        if (alpha > 0).all() and ((pre > 0) == (m > 0)).all():
            return torch.as_tensor(y / np.sqrt(alpha / n)[:, None])
    return None


def attack_phi(model: PerturbedModel, phi: list[torch.Tensor], n_images: int, n_inputs: int, *,
               rng: np.random.Generator, restarts: int, max_iter: int) -> tuple[torch.Tensor, str]:
    """The algebraic inversion where it applies, else DLG on ``Phi``; returns the images and the method."""
    recon = invert_phi_algebraic(model, phi[0])
    if recon is not None:
        scale = float(sum((g ** 2).sum() for g in phi))
        with torch.enable_grad():
            loss = float(sum(((g - h) ** 2).sum() for g, h in zip(phi_of(model, recon), phi, strict=True)).detach()) / scale
        if loss < 1e-12:
            return recon, "algebraic"
    recon, _ = invert(lambda a, b: phi_of(model, a), phi, n_images, n_inputs, with_labels=False, rng=rng,
                      restarts=restarts, max_iter=max_iter)
    return recon, "dlg"


def gradient_inversion(cfg: dict[str, Any], data: Any, seed: int) -> dict[str, Any]:
    """Every setting on the same images; one block of results per batch size."""
    sizes = (64, cfg["hidden"], N_CLASSES)
    weights = init_weights(sizes, seed)
    x_all = torch.as_tensor(data.x_train.reshape(len(data.x_train), -1))
    y_all = torch.as_tensor(data.y_train, dtype=torch.long)
    n_inputs, k = x_all.shape[1], cfg["clients"]
    rng = np.random.default_rng([seed, 7])
    kw = {"rng": rng, "restarts": cfg["restarts"], "max_iter": cfg["lbfgs_iter"]}
    mean_image = x_all.mean(0, keepdim=True)
    checks = {"max_abs_recover_minus_plain_noise_off": 0.0, "max_abs_phi_autograd_minus_upload": 0.0}
    out: dict[str, Any] = {}

    def plain_match(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
        return plain_gradient_of(weights, a, b)

    for batch in cfg["batches"]:
        n_trials = max(1, cfg["images"] // batch)
        scores: dict[str, list[tuple[float, float]]] = {}
        methods: dict[str, list[str]] = {}
        noise_ratio: dict[str, list[float]] = {}
        for trial in range(n_trials):
            tick = time.perf_counter()
            idx = torch.as_tensor(rng.choice(len(x_all), size=batch * k, replace=False))
            xs = x_all[idx].reshape(k, batch, n_inputs)
            ts = one_hot(y_all[idx], N_CLASSES).reshape(k, batch, N_CLASSES)
            x, t = xs[0], ts[0]                                   # the attacked client's batch
            plain = mse_gradient(weights, x, t)
            recon, _ = invert(plain_match, plain, batch, n_inputs, with_labels=True, **kw)
            scores.setdefault("fedsgd", []).append(psnr_mse(recon, x))
            for eps, name in ((None, "mpdp_noise_off"), (1.0, "mpdp_eps1"), (3.0, "mpdp_eps3")):
                recovered, seen, model = server_view_one_client(weights, x, t, epsilon=eps, n_clients=k, rng=rng)
                diff = max(float((a - b).abs().max()) for a, b in zip(recovered, plain, strict=True))
                if eps is None:
                    checks["max_abs_recover_minus_plain_noise_off"] = max(checks["max_abs_recover_minus_plain_noise_off"],
                                                                          diff)
                else:
                    noise = float(torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(recovered, plain, strict=True))))
                    signal = float(torch.sqrt(sum((b ** 2).sum() for b in plain)))
                    noise_ratio.setdefault(name, []).append(noise / signal)
                recon, _ = invert(plain_match, recovered, batch, n_inputs, with_labels=True, **kw)
                scores.setdefault(name, []).append(psnr_mse(recon, x))
                if eps == 1.0:                                    # Phi in the clear in the same (noisy) upload
                    phi_seen = list(seen.phi)
                    diff = max(float((a.detach() - b).abs().max()) for a, b in zip(phi_of(model, x), phi_seen, strict=True))
                    checks["max_abs_phi_autograd_minus_upload"] = max(checks["max_abs_phi_autograd_minus_upload"], diff)
                    recon, method = attack_phi(model, phi_seen, batch, n_inputs, **kw)
                    scores.setdefault("mpdp_phi_clear", []).append(psnr_mse(recon, x))
                    methods.setdefault("mpdp_phi_clear", []).append(method)
            phi_mean, model = server_phi_sum(weights, list(xs), list(ts), epsilon=1.0, rng=rng)
            recon, method = attack_phi(model, phi_mean, k * batch, n_inputs, **kw)
            scores.setdefault(f"mpdp_phi_sum_K{k}", []).append(psnr_mse(recon, xs.reshape(k * batch, n_inputs)))
            methods.setdefault(f"mpdp_phi_sum_K{k}", []).append(method)
            scores.setdefault("baseline_mean_image", []).append(psnr_mse(mean_image.expand(batch, -1), x))
            log(f"inversion, batch {batch}, trial {trial + 1}/{n_trials}: "
                + ", ".join(f"{name} {v[-1][0]:.1f} dB" for name, v in scores.items())
                + f" ({time.perf_counter() - tick:.1f} s)")
        block: dict[str, Any] = {}
        order = ["fedsgd", "mpdp_noise_off", "mpdp_eps1", "mpdp_eps3", "mpdp_phi_clear"]
        for name in sorted(scores, key=lambda n: order.index(n) if n in order else len(order)):
            arr = np.array(scores[name])
            block[name] = {"psnr": float(arr[:, 0].mean()), "mse": float(arr[:, 1].mean()),
                           "psnr_per_trial": [round(float(v), 2) for v in arr[:, 0]]}
            if name in methods:
                block[name]["method"] = methods[name]
            if name in noise_ratio:
                block[name]["noise_to_signal"] = float(np.mean(noise_ratio[name]))
        block["trials"] = n_trials
        out[f"batch_{batch}"] = block
    out["checks"] = checks
    return out


# ----------------------------------------------------------------------------------------------
# membership inference


def train_overfit(x: torch.Tensor, t: torch.Tensor, sizes: tuple[int, ...], steps: int, seed: int) -> list[Any]:
    """Full-batch Adam on the MSE loss of the member set (what the clients jointly train), no noise."""
    params = [w.clone().requires_grad_(True) for w in init_weights(sizes, seed)]
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(steps):
        opt.zero_grad()
        loss = 0.5 * ((forward(params, x) - t) ** 2).sum(1).mean()
        loss.backward()
        opt.step()
    return [p.detach() for p in params]


def threshold_attack(cal_scores: np.ndarray, cal_member: np.ndarray, eval_scores: np.ndarray,
                     eval_member: np.ndarray) -> float:
    """Yeom-style: member iff loss < threshold, the threshold maximising balanced accuracy on the
    attacker's calibration split; returns the balanced accuracy on the evaluation split."""
    def balanced(scores: np.ndarray, member: np.ndarray, thr: float) -> float:
        guess = scores < thr
        return 0.5 * (guess[member].mean() + (~guess[~member]).mean())

    candidates = np.unique(cal_scores)
    mids = np.concatenate([[candidates[0] - 1.0], (candidates[1:] + candidates[:-1]) / 2, [candidates[-1] + 1.0]])
    thr = max(mids, key=lambda c: balanced(cal_scores, cal_member, c))
    return float(balanced(eval_scores, eval_member, thr))


def membership_inference(cfg: dict[str, Any], data: Any, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng([seed, 11])
    x_tr = torch.as_tensor(data.x_train.reshape(len(data.x_train), -1))
    x_te = torch.as_tensor(data.x_test.reshape(len(data.x_test), -1))
    n = cfg["mia_members"]
    members = rng.choice(len(x_tr), size=n, replace=False)
    outside = np.setdiff1d(np.arange(len(x_tr)), members)
    pool_x = torch.cat([x_tr[outside], x_te])
    pool_y = np.concatenate([data.y_train[outside], data.y_test])
    non = rng.choice(len(pool_x), size=n, replace=False)
    xm, ym = x_tr[members], torch.as_tensor(data.y_train[members], dtype=torch.long)
    xn, yn = pool_x[non], torch.as_tensor(pool_y[non], dtype=torch.long)
    sizes = (64, cfg["hidden"], N_CLASSES)
    tick = time.perf_counter()
    weights = train_overfit(xm, one_hot(ym, N_CLASSES), sizes, cfg["mia_steps"], seed)
    x = torch.cat([xm, xn])
    t = one_hot(torch.cat([ym, yn]), N_CLASSES)
    member = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    half = np.concatenate([rng.permutation(n) < n // 2, rng.permutation(n) < n // 2])   # attacker's half
    log(f"membership: trained {sizes} on {n} members in {time.perf_counter() - tick:.1f} s, "
        f"train accuracy {accuracy(weights, xm, ym):.3f}, non-member accuracy {accuracy(weights, xn, yn):.3f}")

    def asr(outputs: torch.Tensor) -> float:
        loss = (0.5 * ((outputs - t) ** 2).sum(1)).numpy()
        return threshold_attack(loss[half], member[half], loss[~half], member[~half])

    with torch.no_grad():
        plain = asr(forward(weights, x))
        perturbed, corrected, r_err = [], [], []
        for _ in range(cfg["mia_key_draws"]):
            model, keys = perturb(weights, rng)
            y_hat, alpha = model.forward(x)
            perturbed.append(asr(y_hat))
            a, e = alpha[half], (y_hat - t)[half]                 # the attacker's labelled data only
            r_est = (a[:, None] * e).sum(0) / (a ** 2).sum()
            r_err.append(float((r_est - keys.r_out).norm() / keys.r_out.norm()))
            corrected.append(asr(y_hat - alpha[:, None] * r_est))
    return {
        "plain": {"asr": plain, "member_accuracy": accuracy(weights, xm, ym),
                  "non_member_accuracy": accuracy(weights, xn, yn)},
        "perturbed": {"asr": float(np.mean(perturbed)), "asr_per_key_draw": [round(v, 4) for v in perturbed]},
        "perturbed_corrected": {"asr": float(np.mean(corrected)), "relative_error_r_est": float(np.mean(r_err)),
                                "asr_per_key_draw": [round(v, 4) for v in corrected]},
        "n_members": n, "n_non_members": n, "attacker_known_fraction": 0.5,
    }


# ----------------------------------------------------------------------------------------------


def run_demo(*, quick: bool = False, seed: int = 0, hidden: int = 64, clients: int = 10) -> dict[str, Any]:
    """Both attacks; returns the JSON-ready results (torch runs single-threaded meanwhile: the
    tensors are tiny, and threads only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_demo(quick=quick, seed=seed, hidden=hidden, clients=clients)
    finally:
        torch.set_num_threads(threads)


def _run_demo(*, quick: bool, seed: int, hidden: int, clients: int) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL, hidden=hidden, clients=clients)
    data = load_dataset("digits", seed=seed)
    start = time.perf_counter()
    inversion = gradient_inversion(cfg, data, seed)
    first = inversion[f"batch_{cfg['batches'][0]}"]
    flat = {name: {"psnr": v["psnr"], "mse": v["mse"]} for name, v in first.items() if isinstance(v, dict)}
    flat.update(inversion)
    t_inv = time.perf_counter() - start
    mia = membership_inference(cfg, data, seed)
    settings = {"seed": seed, "quick": quick, "dataset": "digits 8x8", "model": f"bias-free ReLU MLP 64-{hidden}-10, "
                "MSE loss, float64", "attacked_model": "initial weights (init_weights(sizes, seed))",
                "clients": clients, "delta": DELTA, "graph": "complete", "batches": list(cfg["batches"]),
                "images_per_setting": cfg["images"], "lbfgs_max_iter": cfg["lbfgs_iter"], "restarts": cfg["restarts"],
                "sigma": {f"eps{e:g}": {"sigma_eta": c.sigma_eta, "sigma_delta": c.sigma_delta}
                          for e in (1.0, 3.0) for c in [calibrate(e, DELTA, clients)]},
                "mia_members": cfg["mia_members"], "mia_steps": cfg["mia_steps"], "mia_key_draws": cfg["mia_key_draws"],
                "seconds": {"gradient_inversion": round(t_inv, 1),
                            "membership_inference": round(time.perf_counter() - start - t_inv, 1)}}
    return {"gradient_inversion": flat, "membership_inference": mia, "settings": settings}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--quick", action="store_true", help="fewer images and steps (for tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args(argv)
    result = run_demo(quick=args.quick, seed=args.seed, hidden=args.hidden, clients=args.clients)
    if args.json:
        print(json.dumps(result))
    else:
        inv, mia = result["gradient_inversion"], result["membership_inference"]
        for batch in result["settings"]["batches"]:
            print(f"gradient inversion, batch {batch} (PSNR dB, higher = better attack; MSE):")
            for name, v in inv[f"batch_{batch}"].items():
                if isinstance(v, dict):
                    print(f"  {name:22s} PSNR {v['psnr']:6.2f}  MSE {v['mse']:.4f}")
        print("membership inference (attack success rate, 0.5 = guessing):")
        for name in ("plain", "perturbed", "perturbed_corrected"):
            print(f"  {name:22s} ASR {mia[name]['asr']:.3f}")
    return result


if __name__ == "__main__":
    main()
