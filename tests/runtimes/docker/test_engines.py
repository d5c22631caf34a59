"""Docker engine addresses (runtimes.engine.client): unix:// and ssh:// as before, tcp:// only with
TLS from DOCKER_TLS_VERIFY/DOCKER_CERT_PATH (tried against a TLS server that demands a client
certificate), plain tcp:// and odd shapes refused in one line, from DOCKER_HOST or a node label."""

import datetime
import json
import os
import ssl
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from testbed.runtimes.engine.client import EngineAddressError, checked_address, engine_client
from testbed.runtimes.swarm.hosts import ENGINE_LABEL, SwarmHost, swarm_client

NO_TLS: dict = {"PATH": "/usr/bin"}  # an environment without DOCKER_* (not empty: docker-py reads os.environ then)


@pytest.mark.parametrize("url", ["unix:///var/run/docker.sock", "unix:///run/edgebed-lab/eb-lab-h2/docker.sock",
                                 "ssh://edge@10.0.0.2", "ssh://edge@h2.lan:2222", "ssh://h2"])
def test_unix_and_ssh_addresses_are_used_as_they_are(url):
    assert checked_address(url, "DOCKER_HOST", NO_TLS) == (url, None)


@pytest.mark.parametrize("url", ["ssh://-oProxyCommand=touch${IFS}/tmp/x", "ssh://edge@-oProxyCommand=x",
                                 "ssh://edge@host;id", "http://10.0.0.2:2375", "https://10.0.0.2:2376",
                                 "10.0.0.2:2375", "unix://run/docker.sock", "unix:///run/../etc/x.sock",
                                 "npipe:////./pipe/docker_engine", "tcp://10.0.0.2", "", "unix:///a b"])
def test_other_shapes_are_refused_in_one_line_naming_where_they_came_from(url):
    with pytest.raises(EngineAddressError) as e:
        checked_address(url, "host h2's label edgebed.engine", NO_TLS)
    line = str(e.value)
    assert "\n" not in line and line.startswith("host h2's label edgebed.engine: ")
    assert "not an engine address edgebed uses" in line


def test_plain_tcp_is_refused_saying_why_and_how_to_fix_it():
    with pytest.raises(EngineAddressError) as e:
        checked_address("tcp://10.0.0.2:2375", "DOCKER_HOST", NO_TLS)
    line = str(e.value)
    assert "\n" not in line and line.startswith("DOCKER_HOST: engine tcp://10.0.0.2:2375: plain tcp://")
    assert "unencrypted and unauthenticated" in line and "ssh://user@host" in line and "DOCKER_TLS_VERIFY=1" in line


def test_tls_settings_that_would_not_check_the_engine_are_refused(tmp_path):
    with pytest.raises(EngineAddressError, match="DOCKER_CERT_PATH without DOCKER_TLS_VERIFY"):
        checked_address("tcp://10.0.0.2:2376", "DOCKER_HOST", {"DOCKER_CERT_PATH": str(tmp_path)})
    with pytest.raises(EngineAddressError, match=r"has no ca.pem, cert.pem, key.pem"):
        checked_address("tcp://10.0.0.2:2376", "DOCKER_HOST", {"DOCKER_TLS_VERIFY": "1",
                                                               "DOCKER_CERT_PATH": str(tmp_path)})


def test_a_node_label_is_checked_before_its_engine_is_asked(monkeypatch):
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    for label in ("tcp://10.0.0.9:2375", "ssh://-oProxyCommand=sh"):
        host = SwarmHost(id="n2", hostname="h2", address="", cpus=2, memory=1, gpus=0, labels={ENGINE_LABEL: label})
        with pytest.raises(EngineAddressError, match=f"^host h2's label {ENGINE_LABEL}: "):
            host.engine_client(timeout=1)
    assert SwarmHost(id="n3", hostname="h3", address="", cpus=2, memory=1, gpus=0).engine_client() is None


def test_a_plain_tcp_docker_host_is_refused_not_taken_for_a_missing_engine(monkeypatch):
    from testbed.runtimes.engine.client import docker_client

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    with pytest.raises(EngineAddressError, match="plain tcp://"):
        swarm_client(required=True)
    assert swarm_client(required=False) is None
    with pytest.raises(EngineAddressError, match="plain tcp://"):
        docker_client(timeout=1)


# -- a TLS engine: a server that demands a client certificate signed by the CA -----------------
def _certificates(folder):
    """ca.pem, cert.pem/key.pem (the client's) and server.pem/server-key.pem (127.0.0.1) in `folder`."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def make(name, issuer_name, issuer_key, ca=False, ip=None):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ip:
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
        cert = b.sign(issuer_key or key, hashes.SHA256())
        return key, cert

    ca_key, ca = make("edgebed test CA", None, None, ca=True)
    client_key, client = make("edgebed runner", ca.subject, ca_key)
    server_key, server = make("engine", ca.subject, ca_key, ip="127.0.0.1")
    for name, obj in (("ca", ca), ("cert", client), ("key", client_key), ("server", server),
                      ("server-key", server_key)):
        data = (obj.public_bytes(serialization.Encoding.PEM) if hasattr(obj, "subject") else
                obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
        (folder / f"{name}.pem").write_bytes(data)
    return folder


class _Engine(BaseHTTPRequestHandler):
    """Just enough of the engine's API for a client to start and ping."""
    clients: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Engine.clients.append(self.connection.getpeercert())
        body = (b"OK" if self.path.endswith("/_ping")
                else json.dumps({"ApiVersion": "1.41", "Version": "20.10"}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if self.path.endswith("/_ping") else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def tls_engine(tmp_path):
    pytest.importorskip("cryptography")
    certs = _certificates(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "server.pem", certs / "server-key.pem")
    ctx.load_verify_locations(certs / "ca.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer
    server = HTTPServer(("127.0.0.1", 0), _Engine)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    _Engine.clients = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{server.server_address[1]}", certs
    server.shutdown()
    server.server_close()


def test_a_tcp_engine_is_reached_with_the_tls_of_docker_cert_path(tls_engine, tmp_path, monkeypatch):
    url, certs = tls_engine
    (tmp_path / "other").mkdir()  # requests would take REQUESTS_CA_BUNDLE's CA over DOCKER_CERT_PATH's
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(_certificates(tmp_path / "other") / "ca.pem"))
    client = engine_client(url, timeout=5, environ={"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(certs)})
    assert client.api.base_url.startswith("https://127.0.0.1:")
    assert client.ping() is True
    seen = _Engine.clients[-1]  # the server checked our certificate against the CA
    assert dict(x[0] for x in seen["subject"])["commonName"] == "edgebed runner"


def test_without_tls_settings_the_same_engine_is_never_contacted(tls_engine):
    url, _ = tls_engine
    with pytest.raises(EngineAddressError, match="plain tcp://"):
        engine_client(url, timeout=5, environ=NO_TLS)
    assert _Engine.clients == []


def test_an_engine_whose_certificate_another_ca_signed_is_not_trusted(tls_engine, tmp_path):
    url, _ = tls_engine
    (tmp_path / "other").mkdir()
    other = _certificates(tmp_path / "other")  # a CA of its own: the server's certificate is not its
    with pytest.raises(Exception) as e:
        engine_client(url, timeout=5, environ={"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(other)})
    assert "certificate" in str(e.value).lower() or "ssl" in str(e.value).lower()


def test_this_machines_engine_is_still_reached_over_its_socket(monkeypatch):
    if not os.path.exists("/var/run/docker.sock"):
        pytest.skip("no Docker engine on this machine")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    try:
        client = engine_client(timeout=5)
    except Exception as e:  # a socket with no engine behind it
        pytest.skip(f"the engine does not answer: {e}")
    assert client.api.base_url.startswith("http+docker://") and client.ping() is True


def test_the_cli_says_a_refused_docker_host_in_one_line():
    import subprocess

    from helpers import edgebed_cmd

    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    for args in (["build"], ["hosts"]):
        r = subprocess.run(edgebed_cmd() + args, capture_output=True, text=True, timeout=60,
                           env={**env, "DOCKER_HOST": "tcp://127.0.0.1:2375"})
        assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
        assert r.stderr.startswith("error: DOCKER_HOST: engine tcp://127.0.0.1:2375: plain tcp://"), r.stderr
