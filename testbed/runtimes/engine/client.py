"""The Docker engines edgebed talks to, and how: an engine's API is root on its host, so an
address is checked for its shape before it is used, wherever it comes from (DOCKER_HOST, the
user's; or a swarm node's `edgebed.engine` label, which anyone who may label nodes can write).

- `unix:///absolute/path`: an engine on this machine (or a lab host's socket).
- `ssh://[user@]host[:port]`: through the system's `ssh`, its keys and config (a host must
  start with a letter or digit: nothing becomes an ssh option).
- `tcp://host:port` only with TLS, as Docker's own client does it: DOCKER_TLS_VERIFY set (not
  empty) and ca.pem, cert.pem, key.pem in DOCKER_CERT_PATH (default ~/.docker). Plain tcp://
  would hand the engine's API, unencrypted and unauthenticated, to whoever is on the path.
No address: DOCKER_HOST, else this machine's engine (its default socket; Docker CLI contexts
are not read).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Optional

from testbed.runtimes.errors import RuntimeUnavailable

LOCAL_SOCKET = "unix:///var/run/docker.sock"
UNIX = re.compile(r"unix:///[A-Za-z0-9._/-]{1,200}")
SSH = re.compile(r"ssh://(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}(?::[0-9]{1,5})?")
TCP = re.compile(r"tcp://[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}")
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")
PLAIN_TCP = ("plain tcp:// gives the engine's API (root on its host) unencrypted and unauthenticated to anyone on "
             "the path; use ssh://user@host, or the engine's TLS port with DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH "
             "holding ca.pem, cert.pem and key.pem")


class EngineAddressError(RuntimeUnavailable):
    """An engine address edgebed does not use, in one line saying why and what to do."""


def tls_config(environ: Mapping[str, str] = os.environ, where: str = "DOCKER_HOST"):
    """docker.tls.TLSConfig from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH (the engine's certificate
    checked against ca.pem, this client's cert.pem/key.pem presented); None when TLS is not asked."""
    import docker

    if not environ.get("DOCKER_TLS_VERIFY"):
        if environ.get("DOCKER_CERT_PATH"):
            raise EngineAddressError(f"{where}: DOCKER_CERT_PATH without DOCKER_TLS_VERIFY would not check the "
                                     "engine's certificate; set DOCKER_TLS_VERIFY=1")
        return None
    path = Path(environ.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    missing = [f for f in TLS_FILES if not (path / f).is_file()]
    if missing:
        raise EngineAddressError(f"{where}: DOCKER_TLS_VERIFY is set and {path} has no {', '.join(missing)}")
    return docker.tls.TLSConfig(client_cert=(str(path / "cert.pem"), str(path / "key.pem")),
                                ca_cert=str(path / "ca.pem"), verify=True)


def checked_address(url: str, where: str, environ: Mapping[str, str] = os.environ):
    """(url, its TLSConfig or None) if edgebed uses an engine at `url`; else EngineAddressError
    naming `where` the address came from."""
    shown = ascii(url)[1:-1][:80]
    if UNIX.fullmatch(url) and ".." not in url.split("/") or SSH.fullmatch(url):
        return url, None
    if TCP.fullmatch(url):
        tls = tls_config(environ, where)
        if tls is None:
            raise EngineAddressError(f"{where}: engine {shown}: {PLAIN_TCP}")
        return url, tls
    raise EngineAddressError(f"{where}: '{shown}' is not an engine address edgebed uses (unix:///path, "
                             "ssh://user@host[:port], or tcp://host:port with TLS)")


def engine_client(url: Optional[str] = None, timeout: int = 30, where: str = "DOCKER_HOST",
                  environ: Mapping[str, str] = os.environ):
    """A client of the engine at `url` (checked: checked_address), else DOCKER_HOST's, else this
    machine's. ssh:// goes through the system's `ssh` (no paramiko)."""
    import docker

    url = url or environ.get("DOCKER_HOST") or LOCAL_SOCKET
    url, tls = checked_address(url, where, environ)
    if tls is None:
        return docker.DockerClient(base_url=url, timeout=timeout, use_ssh_client=url.startswith("ssh://"))
    return _tls_client(url, tls, timeout)


def _tls_client(url: str, tls, timeout: int):
    """A client that checks the engine against DOCKER_CERT_PATH's CA and no other: requests lets
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE replace a session's CA unless it ignores the environment,
    so the client is made without asking the engine (which would take the environment's), told
    to ignore it, then asks the engine's API version as docker-py's "auto" does."""
    import docker

    client = docker.DockerClient(base_url=url, timeout=timeout, tls=tls,
                                 version=docker.constants.MINIMUM_DOCKER_API_VERSION)
    client.api.trust_env = False
    client.api._version = client.api.version(api_version=False)["ApiVersion"]
    return client


def docker_client(timeout: float = 5.0):
    """A client whose engine (DOCKER_HOST's, else this machine's) answered a ping, or None. An
    address of a shape edgebed does not use (plain tcp://) is an error (EngineAddressError)."""
    try:
        c = engine_client(timeout=int(max(1, timeout)))
        c.ping()
        return c
    except EngineAddressError:
        raise
    except Exception:
        return None


def nvidia_runtime_available(client) -> bool:
    try:
        return "nvidia" in (client.info().get("Runtimes") or {})
    except Exception:
        return False
