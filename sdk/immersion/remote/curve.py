"""CurveZMQ key pairs for ``immersion serve`` and its clients: draw, save (mode 0600), load, check.

The files are ZeroMQ certificates (the format of ``zmq.auth.create_certificates`` and czmq):
``NAME.key`` holds the public key, ``NAME.key_secret`` the public and the secret key, both as
40-character Z85 text. A server lists the clients it accepts as a folder of ``*.key`` files.
Keys come from OS entropy (libsodium's ``randombytes`` through ``zmq.curve_keypair``); there is
no ``rng`` on purpose: a reproducible transport key would be no key.

Examples
--------
>>> import tempfile
>>> folder = tempfile.mkdtemp()
>>> public, secret = new_curve_keys(folder, "plant-1")
>>> pair = load_curve_secret(secret)
>>> pair.public == load_curve_public(public), oct(secret.stat().st_mode & 0o777)
(True, '0o600')
>>> load_curve_public_folder(folder) == frozenset({pair.public})
True
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, KeyFileError, OptionalDependencyError
from ..files import as_path, private_folder, write_private

PUBLIC_SUFFIX, SECRET_SUFFIX = ".key", ".key_secret"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_SECRET_BANNER = (
    "#   ZeroMQ CURVE **Secret** Certificate (written by `immersion keys curve`)\n"
    "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n"
)
_PUBLIC_BANNER = (
    "#   ZeroMQ CURVE Public Certificate (written by `immersion keys curve`)\n"
    "#   Copy it to the server's clients folder, or give it to the clients as server_key.\n\n"
)


def _zmq() -> Any:
    try:
        import zmq
    except ImportError:
        raise OptionalDependencyError("pyzmq", "remote", "CurveZMQ keys") from None
    return zmq


@dataclass(frozen=True, repr=False)
class CurveKeyPair:
    """A CurveZMQ key pair as Z85 bytes; ``repr`` shows the public key's start, never the secret."""

    public: bytes
    secret: bytes

    @property
    def fingerprint(self) -> str:
        """The first 8 characters of the public key (what logs show of a client)."""
        return fingerprint(self.public)

    def __repr__(self) -> str:
        return f"CurveKeyPair(public={self.fingerprint}..., secret=<hidden>)"


def fingerprint(public: bytes | str) -> str:
    """The first 8 characters of a Z85 public key (enough to tell listed keys apart in logs)."""
    text = public.decode("ascii", errors="replace") if isinstance(public, bytes) else public
    return text[:8]


def new_curve_keys(
    folder: str | os.PathLike[str], name: str, *, overwrite: bool = False
) -> tuple[Path, Path]:
    """Draw a key pair and write ``folder/NAME.key`` and ``folder/NAME.key_secret`` (both 0600).

    Parameters
    ----------
    folder:
        Where to write; created with mode 0700 if missing.
    name:
        File stem: letters, digits, ``.``, ``_``, ``-`` (e.g. ``server``, ``plant-7``, ``admin``).
    overwrite:
        Replace existing files of that name.

    Returns
    -------
    (public_path, secret_path)

    Examples
    --------
    >>> import tempfile
    >>> pub, sec = new_curve_keys(tempfile.mkdtemp(), "server")
    >>> pub.name, sec.name
    ('server.key', 'server.key_secret')
    """
    zmq = _zmq()
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError(
            "name", f"expected letters, digits, '.', '_' or '-' (a file stem), got {name!r}"
        )
    files = [f"{name}{PUBLIC_SUFFIX}", f"{name}{SECRET_SUFFIX}"]
    target = private_folder(folder, files, overwrite=overwrite)
    public_path, secret_path = target / files[0], target / files[1]
    public, secret = zmq.curve_keypair()
    line = f'curve\n    public-key = "{public.decode()}"\n'
    write_private(
        secret_path, (_SECRET_BANNER + line + f'    secret-key = "{secret.decode()}"\n').encode()
    )
    try:
        write_private(public_path, (_PUBLIC_BANNER + line).encode())
    except BaseException:
        secret_path.unlink(missing_ok=True)
        raise
    return public_path, secret_path


def _read_certificate(path: Path, name: str) -> dict[str, bytes]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{name}: cannot read {path} ({exc.strerror})") from None
    found: dict[str, bytes] = {}
    for raw in text.splitlines():
        line = raw.strip()
        for field in (b"public-key", b"secret-key"):
            if line.startswith(field) and b"=" in line:
                found[field.decode()] = line.split(b"=", 1)[1].strip(b" \t'\"")
    for label, value in found.items():
        if not _Z85.match(value.decode("ascii", errors="replace")):
            raise KeyFileError(f"{name}: {path}: malformed {label} (expected 40 Z85 characters)")
    if "public-key" not in found:
        raise KeyFileError(f"{name}: {path} is not a ZeroMQ CURVE certificate (no public-key)")
    return found


def load_curve_secret(path: str | os.PathLike[str], *, name: str = "client_key") -> CurveKeyPair:
    """The key pair in a ``NAME.key_secret`` file; refuses files others can read, or mismatched.

    Parameters
    ----------
    path:
        The secret certificate file.
    name:
        The argument the errors name (``server_key``, ``client_key``, ``admin_key``).

    Returns
    -------
    CurveKeyPair
    """
    zmq = _zmq()
    source = as_path(path, name)
    found = _read_certificate(source, name)
    if "secret-key" not in found:
        raise KeyFileError(
            f"{name}: {source} holds no secret key (give the NAME{SECRET_SUFFIX} file)"
        )
    if source.stat().st_mode & 0o077:
        raise KeyFileError(f"{name}: {source} is readable by other users; run chmod 600 on it")
    if zmq.curve_public(found["secret-key"]) != found["public-key"]:
        raise KeyFileError(f"{name}: {source}: the public key does not belong to the secret key")
    return CurveKeyPair(public=found["public-key"], secret=found["secret-key"])


def load_curve_public(value: Any, *, name: str = "server_key") -> bytes:
    """A public key from a certificate file (``.key`` or ``.key_secret``) or 40 Z85 characters.

    Parameters
    ----------
    value:
        A path, or the key itself as 40 Z85 characters (str or bytes).
    name:
        The argument the errors name.

    Returns
    -------
    bytes
        The Z85 public key.
    """
    if isinstance(value, (str, bytes)) and len(value) == 40:
        text = value.decode("ascii", errors="replace") if isinstance(value, bytes) else value
        if _Z85.match(text) and not Path(text).exists():
            return text.encode()
    return _read_certificate(as_path(value, name), name)["public-key"]


def load_curve_public_folder(
    folder: str | os.PathLike[str], *, name: str = "clients"
) -> frozenset[bytes]:
    """The public keys of every ``*.key`` file in ``folder`` (refuses a missing or empty folder).

    Parameters
    ----------
    folder:
        A folder of public certificates (``.key_secret`` files in it are ignored).
    name:
        The argument the errors name (``clients``, ``admins``).

    Returns
    -------
    frozenset of bytes
        Z85 public keys.
    """
    source = as_path(folder, name)
    if not source.is_dir():
        raise KeyFileError(f"{name}: {source} is not a folder of {PUBLIC_SUFFIX} files")
    keys = frozenset(
        _read_certificate(path, name)["public-key"]
        for path in sorted(source.glob(f"*{PUBLIC_SUFFIX}"))
    )
    if not keys:
        raise KeyFileError(f"{name}: {source} holds no {PUBLIC_SUFFIX} files")
    return keys
