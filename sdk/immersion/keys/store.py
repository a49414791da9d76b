"""Saving and loading keys: one file, SHA-256 integrity check, owner-only permissions, atomic write."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._files import read_signed, write_signed
from ..errors import KeyFileError
from .codes import DenseCode, DenseMask, StructuredCode, StructuredMask
from .structured import MixParams

if TYPE_CHECKING:
    from .keys import Keys

MAGIC = b"IMMERSION-KEYS-1\n"
_CODES = ("input", "state", "output")


def code_arrays(code: Any) -> dict[str, np.ndarray]:
    """Every array that defines one code (dense or structured), by a stable name."""
    if isinstance(code, DenseCode):
        return {"pi": code.pi, "pi_left": code.pi_left, "noise_basis": code.noise_basis}
    m = code.mix
    return {"blocks": m.blocks, "tail": m.tail, "householder": m.householder, "group_ids": m.group_ids,
            "row_perm": m.row_perm, "signal_pos": code.signal_pos, "noise_pos": code.noise_pos,
            "flat_pos": code.flat_pos, "signal_scale": np.array([code.signal_scale])}


def key_arrays(keys: "Keys") -> dict[str, np.ndarray]:
    """Every array that defines ``keys``, by a stable name (used for saving and the fingerprint)."""
    out = {f"{name}.{k}": v for name in _CODES for k, v in code_arrays(getattr(keys, f"{name}_code")).items()}
    if isinstance(keys.mask, DenseMask):
        out["mask.pi4"] = keys.mask.pi4
    else:
        out.update({"mask.beta": np.array([keys.mask.beta]), "mask.signs": keys.mask.signs,
                    "mask.source": keys.mask.source})
    return out


def save_keys(keys: "Keys", path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Write ``keys`` to ``path`` (mode 0600), atomically: a crash never leaves a partial file.

    Examples
    --------
    >>> import tempfile, os
    >>> from immersion.keys import Keys, load_keys
    >>> keys = Keys.draw(n_state=2, n_input=1, n_output=1, rng=0)
    >>> path = save_keys(keys, os.path.join(tempfile.mkdtemp(), "k.keys"))
    >>> oct(path.stat().st_mode & 0o777), load_keys(path).fingerprint == keys.fingerprint
    ('0o600', True)
    """
    target = Path(path)
    if target.is_dir():
        raise KeyFileError(f"path: {target} is a folder; give a file name")
    if target.exists() and not overwrite:
        raise KeyFileError(f"path: {target} exists; pass overwrite=True to replace it")
    if not target.parent.is_dir():
        raise KeyFileError(f"path: folder {target.parent} does not exist")
    write_signed(target, MAGIC, keys_meta(keys), key_arrays(keys), prefix=".keys-")
    return target


def load_keys(path: str | os.PathLike[str]) -> "Keys":
    """Read keys written by :func:`save_keys`; refuse truncated, altered or foreign files."""
    meta, arrays = read_signed(Path(path), MAGIC, what="key", error=KeyFileError)
    return keys_from_arrays(meta, arrays, source=Path(path))


def keys_meta(keys: "Keys") -> dict[str, Any]:
    """The non-array part of ``keys`` (noise law, code kinds), JSON-ready."""
    return {"noise": None if keys.noise is None else dataclasses.asdict(keys.noise),
            "codes": {name: getattr(keys, f"{name}_code").kind for name in _CODES},
            "mask": "dense" if isinstance(keys.mask, DenseMask) else "structured",
            "mask_is_generated": keys.mask_is_generated}


def keys_from_arrays(meta: dict[str, Any], arrays: dict[str, np.ndarray], *, source: Path) -> "Keys":
    """Rebuild keys from :func:`keys_meta` and :func:`key_arrays` (extra arrays are ignored)."""
    from .keys import Keys, NoiseLaw

    try:
        codes = {name: _code(arrays, name, meta["codes"][name]) for name in _CODES}
        mask: Any = (DenseMask(arrays["mask.pi4"]) if meta["mask"] == "dense" else
                     StructuredMask(float(arrays["mask.beta"][0]), arrays["mask.signs"], arrays["mask.source"]))
        law = None if meta["noise"] is None else NoiseLaw(**meta["noise"])
        generated = bool(meta["mask_is_generated"])
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise KeyFileError(f"path: {source} is malformed ({exc})") from None
    return Keys(codes["input"], codes["state"], codes["output"], mask, law, generated)


def _code(arrays: dict[str, np.ndarray], name: str, kind: str) -> Any:
    a = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(name + ".")}
    if kind == "dense":
        return DenseCode(a["pi"], a["pi_left"], a["noise_basis"])
    mix = MixParams(a["blocks"], a["tail"], a["householder"], a["group_ids"], a["row_perm"])
    return StructuredCode(mix, a["signal_pos"], a["noise_pos"], a["flat_pos"], float(a["signal_scale"][0]))
