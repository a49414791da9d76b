"""Private files: atomic writes with owner-only permissions, and npz packing without pickle.

Shared by the core (key files, CurveZMQ keys, TLS material) and the plugins (checkpoints, jobs).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def as_path(value: Any, name: str = "path") -> Path:
    """``value`` as a :class:`~pathlib.Path`, or an :class:`InvalidArgumentError` naming it."""
    from .errors import InvalidArgumentError

    if (
        not isinstance(value, (str, os.PathLike))
        or not isinstance(os.fspath(value), str)
        or "\0" in os.fspath(value)
    ):
        raise InvalidArgumentError(
            name, f"expected a file path (str or os.PathLike without NUL bytes), got {value!r}"
        )
    return Path(value)


def write_private(path: Path, payload: bytes, *, prefix: str = ".tmp-") -> None:
    """Write ``payload`` to ``path`` with mode 0600, atomically (a crash leaves no partial file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def npz_bytes(arrays: dict[str, Any]) -> bytes:
    """``arrays`` as the bytes of an ``.npz`` file (read back with ``allow_pickle=False``)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_signed(
    path: Path, magic: bytes, meta: dict[str, Any], arrays: dict[str, Any], *, prefix: str
) -> None:
    """One private file: ``magic``, the payload's SHA-256, then an ``.npz`` of ``arrays``.

    The ``.npz`` also holds ``meta`` as JSON.
    """
    payload = npz_bytes(
        {"__meta__": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays}
    )
    write_private(
        path, magic + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload, prefix=prefix
    )


def read_signed(
    source: Path, magic: bytes, *, what: str, error: type[Exception], private: bool = True
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a file written by :func:`write_signed`.

    Raises ``error("path: ...")`` if it is not one. Refuses foreign, truncated or modified files
    and, if ``private``, files other users can read.
    """
    try:
        blob = source.read_bytes()
    except OSError as exc:
        raise error(f"path: cannot read {source} ({exc.strerror})") from None
    if not blob.startswith(magic):
        raise error(f"path: {source} is not an immersion {what} file")
    header_end = blob.find(b"\n", len(magic))
    digest, payload = blob[len(magic) : header_end].decode(errors="replace"), blob[header_end + 1 :]
    if header_end < 0 or hashlib.sha256(payload).hexdigest() != digest:
        raise error(f"path: {source} failed its integrity check (truncated or modified)")
    if private and source.stat().st_mode & 0o077:
        raise error(f"path: {source} is readable by other users; run chmod 600 on it")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    except Exception as exc:  # noqa: BLE001
        # numpy's npy/zip parsers raise many kinds of exception on a forged payload
        raise error(f"path: {source} is malformed ({type(exc).__name__}: {exc})") from None
    return meta, arrays


def writable_path(
    path: Any, *, overwrite: bool, error: type[Exception], overwrite_hint: str = "overwrite=True"
) -> Path:
    """``path`` as a file we may write.

    Not a folder, not existing unless ``overwrite``, and in an existing folder.
    """
    target = as_path(path)
    if target.is_dir():
        raise error(f"path: {target} is a folder; give a file name")
    if target.exists() and not overwrite:
        raise error(f"path: {target} exists; pass {overwrite_hint} to replace it")
    if not target.parent.is_dir():
        raise error(f"path: folder {target.parent} does not exist")
    return target


def private_folder(folder: Any, files: list[str], *, overwrite: bool) -> Path:
    """``folder`` (made 0700 if missing) for new ``files``; none may exist unless ``overwrite``."""
    from .errors import KeyFileError

    target = as_path(folder, "folder")
    if target.exists() and not target.is_dir():
        raise KeyFileError(f"folder: {target} is a file, not a folder")
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in files:
        if (target / name).exists() and not overwrite:
            raise KeyFileError(
                f"path: {target / name} exists; pass overwrite=True (--overwrite) to replace it"
            )
    return target
