"""Flower with TLS and SuperNode authentication (issue 19, part 4): key material and refusals.

The deployment that trains over TLS is tests/test_fl.py's
``test_flower_deployment_runtime_with_tls_and_node_auth_on_loopback``.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("flwr")
x509 = pytest.importorskip("cryptography.x509")

from flower_deployment import CONNECTION, LoopbackDeployment  # noqa: E402
from immersion import InvalidArgumentError, KeyFileError  # noqa: E402
from immersion.cli.main import main  # noqa: E402
from immersion_fl.flower.tls import write_node_key, write_tls_certificates  # noqa: E402


def test_keys_flower_writes_a_ca_a_superlink_certificate_and_node_keys(tmp_path):
    out = CliRunner().invoke(
        main,
        ["keys", "flower", "--out", str(tmp_path / "f"), "--host", "flower.example.org",
         "--host", "10.0.0.5", "--node", "node-0", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    for path in (*(info[k] for k in ("ca_certificate", "ca_key", "certificate", "key")),
                 info["node-0"]["private"], info["node-0"]["public"]):  # fmt: skip
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    ca = x509.load_pem_x509_certificate(open(info["ca_certificate"], "rb").read())
    cert = x509.load_pem_x509_certificate(open(info["certificate"], "rb").read())
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["flower.example.org"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert open(info["node-0"]["public"]).read().startswith("ecdsa-sha2-nistp384 ")
    again = CliRunner().invoke(
        main, ["keys", "flower", "--out", str(tmp_path / "f"), "--node", "node-0"]
    )
    assert again.exit_code == 2 and "exists" in again.output
    assert CliRunner().invoke(main, ["keys", "flower", "--out", str(tmp_path)]).exit_code == 2
    with pytest.raises(InvalidArgumentError) as info_host:
        write_tls_certificates(tmp_path / "g", ["bad host name"])
    assert info_host.value.argument == "hosts"
    with pytest.raises(InvalidArgumentError) as info_name:
        write_node_key(tmp_path / "g", "../escape")
    assert info_name.value.argument == "name"
    (tmp_path / "file").write_text("")
    with pytest.raises(KeyFileError, match="is a file"):
        write_node_key(tmp_path / "file", "node-1")


def _nodes(deployment: LoopbackDeployment, connection: str) -> dict:
    done = deployment.flwr("supernode", "ls", connection, "--format", "json")
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_tls_superlink_refuses_unregistered_or_insecure_nodes_and_untrusting_clients(tmp_path):
    with LoopbackDeployment(tmp_path, secure=True) as deployment:
        private, public = deployment.node_key("node-0")
        registered = deployment.flwr("supernode", "register", str(public), CONNECTION)
        assert "registered successfully" in registered.stdout + registered.stderr
        node = deployment.supernode("node-0", 0, 1, key=private)
        stranger_key, _ = deployment.node_key("stranger")  # a valid key pair, never registered
        refused = [
            deployment.supernode("stranger", 0, 1, key=stranger_key, max_retries=1),
            deployment.supernode("plain", 0, 1, insecure=True, max_retries=1),
        ]
        for proc, why in zip(refused, ("Failed to activate SuperNode", ""), strict=True):
            proc.wait(timeout=180)  # exit code 305: no connection to the SuperLink
            log = proc.log_path.read_text()
            assert proc.returncode != 0 and "Exit Code: 305" in log and why in log, log[-2000:]
        deadline = time.monotonic() + 120
        while True:
            listed = _nodes(deployment, CONNECTION)
            assert listed["success"] is True
            if [n["status"] for n in listed["nodes"]] == ["online"]:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(2)
        assert node.poll() is None
        deployment.add_connection("plain", "insecure = true\n")  # no TLS
        deployment.add_connection("no-ca", "")  # TLS, but the system's CAs only
        for connection in ("plain", "no-ca"):
            assert _nodes(deployment, connection)["success"] is False, connection
