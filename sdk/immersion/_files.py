"""Private files: atomic writes with owner-only permissions, and npz packing without pickle."""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def write_private(path: Path, payload: bytes, *, prefix: str = ".tmp-") -> None:
    """Write ``payload`` to ``path`` with mode 0600, atomically: a crash never leaves a partial file."""
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
