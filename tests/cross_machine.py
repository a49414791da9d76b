"""Write files on one "machine" and load them on another (tests/test_portable_files.py).

``python tests/cross_machine.py write DIR`` writes key files (float dense and block, integer),
federated checkpoints interrupted after two of four rounds (float SIFL M2, integer SIFL M1) with
the uninterrupted runs' results, a SIML job with its key file and the model the service trained
from it, and an LWE set-up (the cloud's public arrays) with encrypted samples and the cloud's
answers. ``python tests/cross_machine.py load DIR`` loads each of them, resumes, serves and decodes,
and raises AssertionError where a result differs from the writer's: integers bit for bit, floats to
rounding (the two processes may run other BLAS kernels and SIMD paths, which is the point).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FLOAT_KEYS = {"dense": {"keys": "dense"}, "block": {"keys": "block", "block_size": 8}}
RUNS = {
    "float-m2": dict(scheme="sifl-m2", optimizer="adam", lr=0.01, hidden=(16,), seed=5),
    "modular-m1": dict(scheme="sifl-m1", hidden=(8,), seed=3, arithmetic="modular", keys="dense"),
}
SIML = "--model nn-x2 --optimizer sgd --lr 0.05 --epochs 1 --batch-size 16 --keys block --seed 5"


def _signals(rng: np.random.Generator, keys: object) -> dict[str, np.ndarray]:
    n = {name: getattr(keys, f"{name}_code").n_signal for name in ("input", "state", "output")}
    return {name: rng.standard_normal((3, size)) for name, size in n.items()}


def _config(name: str) -> object:
    from immersion_fl.config import RunConfig

    return RunConfig.from_flat({"clients": 3, "rounds": 4, **RUNS[name]})


def _cli(*args: str) -> str:
    from click.testing import CliRunner
    from immersion.cli.main import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def write(folder: Path) -> None:
    from immersion import draw_keys, save_keys
    from immersion.backends import NumpyBackend
    from immersion.lwe import encrypt_controller
    from immersion_fl.runtime.engine import run_federated

    be, rng = NumpyBackend(), np.random.default_rng(1)
    for kind, options in FLOAT_KEYS.items():  # float keys: encodings made here, decoded there
        keys = draw_keys(40, 3, 2, extra_state=5, rng=7, **options)
        save_keys(keys, folder / f"{kind}.keys")
        signals = _signals(rng, keys)
        encoded = {n: getattr(keys, f"{n}_code").encoder(be)(v) for n, v in signals.items()}
        np.savez(
            folder / f"{kind}.npz",
            **{f"signal.{n}": v for n, v in signals.items()},
            **{f"encoded.{n}": v for n, v in encoded.items()},
            fingerprint=keys.fingerprint,
        )
    modular = draw_keys(12, 2, 2, arithmetic="modular", rng=8)
    save_keys(modular, folder / "modular.keys")
    y = rng.integers(0, 2**64, size=(3, 2), dtype=np.uint64)
    np.savez(
        folder / "modular.npz",
        y=y,
        yt=modular.input_code.encoder()(y),
        fingerprint=modular.fingerprint,
    )

    for name in RUNS:  # interrupted after round 2; the uninterrupted run's model beside it
        cfg = _config(name)
        full = run_federated(cfg)
        run_federated(cfg, checkpoint=folder / f"ckpt-{name}", stop_after=2)
        np.save(folder / f"{name}.npy", full.final_model.numpy())
        (folder / f"{name}.json").write_text(json.dumps(full.accuracy))

    keys, job, enc, w = (folder / n for n in ("siml.keys", "siml.job", "siml.enc", "siml.npy"))
    _cli("siml", "encode", *SIML.split(), "--keys-out", str(keys), "--job-out", str(job))
    _cli("siml", "serve", str(job), "--out", str(enc))
    _cli(
        "siml",
        "decode",
        "--keys",
        str(keys),
        "--job",
        str(job),
        "--model-in",
        str(enc),
        "--out",
        str(w),
    )

    a = np.array([[0.9, 0.1], [0.0, 0.8]])
    lwe = encrypt_controller(
        (a, np.eye(2), np.ones((1, 2)), np.zeros((1, 2))), input_range=2, output_range=20, rng=9
    )
    xt = state0 = lwe.encode_state(np.zeros(2))
    samples, answers = [], []
    for y in rng.uniform(-1, 1, size=(6, 2)):
        samples.append(lwe.encode_input(y))
        answers.append(lwe.target.output(xt, samples[-1]))
        xt = lwe.target.step(xt, samples[-1])
        lwe.decode_output(answers[-1], samples[-1])
    np.savez(
        folder / "lwe.npz",
        **{f"setup.{k}": v for k, v in lwe.target.public_arrays().items()},
        samples=np.stack(samples),
        answers=np.stack(answers),
        state0=state0,
        state=xt,
    )


def load(folder: Path) -> None:
    from immersion import load_keys
    from immersion.backends import NumpyBackend
    from immersion.lwe import LweTarget
    from immersion_fl.runtime.engine import run_federated

    be = NumpyBackend()
    for kind in FLOAT_KEYS:
        keys, saved = load_keys(folder / f"{kind}.keys"), np.load(folder / f"{kind}.npz")
        assert keys.fingerprint == str(saved["fingerprint"]), kind  # of the stored bytes
        for name in ("input", "state", "output"):
            decoded = getattr(keys, f"{name}_code").decoder(be)(saved[f"encoded.{name}"])
            np.testing.assert_allclose(decoded, saved[f"signal.{name}"], rtol=0, atol=1e-12)
    modular, saved = load_keys(folder / "modular.keys"), np.load(folder / "modular.npz")
    assert modular.fingerprint == str(saved["fingerprint"])
    assert np.array_equal(modular.input_code.decoder()(saved["yt"]), saved["y"])

    for name in RUNS:
        resumed = run_federated(_config(name), checkpoint=folder / f"ckpt-{name}", resume=True)
        assert resumed.accuracy == json.loads((folder / f"{name}.json").read_text()), name
        np.testing.assert_allclose(
            resumed.final_model.numpy(), np.load(folder / f"{name}.npy"), rtol=0, atol=1e-9
        )

    enc, w = folder / "siml-here.enc", folder / "siml-here.npy"
    _cli("siml", "serve", str(folder / "siml.job"), "--out", str(enc))
    _cli(
        "siml",
        "decode",
        "--keys",
        str(folder / "siml.keys"),
        "--job",
        str(folder / "siml.job"),
        "--model-in",
        str(enc),
        "--out",
        str(w),
    )
    np.testing.assert_allclose(np.load(w), np.load(folder / "siml.npy"), rtol=0, atol=1e-9)

    saved = np.load(folder / "lwe.npz")
    target = LweTarget.from_public_arrays(
        {k.split(".", 1)[1]: saved[k] for k in saved.files if k.startswith("setup.")}
    )
    xt = saved["state0"]
    for yt, answer in zip(saved["samples"], saved["answers"], strict=True):
        assert np.array_equal(target.output(xt, yt), answer)  # integers: bit for bit
        xt = target.step(xt, yt)
    assert np.array_equal(xt, saved["state"])


if __name__ == "__main__":
    {"write": write, "load": load}[sys.argv[1]](Path(sys.argv[2]))
