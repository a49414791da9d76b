"""Attacks on MP-DP (seed 004) on the data available here: gradient inversion, membership inference.

    .venv/bin/python fl_demos/mpdp_attacks.py [--json] [--quick] [--seed 0] [--hidden 64] \\
        [--clients 10]

Seed 004's Tables 2-4 compare reconstruction and membership inference against FedAvg and MP-DP.
The scheme is derived only for bias-free ReLU MLPs with the MSE loss, so this demo uses the model
the algebra covers: sklearn's 8x8 digits, an MLP 64-h-10 without biases, one-hot targets, float64.

Notes
-----
Gradient inversion (DLG/iDLG, and an exact algebraic inversion of the noise-free correction
``Phi``) attacks what the server sees from one client: the plain FedSGD gradient, the MP-DP upload
with noise off and at epsilon 1 and 3, ``Phi`` in the clear (the paper) and its masked sum over
the round's clients (this SDK's default). Membership inference (a loss threshold) attacks the
plain model, the perturbed ``W^hat`` clients hold, and ``W^hat`` corrected by the client's
least-squares estimate of the output key ``r``. Every setting and JSON field is described in
``docs/notes/mpdp_attacks.md``; the building blocks live in ``immersion_mpdp.attacks``, which also
registers the audit attacks ``gradient-inversion`` and ``mpdp-output-mask``.

References
----------
Seed 004 (MP-DP), Tables 2-4, Theorems 7 and 10; notes section 10.11.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

import numpy as np
import torch
from immersion_fl.runtime.data import load_dataset
from immersion_mpdp.attacks import (
    DELTA,
    N_CLASSES,
    attack_phi,
    estimate_r,
    inversion_setup,
    invert,
    invert_phi_algebraic,  # noqa: F401  (re-exported: tests/test_mpdp_attacks.py)
    phi_of,
    plain_gradient_of,
    psnr_mse,
    server_phi_sum,
    server_view_one_client,
    train_overfit,
)
from immersion_mpdp.calibration import calibrate
from immersion_mpdp.mlp import accuracy, forward, mse_gradient, one_hot
from immersion_mpdp.perturbation import perturb

QUICK: dict[str, Any] = {
    "images": 2,
    "batches": (1,),
    "restarts": 1,
    "lbfgs_iter": 200,
    "mia_members": 200,
    "mia_steps": 400,
    "mia_key_draws": 3,
}
FULL: dict[str, Any] = {
    "images": 8,
    "batches": (1, 4),
    "restarts": 6,
    "lbfgs_iter": 500,
    "mia_members": 200,
    "mia_steps": 400,
    "mia_key_draws": 10,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# gradient inversion (the attacks themselves live in immersion_mpdp.attacks, shared with
# ``immersion audit``)


def gradient_inversion(cfg: dict[str, Any], data: Any, seed: int) -> dict[str, Any]:
    """Every setting on the same images; one block of results per batch size."""
    sizes, weights, x_all, y_all, kw, mean_image = inversion_setup(cfg, data, seed)
    n_inputs, k, rng = x_all.shape[1], cfg["clients"], kw["rng"]
    checks = {
        "max_abs_recover_minus_plain_noise_off": 0.0,
        "max_abs_phi_autograd_minus_upload": 0.0,
    }
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
            x, t = xs[0], ts[0]  # the attacked client's batch
            plain = mse_gradient(weights, x, t)
            recon, _ = invert(plain_match, plain, batch, n_inputs, with_labels=True, **kw)
            scores.setdefault("fedsgd", []).append(psnr_mse(recon, x))
            for eps, name in ((None, "mpdp_noise_off"), (1.0, "mpdp_eps1"), (3.0, "mpdp_eps3")):
                recovered, seen, model = server_view_one_client(
                    weights, x, t, epsilon=eps, n_clients=k, rng=rng
                )
                diff = max(
                    float((a - b).abs().max()) for a, b in zip(recovered, plain, strict=True)
                )
                if eps is None:
                    checks["max_abs_recover_minus_plain_noise_off"] = max(
                        checks["max_abs_recover_minus_plain_noise_off"], diff
                    )
                else:
                    noise = float(
                        torch.sqrt(
                            sum(((a - b) ** 2).sum() for a, b in zip(recovered, plain, strict=True))
                        )
                    )
                    signal = float(torch.sqrt(sum((b**2).sum() for b in plain)))
                    noise_ratio.setdefault(name, []).append(noise / signal)
                recon, _ = invert(plain_match, recovered, batch, n_inputs, with_labels=True, **kw)
                scores.setdefault(name, []).append(psnr_mse(recon, x))
                if eps == 1.0:  # Phi in the clear in the same (noisy) upload
                    phi_seen = list(seen.phi)
                    diff = max(
                        float((a.detach() - b).abs().max())
                        for a, b in zip(phi_of(model, x), phi_seen, strict=True)
                    )
                    checks["max_abs_phi_autograd_minus_upload"] = max(
                        checks["max_abs_phi_autograd_minus_upload"], diff
                    )
                    recon, method = attack_phi(model, phi_seen, batch, n_inputs, **kw)
                    scores.setdefault("mpdp_phi_clear", []).append(psnr_mse(recon, x))
                    methods.setdefault("mpdp_phi_clear", []).append(method)
            phi_mean, model = server_phi_sum(weights, list(xs), list(ts), epsilon=1.0, rng=rng)
            recon, method = attack_phi(model, phi_mean, k * batch, n_inputs, **kw)
            scores.setdefault(f"mpdp_phi_sum_K{k}", []).append(
                psnr_mse(recon, xs.reshape(k * batch, n_inputs))
            )
            methods.setdefault(f"mpdp_phi_sum_K{k}", []).append(method)
            scores.setdefault("baseline_mean_image", []).append(
                psnr_mse(mean_image.expand(batch, -1), x)
            )
            log(
                f"inversion, batch {batch}, trial {trial + 1}/{n_trials}: "
                + ", ".join(f"{name} {v[-1][0]:.1f} dB" for name, v in scores.items())
                + f" ({time.perf_counter() - tick:.1f} s)"
            )
        block: dict[str, Any] = {}
        order = ["fedsgd", "mpdp_noise_off", "mpdp_eps1", "mpdp_eps3", "mpdp_phi_clear"]
        for name in sorted(scores, key=lambda n: order.index(n) if n in order else len(order)):
            arr = np.array(scores[name])
            block[name] = {
                "psnr": float(arr[:, 0].mean()),
                "mse": float(arr[:, 1].mean()),
                "psnr_per_trial": [round(float(v), 2) for v in arr[:, 0]],
            }
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


def threshold_attack(
    cal_scores: np.ndarray, cal_member: np.ndarray, eval_scores: np.ndarray, eval_member: np.ndarray
) -> float:
    """Yeom-style: member iff loss < threshold, the threshold maximising balanced accuracy on the
    attacker's calibration split; returns the balanced accuracy on the evaluation split."""

    def balanced(scores: np.ndarray, member: np.ndarray, thr: float) -> float:
        guess = scores < thr
        return 0.5 * (guess[member].mean() + (~guess[~member]).mean())

    candidates = np.unique(cal_scores)
    mids = np.concatenate(
        [[candidates[0] - 1.0], (candidates[1:] + candidates[:-1]) / 2, [candidates[-1] + 1.0]]
    )
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
    half = np.concatenate(
        [rng.permutation(n) < n // 2, rng.permutation(n) < n // 2]
    )  # attacker's half
    log(
        f"membership: trained {sizes} on {n} members in {time.perf_counter() - tick:.1f} s, train "
        f"accuracy {accuracy(weights, xm, ym):.3f}, non-member accuracy "
        f"{accuracy(weights, xn, yn):.3f}"
    )

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
            r_est = estimate_r(
                alpha[half], y_hat[half], t[half]
            )  # the attacker's labelled data only
            r_err.append(float((r_est - keys.r_out).norm() / keys.r_out.norm()))
            corrected.append(asr(y_hat - alpha[:, None] * r_est))
    return {
        "plain": {
            "asr": plain,
            "member_accuracy": accuracy(weights, xm, ym),
            "non_member_accuracy": accuracy(weights, xn, yn),
        },
        "perturbed": {
            "asr": float(np.mean(perturbed)),
            "asr_per_key_draw": [round(v, 4) for v in perturbed],
        },
        "perturbed_corrected": {
            "asr": float(np.mean(corrected)),
            "relative_error_r_est": float(np.mean(r_err)),
            "asr_per_key_draw": [round(v, 4) for v in corrected],
        },
        "n_members": n,
        "n_non_members": n,
        "attacker_known_fraction": 0.5,
    }


# ----------------------------------------------------------------------------------------------


def run_demo(
    *, quick: bool = False, seed: int = 0, hidden: int = 64, clients: int = 10
) -> dict[str, Any]:
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
    flat = {
        name: {"psnr": v["psnr"], "mse": v["mse"]}
        for name, v in first.items()
        if isinstance(v, dict)
    }
    flat.update(inversion)
    t_inv = time.perf_counter() - start
    mia = membership_inference(cfg, data, seed)
    settings = {
        "seed": seed,
        "quick": quick,
        "dataset": "digits 8x8",
        "model": f"bias-free ReLU MLP 64-{hidden}-10, MSE loss, float64",
        "attacked_model": "initial weights (init_weights(sizes, seed))",
        "clients": clients,
        "delta": DELTA,
        "graph": "complete",
        "batches": list(cfg["batches"]),
        "images_per_setting": cfg["images"],
        "lbfgs_max_iter": cfg["lbfgs_iter"],
        "restarts": cfg["restarts"],
        "sigma": {
            f"eps{e:g}": {"sigma_eta": c.sigma_eta, "sigma_delta": c.sigma_delta}
            for e in (1.0, 3.0)
            for c in [calibrate(e, DELTA, clients)]
        },
        "mia_members": cfg["mia_members"],
        "mia_steps": cfg["mia_steps"],
        "mia_key_draws": cfg["mia_key_draws"],
        "seconds": {
            "gradient_inversion": round(t_inv, 1),
            "membership_inference": round(time.perf_counter() - start - t_inv, 1),
        },
    }
    return {"gradient_inversion": flat, "membership_inference": mia, "settings": settings}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
