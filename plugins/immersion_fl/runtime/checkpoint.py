"""Checkpoints of a federated run: server state and keys after every round, owner-only files.

Resuming re-creates the run from its configuration, replaces its keys by the saved ones (checked
against the SHA-256 the state file records; never re-drawn from the seed and compared, since float
keys re-drawn on another CPU or BLAS kernel differ in their last bits), restores the server state,
the noise generator and the history, and continues: on the same machine the result equals that of
an uninterrupted run bit for bit, on another to rounding (both tested).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from immersion import KeyFileError
from immersion.files import npz_bytes, write_private

from ..config import RunConfig

if TYPE_CHECKING:
    from .federation import Server

HISTORY = (
    "accuracy",
    "loss",
    "accuracy_plain",
    "loss_plain",
    "diff_vs_plain",
    "round_s",
    "round_s_plain",
    "dropped",
)


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


class Checkpoint:
    """``DIR/keys.npz`` (once) and ``DIR/state.npz`` (every round), both 0600.

    Parameters
    ----------
    folder:
        The checkpoint folder, created owner-only at the first save (a run that fails before
        its first round ends leaves nothing on disk).
    cfg:
        The run; a checkpoint of another configuration is refused on load.
    """

    def __init__(self, folder: Path, cfg: RunConfig) -> None:
        self.folder = folder
        self.cfg = cfg
        self.cfg_json = cfg.to_json()

    def _keys(self, server: Server) -> dict[str, np.ndarray]:
        return server.scheme.key_arrays()

    def _saved_keys(self, sha256: str) -> dict[str, np.ndarray]:
        """``keys.npz`` (none for a scheme without keys), refused unless it is the file the
        state was written with."""
        path = self.folder / "keys.npz"
        arrays: dict[str, np.ndarray] = {}
        if path.exists() or sha256 != _digest({}):
            try:
                with np.load(path, allow_pickle=False) as data:
                    arrays = {k: data[k] for k in data.files}
            except Exception as exc:  # noqa: BLE001 - numpy's npy/zip parsers raise many kinds
                raise KeyFileError(
                    f"checkpoint: cannot read {path} ({type(exc).__name__}: {exc})"
                ) from None
        if _digest(arrays) != sha256:
            raise KeyFileError(
                f"checkpoint: {path} is not the key file this checkpoint was written with "
                "(altered or replaced)"
            )
        return arrays

    def save(self, server: Server, next_round: int) -> None:
        """Write the server state and history (and the keys, once).

        Parameters
        ----------
        server:
            The run's server.
        next_round:
            The round a resumed run starts with.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        keys = self._keys(server)
        if keys and not (self.folder / "keys.npz").exists():
            write_private(self.folder / "keys.npz", npz_bytes(keys), prefix=".ckpt-")
        history = {name: getattr(server.result, name) for name in HISTORY}
        meta = {
            "cfg": self.cfg_json,
            "next_round": next_round,
            "keys_sha256": _digest(keys),
            "history": history,
            "privacy": server.result.privacy,
        }
        arrays = {f"scheme.{k}": v for k, v in server.scheme.state().items()}
        if server.plain is not None:
            arrays.update({f"plain.{k}": v for k, v in server.plain.state().items()})
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        write_private(self.folder / "state.npz", npz_bytes(arrays), prefix=".ckpt-")

    def load(self, server: Server) -> int:
        """Restore ``server``; return the next round to run.

        Parameters
        ----------
        server:
            A server re-created from the same configuration (its keys are replaced by the
            saved ones).
        """
        path = self.folder / "state.npz"
        arrays, meta = _read_state(path)
        if _saved_config(meta["cfg"], path) != self.cfg:
            raise KeyFileError(
                f"checkpoint: {path} belongs to another configuration; resume with the same options"
            )
        server.scheme.restore_keys(self._saved_keys(meta["keys_sha256"]))
        server.scheme.restore(
            {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("scheme.")}
        )
        if server.plain is not None:
            server.plain.restore(
                {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("plain.")}
            )
        for name in HISTORY:
            setattr(server.result, name, list(meta["history"][name]))
        server.result.privacy = meta["privacy"]
        return int(meta["next_round"])


def _read_state(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and the metadata of a state file, or :class:`KeyFileError` naming it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        if not isinstance(meta, dict) or not {
            "cfg",
            "keys_sha256",
            "next_round",
            "history",
            "privacy",
        } <= set(meta):
            raise ValueError("no checkpoint metadata")
    # missing, truncated or altered: numpy's npy/zip parsers raise many kinds
    except Exception as exc:  # noqa: BLE001
        raise KeyFileError(
            f"checkpoint: cannot read {path} ({type(exc).__name__}: {exc})"
        ) from None
    return arrays, meta


def saved_seed(folder: str | os.PathLike[str]) -> int:
    """The seed of the run saved in ``folder`` (resuming a run whose seed came from OS entropy).

    Parameters
    ----------
    folder:
        A checkpoint folder written by a run.
    """
    path = Path(folder) / "state.npz"
    return _saved_config(_read_state(path)[1]["cfg"], path).seed


def _saved_config(blob: str, path: Path) -> RunConfig:
    """The configuration a checkpoint was written with; format 1 (flat, before the scheme options
    were split off) is migrated."""
    try:
        return RunConfig.from_json(blob)
    except Exception as exc:  # noqa: BLE001 - any unreadable configuration is a foreign file
        raise KeyFileError(
            f"checkpoint: {path} holds a configuration this version cannot read ({exc})"
        ) from None
