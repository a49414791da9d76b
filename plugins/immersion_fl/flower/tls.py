"""Key material for a Flower deployment with TLS and SuperNode authentication (flwr 1.41).

* A small certificate authority (``ca.crt``, ``ca.key``) and a SuperLink certificate signed by
  it for the host names and addresses the SuperNodes and ``flwr`` dial (``superlink.crt``,
  ``superlink.key``): ``flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile superlink.crt
  --ssl-keyfile superlink.key``; every SuperNode and ``flwr`` connection trusts ``ca.crt``
  (``--root-certificates``, ``root-certificates`` in ``~/.flwr/config.toml``).
* One EC P-384 key pair per SuperNode in OpenSSH format (``NAME``, ``NAME.pub``): the public key
  is registered with ``flwr supernode register NAME.pub CONNECTION`` on a SuperLink started with
  ``--enable-supernode-auth``; the SuperNode signs with ``--auth-supernode-private-key NAME``.

Every file is written atomically with mode 0600; keys come from OS entropy (``cryptography``).
For production, certificates from your own PKI serve as well; this is the quickest correct set.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> paths = write_tls_certificates(folder, ["localhost", "127.0.0.1"])
>>> sorted(p.name for p in paths.values())
['ca.crt', 'ca.key', 'superlink.crt', 'superlink.key']
>>> private, public = write_node_key(folder, "node-0")
>>> public.read_text().startswith("ecdsa-sha2-nistp384 "), oct(private.stat().st_mode & 0o777)
(True, '0o600')
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from immersion.errors import InvalidArgumentError, OptionalDependencyError
from immersion.files import private_folder, write_private

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_HOST = re.compile(r"^[A-Za-z0-9.:-]{1,253}$")


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise OptionalDependencyError("cryptography", "fl", "Flower TLS certificates") from None
    return x509, hashes, serialization, ec, NameOID


def write_tls_certificates(
    folder: str | os.PathLike[str], hosts: list[str], *, days: int = 365, overwrite: bool = False
) -> dict[str, Path]:
    """A CA and a SuperLink certificate for ``hosts`` (names or IP addresses), EC P-384, SHA-256.

    Parameters
    ----------
    folder:
        Where to write (created 0700 if missing).
    hosts:
        What clients dial: DNS names and/or IP addresses (e.g. ``["flower.example.org"]``).
    days:
        Validity of both certificates.
    overwrite:
        Replace existing files.

    Returns
    -------
    ``{"ca_certificate", "ca_key", "certificate", "key"}`` paths.
    """
    x509, hashes, serialization, ec, NameOID = _crypto()
    if not hosts or not all(isinstance(h, str) and _HOST.match(h) for h in hosts):
        raise InvalidArgumentError("hosts", f"expected host names or IP addresses, got {hosts!r}")
    if isinstance(days, bool) or not isinstance(days, int) or not 0 < days <= 3650:
        raise InvalidArgumentError("days", f"expected an integer in 1..3650, got {days!r}")
    names = ["ca.crt", "ca.key", "superlink.crt", "superlink.key"]
    target = private_folder(folder, names, overwrite=overwrite)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "immersion Flower CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    alt_names = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def private(k: Any) -> bytes:
        return bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    paths = {
        "ca_certificate": target / "ca.crt",
        "ca_key": target / "ca.key",
        "certificate": target / "superlink.crt",
        "key": target / "superlink.key",
    }
    write_private(paths["ca_key"], private(ca_key))
    write_private(paths["key"], private(key))
    write_private(paths["ca_certificate"], ca.public_bytes(serialization.Encoding.PEM))
    write_private(paths["certificate"], cert.public_bytes(serialization.Encoding.PEM))
    return paths


def write_node_key(
    folder: str | os.PathLike[str], name: str, *, overwrite: bool = False
) -> tuple[Path, Path]:
    """A SuperNode's EC P-384 key pair, OpenSSH format: ``folder/NAME`` and ``NAME.pub`` (0600).

    Parameters
    ----------
    folder:
        Where to write (created 0700 if missing).
    name:
        File stem, e.g. ``node-0``.
    overwrite:
        Replace existing files.

    Returns
    -------
    (private_path, public_path)
    """
    _, _, serialization, ec, _ = _crypto()
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgumentError("name", f"expected a file stem such as node-0, got {name!r}")
    target = private_folder(folder, [name, f"{name}.pub"], overwrite=overwrite)
    key = ec.generate_private_key(ec.SECP384R1())
    private_path, public_path = target / name, target / f"{name}.pub"
    write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    write_private(
        public_path,
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n",
    )
    return private_path, public_path
