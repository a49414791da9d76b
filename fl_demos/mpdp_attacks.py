"""Attacks on MP-DP (seed 004) on the data available here: gradient inversion and membership inference.

    .venv/bin/python fl_demos/mpdp_attacks.py [--json] [--quick] [--seed 0]

Seed 004's Tables 2-4 compare reconstruction (GIFD on CIFAR/BreakHis ResNets) and membership
inference (ASR) against FedAvg and MP-DP at a privacy budget of 3. The scheme is derived only for
bias-free ReLU MLPs with the MSE loss, so this demo uses the model the algebra covers: sklearn's
8x8 digits, an MLP 64-h-10 without biases, one-hot targets, float64 throughout.

Gradient inversion (Tables 2-3). A DLG-style attacker optimises dummy images (and, where the loss
needs them, dummy targets) with L-BFGS until their gradient matches what the *server* observes
from one client with a small batch (1, and 4 in the full run). PSNR (data range 1) and MSE to the
true images are reported, averaged over the attacked images (dummies are paired with the true
images by the best assignment). Settings:

* ``fedsgd``: the client's plain gradient. For a bias-free ReLU MLP and batch 1 every row of the
  first layer's gradient is proportional to the image, so this is nearly exact.
* ``mpdp_noise_off``: MP-DP with no DP noise. The server holds the keys ``R, r``, so Eq. 22 on this
  client's own upload gives back its exact true gradient: model perturbation hides nothing from
  the server, only the noise does.
* ``mpdp_eps1``, ``mpdp_eps3``: noise on, ``(sigma_eta, sigma_Delta)`` calibrated by Theorem 10 for
  ``K`` clients at per-round ``epsilon`` 1 and 3. What the server recovers for one client is
  ``R o (grad_hat + eta + sum Delta - r^T Psi + v Phi)``, the true gradient plus noise of the
  calibrated scale (its ``Delta`` only cancel in the sum over clients). This is the attack target
  of the paper's Table 2.
* ``mpdp_phi_clear``: the paper sends the corrections ``Psi`` and ``Phi`` in the clear
  (``mask_corrections=False``). ``Phi = d/dW^hat mean 1/2 alpha^2`` carries no noise, depends only
  on the inputs (no labels) and is a gradient of the perturbed model ``W^hat``, which the server
  built and knows. Matching it reconstructs the inputs about as well as the plain FedSGD gradient:
  the flaw of notes section 10.11(c).
* ``mpdp_phi_sum_K10``: with ``mask_corrections=True`` (this SDK's default) the server learns only
  the sum of ``Phi`` over the ``K`` clients of the round (pairwise masks, as secure aggregation).
  The attack then has to invert a noise-free batch gradient of ``K`` times the batch; the figure
  shows what is left of the leak with masking (dummies for every image in the sum).

Membership inference (Tables 3-4). An MLP is trained to overfit a member set (the union of the
clients' data); the attacker knows half of the members and as many non-members, picks the
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

QUICK = {"images": 2, "batches": (1,), "restarts": 1, "lbfgs_iter": 300, "mia_members": 200, "mia_steps": 1500,
         "mia_key_draws": 3}
FULL = {"images": 8, "batches": (1, 4), "restarts": 2, "lbfgs_iter": 500, "mia_members": 200, "mia_steps": 3000,
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
    layout = Layout(tuple([int(weights[0].shape[1])] + [int(w.shape[0]) for w in weights]))
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
    layout = Layout(tuple([int(weights[0].shape[1])] + [int(w.shape[0]) for w in weights]))
    cal = calibrate(epsilon, DELTA, k)
    noise = NoiseSettings(cal.sigma_eta, cal.sigma_delta, mask_corrections=True)
    model, _ = perturb(weights, rng)
    pair = {(a, b): {p: rng.bytes(32) for p in ("delta", "mask")} for a in range(k) for b in range(a + 1, k)}
    uploads = []
    for me, (x, t) in enumerate(zip(batches, targets)):
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
           max_iter: int) -> torch.Tensor:
    """DLG with L-BFGS: dummy images (and targets) whose gradient matches ``target`` in relative L2.

    Keeps the restart with the smallest matching loss (the attacker sees that loss, not the truth).
    """
    target = [g.detach() for g in target]
    scale = float(sum((g ** 2).sum() for g in target))
    best, best_loss = None, np.inf
    for _ in range(restarts):
        x = torch.as_tensor(rng.uniform(0.0, 1.0, size=(n_images, n_inputs))).requires_grad_(True)
        t = torch.as_tensor(rng.uniform(0.0, 1.0, size=(n_images, N_CLASSES))).requires_grad_(with_labels)
        params = [x, t] if with_labels else [x]
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, history_size=50, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-12, tolerance_change=1e-14)

        def matching_loss() -> torch.Tensor:
            return sum(((g - h) ** 2).sum() for g, h in zip(match(x, t), target)) / scale

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = matching_loss()
            loss.backward()
            return loss

        opt.step(closure)
        final = float(matching_loss().detach())
        if np.isfinite(final) and final < best_loss:
            best, best_loss = x.detach().clone(), final
    if best is None:
        best = torch.full((n_images, n_inputs), 0.5, dtype=torch.float64)
    return best


def gradient_inversion(cfg: dict[str, Any], data: Any, seed: int) -> dict[str, Any]:
    sizes = (64, cfg["hidden"], N_CLASSES)
    weights = init_weights(sizes, seed)
    x_all = torch.as_tensor(data.x_train.reshape(len(data.x_train), -1))
    y_all = torch.as_tensor(data.y_train, dtype=torch.long)
    k = cfg["clients"]
    rng = np.random.default_rng([seed, 7])
    invert_kw = {"restarts": cfg["restarts"], "max_iter": cfg["lbfgs_iter"]}
    out: dict[str, Any] = {}
    mean_image = x_all.mean(0, keepdim=True)
    for batch in cfg["batches"]:
        n_trials = max(1, cfg["images"] // batch)
        scores: dict[str, list[tuple[float, float]]] = {}
        labels_right: list[float] = []
        for trial in range(n_trials):
            idx = torch.as_tensor(rng.choice(len(x_all), size=batch * k, replace=False))
            xs, ts = x_all[idx].reshape(k, batch, -1), one_hot(y_all[idx], N_CLASSES).reshape(k, batch, -1)
            x, t = xs[0], ts[0]                           # the attacked client
            tick = time.perf_counter()

            def run(name: str, match: Callable, target: list[torch.Tensor], truth: torch.Tensor, *,
                    labels: bool, n: int) -> torch.Tensor:
                recon = invert(match, target, n, truth.shape[1], with_labels=labels, rng=rng, **invert_kw)
                scores.setdefault(name, []).append(psnr_mse(recon, truth))
                return recon

            plain = mse_gradient(weights, x, t)
            run("fedsgd", lambda a, b: plain_gradient_of(weights, a, b), plain, x, labels=True, n=batch)
            for eps, name in ((None, "mpdp_noise_off"), (1.0, "mpdp_eps1"), (3.0, "mpdp_eps3")):
                recovered, seen, model = server_view_one_client(weights, x, t, epsilon=eps, n_clients=k, rng=rng)
                if eps is None:
                    err = max(float((a - b).abs().max()) for a, b in zip(recovered, plain))
                    out.setdefault("checks", {})["max_abs_recover_minus_plain_noise_off"] = max(
                        err, out.get("checks", {}).get("max_abs_recover_minus_plain_noise_off", 0.0))
                run(name, lambda a, b: plain_gradient_of(weights, a, b), recovered, x, labels=True, n=batch)
                if eps == 1.0:
                    noise = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(recovered, plain)))
                    signal = torch.sqrt(sum((b ** 2).sum() for b in plain))
                    scores.setdefault("_noise_to_signal_eps1", []).append((float(noise / signal), 0.0))
                    phi_seen = list(seen.phi)
                    err = max(float((a - b).abs().max()) for a, b in zip(phi_of(model, x), phi_seen))
                    out.setdefault("checks", {})["max_abs_phi_autograd_minus_lmt"] = max(
                        err, out.get("checks", {}).get("max_abs_phi_autograd_minus_lmt", 0.0))
                    run("mpdp_phi_clear", lambda a, b, m=model: phi_of(m, a), phi_seen, x, labels=False, n=batch)
            phi_mean, model = server_phi_sum(weights, list(xs), list(ts), epsilon=1.0, rng=rng)
            run(f"mpdp_phi_sum_K{k}", lambda a, b, m=model: phi_of(m, a), phi_mean, xs.reshape(k * batch, -1),
                labels=False, n=k * batch)
            scores.setdefault("baseline_mean_image", []).append(psnr_mse(mean_image.expand(batch, -1), x))
            log(f"inversion batch {batch} trial {trial + 1}/{n_trials}: "
                + ", ".join(f"{n} {v[-1][0]:.1f} dB" for n, v in scores.items() if not n.startswith("_"))
                + f" ({time.perf_counter() - tick:.1f} s)")
        del labels_right
        block = {}
        for name, values in scores.items():
            arr = np.array(values)
            if name == "_noise_to_signal_eps1":
                block["noise_to_signal_eps1"] = float(arr[:, 0].mean())
                continue
            block[name] = {"psnr": float(arr[:, 0].mean()), "mse": float(arr[:, 1].mean()),
                           "psnr_per_trial": [round(float(v), 2) for v in arr[:, 0]]}
        out[f"batch_{batch}"] = block
    return out


# ----------------------------------------------------------------------------------------------
# membership inference


def train_overfit(x: torch.Tensor, t: torch.Tensor, sizes: tuple[int, ...], steps: int, seed: int) -> list[Any]:
    """Full-batch Adam on the MSE loss until the member set is fitted (what the clients jointly train)."""
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
    """Both attacks; returns the JSON-ready results."""
    torch.set_default_dtype(torch.float64)
    cfg = dict(QUICK if quick else FULL, hidden=hidden, clients=clients)
    data = load_dataset("digits", seed=seed)
    start = time.perf_counter()
    inversion = gradient_inversion(cfg, data, seed)
    first = inversion[f"batch_{cfg['batches'][0]}"]
    flat = {name: {"psnr": v["psnr"], "mse": v["mse"]} for name, v in first.items() if isinstance(v, dict)}
    flat.update({k: v for k, v in inversion.items() if k.startswith("batch_") or k == "checks"})
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
        print("gradient inversion (PSNR dB, higher = better attack; MSE):")
        for name, v in inv.items():
            if isinstance(v, dict) and "psnr" in v:
                print(f"  {name:22s} PSNR {v['psnr']:6.2f}  MSE {v['mse']:.4f}")
        print("membership inference (attack success rate, 0.5 = guessing):")
        for name in ("plain", "perturbed", "perturbed_corrected"):
            print(f"  {name:22s} ASR {mia[name]['asr']:.3f}")
    return result


if __name__ == "__main__":
    main()
