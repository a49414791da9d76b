"""Files written on one machine load on another: a second BLAS kernel and numpy's baseline SIMD.

Float keys re-drawn from a seed differ in their last bits between OpenBLAS kernels (QR,
Householder vectors) and numpy's SIMD dispatch; every file therefore carries its key material, and
nothing is re-derived on load and compared bit for bit. Two checks, each in fresh processes:

* the tests marked ``files`` (key derivation, key files, checkpoints, jobs) pass under the other
  setting;
* files written under this machine's setting load, resume, serve and decode under the other
  (``tests/cross_machine.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _blas_kernel() -> str | None:
    """The OpenBLAS core type numpy runs on here (None if unknown)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    kernels = [
        i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"
    ]
    return kernels[0] if kernels else None


def _dispatched_features() -> list[str]:
    """numpy's SIMD targets above its baseline (AVX2/FMA3 and AVX-512 on x86-64), by their names."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__  # numpy 2
    except ImportError:  # numpy 1.26
        from numpy.core._multiarray_umath import __cpu_dispatch__
    return list(__cpu_dispatch__)


def other_machine() -> dict[str, str]:
    """This process's environment with another OpenBLAS kernel and numpy's SIMD dispatch off."""
    env = dict(os.environ)
    env["OPENBLAS_CORETYPE"] = "Haswell" if _blas_kernel() == "SandyBridge" else "SandyBridge"
    env["NPY_DISABLE_CPU_FEATURES"] = " ".join(_dispatched_features())
    return env


def _run(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_other_setting_really_changes_the_floating_point_results():
    """The control: under the other setting the same seed draws keys whose float bits differ, so
    the two checks below compare what they claim to compare."""
    code = (
        "import hashlib, numpy as np\n"
        "from immersion import draw_keys\n"
        "from immersion.keys.arrays import key_arrays\n"
        "keys = draw_keys(300, 7, 5, extra_state=9, keys='block', block_size=8, rng=11)\n"
        "h = hashlib.sha256()\n"
        "for name, a in sorted(key_arrays(keys).items()):\n"
        "    h.update(np.ascontiguousarray(a).tobytes())\n"
        "print(h.hexdigest())\n"
    )
    here = _run([sys.executable, "-c", code], dict(os.environ), 120)
    there = _run([sys.executable, "-c", code], other_machine(), 120)
    assert here.returncode == 0 and there.returncode == 0, here.stderr + there.stderr
    if here.stdout == there.stdout:
        pytest.skip("this CPU computes the same bits under both settings (no second kernel here)")
    assert here.stdout != there.stdout


@pytest.mark.slow
def test_file_tests_pass_under_another_blas_kernel_and_without_simd_dispatch():
    env = other_machine()
    res = _run(
        [sys.executable, "-m", "pytest", "-q", "-m", "files", "-p", "no:randomly", "tests"],
        env,
        900,
    )
    assert res.returncode == 0, (
        f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} "
        f"NPY_DISABLE_CPU_FEATURES={env['NPY_DISABLE_CPU_FEATURES']!r}:\n{res.stdout[-6000:]}"
    )
    assert " passed" in res.stdout and " deselected" in res.stdout


@pytest.mark.slow
def test_files_written_here_load_resume_and_decode_under_the_other_setting(tmp_path):
    write = _run(
        [sys.executable, "tests/cross_machine.py", "write", str(tmp_path)], dict(os.environ), 600
    )
    assert write.returncode == 0, write.stderr[-4000:]
    assert {p.name for p in tmp_path.iterdir()} >= {
        "block.keys",
        "ckpt-float-m2",
        "siml.job",
        "lwe.npz",
    }
    load = _run(
        [sys.executable, "tests/cross_machine.py", "load", str(tmp_path)], other_machine(), 600
    )
    assert load.returncode == 0, load.stderr[-4000:]


@pytest.mark.files
def test_a_checkpoint_whose_key_file_was_replaced_is_refused(tmp_path):
    """The keys a checkpoint resumes with are the ones its state file records (SHA-256): a key file
    altered by one bit, or missing, is refused instead of silently decoding with other keys."""
    from immersion import KeyFileError
    from immersion_fl.config import RunConfig
    from immersion_fl.runtime.engine import run_federated

    cfg = RunConfig(scheme="sifl-m1", hidden=(8,), clients=2, rounds=2, seed=1)
    run_federated(cfg, checkpoint=tmp_path / "a", stop_after=1)
    keys = np.load(tmp_path / "a" / "keys.npz")
    arrays = {k: keys[k] for k in keys.files}
    name = next(k for k, v in arrays.items() if v.dtype.kind == "f")
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] = np.nextafter(arrays[name].flat[0], np.inf)  # one bit
    np.savez(tmp_path / "a" / "keys.npz", **arrays)
    with pytest.raises(KeyFileError, match="not the key file this checkpoint was written with"):
        run_federated(cfg, checkpoint=tmp_path / "a", resume=True)
    (tmp_path / "a" / "keys.npz").unlink()
    with pytest.raises(KeyFileError, match="cannot read"):
        run_federated(cfg, checkpoint=tmp_path / "a", resume=True)
