"""Saving and loading keys: one file, SHA-256 integrity check, owner-only permissions, atomic
write."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError, KeyFileError
from ..files import as_path, read_signed, writable_path, write_signed
from .arrays import CODE_NAMES, key_arrays
from .codes import DenseCode, DenseMask, StructuredCode, StructuredMask
from .structured import MixParams

if TYPE_CHECKING:
    from .keys import Keys
    from .modular import ModularKeys

#: Format 1: float keys (unchanged since the first release; older versions read these files).
MAGIC = b"IMMERSION-KEYS-1\n"
#: Format 2: integer keys of the modular arithmetic (older versions refuse them by this header).
MAGIC_MODULAR = b"IMMERSION-KEYS-2\n"


def save_keys(
    keys: "Keys | ModularKeys", path: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Write ``keys`` to ``path`` (mode 0600), atomically: a crash never leaves a partial file.

    Float keys are written in format 1 (``IMMERSION-KEYS-1``), integer keys of the modular
    arithmetic in format 2 (``IMMERSION-KEYS-2``); :func:`load_keys` reads both.

    Parameters
    ----------
    keys:
        Float or integer keys.
    path:
        The file to write.
    overwrite:
        Replace an existing file (otherwise an existing ``path`` is refused).

    Returns
    -------
    Path
        The file written.

    Examples
    --------
    >>> import tempfile, os
    >>> from immersion.keys import Keys, load_keys
    >>> keys = Keys.draw(n_state=2, n_input=1, n_output=1, rng=0)
    >>> path = save_keys(keys, os.path.join(tempfile.mkdtemp(), "k.keys"))
    >>> oct(path.stat().st_mode & 0o777), load_keys(path).fingerprint == keys.fingerprint
    ('0o600', True)
    """
    from .keys import Keys
    from .modular import ModularKeys

    if not isinstance(keys, (Keys, ModularKeys)):
        raise InvalidArgumentError("keys", f"expected a Keys object, got {type(keys).__name__}")
    target = writable_path(path, overwrite=overwrite, error=KeyFileError)
    if isinstance(keys, ModularKeys):
        write_signed(target, MAGIC_MODULAR, modular_meta(keys), keys.arrays(), prefix=".keys-")
    else:
        write_signed(target, MAGIC, keys_meta(keys), key_arrays(keys), prefix=".keys-")
    return target


def load_keys(path: str | os.PathLike[str]) -> "Keys | ModularKeys":
    """Read keys written by :func:`save_keys` (either format); refuse altered or foreign files.

    Parameters
    ----------
    path:
        The key file.

    Returns
    -------
    Keys or ModularKeys
        The keys, after the integrity check (:class:`~immersion.KeyFileError` if it fails).
    """
    source = as_path(path)
    try:
        with source.open("rb") as fh:
            modular = fh.read(len(MAGIC_MODULAR)) == MAGIC_MODULAR
    except OSError:
        modular = False  # read_signed names the problem
    if modular:
        meta, arrays = read_signed(source, MAGIC_MODULAR, what="key", error=KeyFileError)
        return modular_keys_from_arrays(meta, arrays, source=source)
    meta, arrays = read_signed(source, MAGIC, what="key", error=KeyFileError)
    return keys_from_arrays(meta, arrays, source=source)


def modular_meta(keys: "ModularKeys") -> dict[str, Any]:
    """The non-array part of integer keys (format 2), JSON-ready."""
    return {
        "format": 2,
        "arithmetic": "modular",
        "codes": {name: getattr(keys, f"{name}_code").kind for name in CODE_NAMES},
    }


def modular_keys_from_arrays(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], *, source: Path
) -> "ModularKeys":
    """Rebuild integer keys from :func:`modular_meta` and :meth:`ModularKeys.arrays`, validated."""
    from .modular import ModularKeys, ModularMask

    try:
        if meta.get("format") != 2 or meta.get("arithmetic") != "modular":
            raise ValueError(f"expected format 2 with modular arithmetic, got {meta!r}")
        codes = {name: _modular_code(arrays, name, meta["codes"][name]) for name in CODE_NAMES}
        n_out, n_noise = codes["output"].n_total, codes["input"].n_noise
        weights = _uint(arrays["mask.weights"], 1)
        source_idx = _index(arrays["mask.source"], n_noise)
        if weights.shape != (n_out,) or source_idx.shape != (n_out,):
            raise ValueError(f"mask: expected {n_out} weights and sources")
        keys = ModularKeys(
            codes["input"], codes["state"], codes["output"], ModularMask(weights, source_idx)
        )
        keys.validate()
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise KeyFileError(f"path: {source} is malformed ({exc})") from None
    return keys


def _uint(arr: np.ndarray, ndim: int) -> np.ndarray:
    if arr.dtype != np.uint64 or arr.ndim != ndim:
        raise ValueError(f"expected a uint64 {ndim}-D array, got {arr.dtype} of shape {arr.shape}")
    return arr


def _modular_code(arrays: dict[str, np.ndarray], name: str, kind: str) -> Any:
    from .modular import ModularBlockCode, ModularDenseCode, ModularMix

    a = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(name + ".")}
    if kind == "dense":
        pi, pi_left = _uint(a["pi"], 2), _uint(a["pi_left"], 2)
        noise_basis, noise_left = _uint(a["noise_basis"], 2), _uint(a["noise_left"], 2)
        n_total, n_signal = pi.shape
        n_noise = n_total - n_signal
        if (
            n_signal < 1
            or n_noise < 1
            or pi_left.shape != (n_signal, n_total)
            or noise_basis.shape != (n_total, n_noise)
            or noise_left.shape != (n_noise, n_total)
        ):
            raise ValueError(f"{name} code: matrix shapes do not fit")
        return ModularDenseCode(pi, pi_left, noise_basis, noise_left)
    if kind != "block":
        raise ValueError(f"{name} code: unknown kind {kind!r}")
    shear = _uint(a["shear"], 1)
    size = shear.shape[0]
    blocks, blocks_inv = _uint(a["blocks"], 3), _uint(a["blocks_inv"], 3)
    tail, tail_inv = _uint(a["tail"], 2), _uint(a["tail_inv"], 2)
    if (
        blocks.shape != blocks_inv.shape
        or blocks.shape[1:2] != blocks.shape[2:3]
        or tail.shape != tail_inv.shape
        or tail.shape[0] != tail.shape[1]
        or blocks.shape[0] * blocks.shape[-1] + tail.shape[0] != size
        or size < 2
    ):
        raise ValueError(f"{name} code: blocks {blocks.shape} and tail {tail.shape} do not fit")
    group_ids = _index(a["group_ids"], size)
    if (
        group_ids.shape != (size,)
        or group_ids[0] != 0
        or not np.isin(np.diff(group_ids), (0, 1)).all()
    ):
        raise ValueError(f"{name} code: group ids are not contiguous groups 0, 1, ...")
    pivot_rows = _index(a["pivot_rows"], size)
    if pivot_rows.shape != (int(group_ids[-1]) + 1,) or not np.array_equal(
        group_ids[pivot_rows], np.arange(pivot_rows.shape[0])
    ):
        raise ValueError(f"{name} code: expected one pivot row inside each group")
    row_perm, signal_pos, noise_pos = (
        _index(a[k], size) for k in ("row_perm", "signal_pos", "noise_pos")
    )
    if (
        not signal_pos.size
        or not noise_pos.size
        or not np.array_equal(np.sort(row_perm), np.arange(size))
        or not np.array_equal(np.sort(np.concatenate([signal_pos, noise_pos])), np.arange(size))
    ):
        raise ValueError(f"{name} code: row permutation or positions are not a permutation")
    mix = ModularMix(blocks, blocks_inv, tail, tail_inv, shear, group_ids, pivot_rows, row_perm)
    return ModularBlockCode(mix, signal_pos, noise_pos)


def keys_meta(keys: "Keys") -> dict[str, Any]:
    """The non-array part of ``keys`` (noise law, code kinds), JSON-ready."""
    return {
        "noise": None if keys.noise is None else dataclasses.asdict(keys.noise),
        "codes": {name: getattr(keys, f"{name}_code").kind for name in CODE_NAMES},
        "mask": "dense" if isinstance(keys.mask, DenseMask) else "structured",
        "mask_is_generated": keys.mask_is_generated,
    }


def keys_from_arrays(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], *, source: Path
) -> "Keys":
    """Rebuild keys from :func:`keys_meta` and :func:`key_arrays` (extra arrays are ignored)."""
    from .keys import Keys, NoiseLaw

    try:
        codes = {name: _code(arrays, name, meta["codes"][name]) for name in CODE_NAMES}
        mask: Any = (
            DenseMask(_real(arrays["mask.pi4"], 2))
            if meta["mask"] == "dense"
            else StructuredMask(
                _scalar(arrays["mask.beta"]),
                _real(arrays["mask.signs"], 1),
                _index(arrays["mask.source"], codes["input"].n_noise),
            )
        )
        law = None if meta["noise"] is None else NoiseLaw(**meta["noise"])
        generated = meta["mask_is_generated"]
        if not isinstance(generated, bool):
            raise ValueError("mask_is_generated is not a boolean")
        keys = Keys(codes["input"], codes["state"], codes["output"], mask, law, generated)
        _check_working(keys)
    except (
        KeyError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        np.linalg.LinAlgError,
    ) as exc:
        raise KeyFileError(f"path: {source} is malformed ({exc})") from None
    return keys


# A file with a valid checksum can still hold arrays that do not form keys (another version's file,
# a hand-made one, a job file from an untrusted party): check what the coding layer relies on before
# anything runs.
def _real(arr: np.ndarray, ndim: int) -> np.ndarray:
    if arr.dtype.kind not in "fiu" or arr.ndim != ndim or not np.isfinite(arr).all():
        raise ValueError(
            f"expected a finite real {ndim}-D array, got {arr.dtype} of shape {arr.shape}"
        )
    return arr.astype(np.float64)


def _index(arr: np.ndarray, size: int) -> np.ndarray:
    if (
        arr.dtype.kind not in "iu"
        or arr.ndim != 1
        or (arr.size and (arr.min() < 0 or arr.max() >= size))
    ):
        raise ValueError(
            f"expected integer indices below {size}, got {arr.dtype} of shape {arr.shape}"
        )
    return arr.astype(np.int64)


def _scalar(arr: np.ndarray) -> float:
    value = _real(arr, 1)
    if value.shape != (1,) or not value[0] > 0:
        raise ValueError(f"expected one positive number, got {arr!r}")
    return float(value[0])


def _check_code(code: Any, name: str) -> None:
    """Raise ValueError unless the float ``code`` decodes what it encodes."""
    from ..backends.numpy_backend import NumpyBackend

    be, rng = NumpyBackend(), np.random.default_rng(0)
    if not 1 <= code.n_signal < code.n_total or code.n_noise != code.n_total - code.n_signal:
        raise ValueError(
            f"{name} code: {code.n_signal} signal and {code.n_noise} noise entries in "
            f"{code.n_total}"
        )
    y, s = rng.standard_normal(code.n_signal), rng.standard_normal(code.n_noise)
    with np.errstate(all="ignore"):
        yt = code.noisy_encoder(be)(y, s)
        back, dec = code.decoder(be)(yt), code.decoder(be)(code.encoder(be)(y))
    scale = 1.0 + float(np.abs(yt).max())
    if not (
        np.abs(back - y).max() <= 1e-8 * scale and np.abs(dec - y).max() <= 1e-8 * scale
    ):  # NaN fails too
        raise ValueError(f"{name} code does not decode what it encodes")


def _check_working(keys: "Keys") -> None:
    """Raise ValueError unless every code decodes what it encodes and the mask fits the codes."""
    for name in CODE_NAMES:
        _check_code(getattr(keys, f"{name}_code"), name)
    if isinstance(keys.mask, DenseMask):
        want = (keys.output_code.n_total, keys.input_code.n_total)
        if keys.mask.pi4.shape != want:
            raise ValueError(f"mask has shape {keys.mask.pi4.shape}, expected {want}")
    elif (
        keys.mask.signs.shape != keys.mask.source.shape
        or not isinstance(keys.output_code, StructuredCode)
        or keys.mask.signs.shape[0] != keys.output_code.flat_pos.shape[0]
        or not np.isin(keys.mask.signs, (-1.0, 1.0)).all()
    ):
        raise ValueError("mask signs (+-1) and sources do not match the output code's groups")
    keys.validate()


def _code(arrays: dict[str, np.ndarray], name: str, kind: str) -> Any:
    a = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(name + ".")}
    if kind == "dense":
        pi = _real(a["pi"], 2)
        n_total, n_signal = pi.shape
        pi_left, noise_basis = _real(a["pi_left"], 2), _real(a["noise_basis"], 2)
        if pi_left.shape != (n_signal, n_total) or noise_basis.shape != (
            n_total,
            n_total - n_signal,
        ):
            raise ValueError(
                f"{name} code: shapes {pi.shape}, {pi_left.shape}, {noise_basis.shape} do not fit"
            )
        return DenseCode(pi, pi_left, noise_basis)
    if kind != "block":
        raise ValueError(f"{name} code: unknown kind {kind!r}")
    size = a["householder"].shape[0] if a["householder"].ndim == 1 else -1
    blocks, tail = _real(a["blocks"], 3), _real(a["tail"], 2)
    if (
        blocks.shape[1:2] != blocks.shape[2:3]
        or tail.shape[0] != tail.shape[1]
        or blocks.shape[0] * blocks.shape[-1] + tail.shape[0] != size
        or size < 2
    ):
        raise ValueError(
            f"{name} code: blocks {blocks.shape} and tail {tail.shape} do not make {size} rows"
        )
    group_ids = _index(a["group_ids"], size)
    if (
        group_ids.shape != (size,)
        or group_ids[0] != 0
        or not np.isin(np.diff(group_ids), (0, 1)).all()
    ):
        raise ValueError(f"{name} code: group ids are not contiguous groups 0, 1, ...")
    row_perm, signal_pos, noise_pos = (
        _index(a[k], size) for k in ("row_perm", "signal_pos", "noise_pos")
    )
    if not np.array_equal(np.sort(row_perm), np.arange(size)) or not np.array_equal(
        np.sort(np.concatenate([signal_pos, noise_pos])), np.arange(size)
    ):
        raise ValueError(
            f"{name} code: row permutation or signal/noise positions are not a permutation"
        )
    flat_pos = _index(a["flat_pos"], size)
    if flat_pos.shape != (int(group_ids[-1]) + 1,):
        raise ValueError(f"{name} code: expected one flat position per group")
    mix = MixParams(blocks, tail, _real(a["householder"], 1), group_ids, row_perm)
    return StructuredCode(mix, signal_pos, noise_pos, flat_pos, _scalar(a["signal_scale"]))


def code_from_arrays(arrays: dict[str, np.ndarray], *, name: str = "code") -> Any:
    """Rebuild one code from :func:`~immersion.keys.code_arrays`'s output, validated.

    The inverse of ``code_arrays`` for all four kinds (float or integer, dense or block): files
    that carry a code (checkpoints, kits) load it from its arrays instead of re-drawing it from a
    seed, so they load on any machine (float keys re-drawn from a seed differ in their last bits
    between BLAS/LAPACK kernels). Names that are not the code's are ignored.

    Parameters
    ----------
    arrays:
        ``code_arrays(code)``, possibly with other entries beside it.
    name:
        What the code is, for the error message.

    Returns
    -------
    DenseCode, StructuredCode, ModularDenseCode or ModularBlockCode
        The code, checked to decode what it encodes (float) or to be well formed (integer).

    Raises
    ------
    ValueError
        The arrays do not form a code (missing, mis-shaped, not invertible); names ``name``.

    Examples
    --------
    >>> from immersion.keys import code_arrays, draw_code
    >>> code = draw_code(20, 5, kind="block", block_size=4, rng=0)
    >>> back = code_from_arrays(code_arrays(code))
    >>> bool(np.array_equal(back.mix.blocks, code.mix.blocks)), back.n_total
    (True, 25)
    """
    modular = "shear" in arrays or "noise_left" in arrays
    kind = "block" if ("householder" in arrays or "shear" in arrays) else "dense"
    prefixed = {f"{name}.{k}": v for k, v in arrays.items()}
    try:
        if modular:
            code = _modular_code(prefixed, name, kind)
            _check_modular_code(code, name)
        else:
            code = _code(prefixed, name, kind)
            _check_code(code, name)
    except (KeyError, TypeError, AttributeError, IndexError, np.linalg.LinAlgError) as exc:
        raise ValueError(f"{name}: the arrays do not form a {kind} code ({exc!r})") from None
    return code


def _check_modular_code(code: Any, name: str) -> None:
    """Raise ValueError unless the integer ``code`` decodes what it encodes, bit for bit."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2**64, size=code.n_signal, dtype=np.uint64)
    s = rng.integers(0, 2**64, size=code.n_noise, dtype=np.uint64)
    if not np.array_equal(code.decoder()(code.noisy_encoder()(y, s)), y):
        raise ValueError(f"{name} code does not decode what it encodes modulo 2^64")
