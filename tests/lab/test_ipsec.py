"""Encrypted overlays (`network: {encrypt: true}`, runtime swarm): the scenario field, the kernel
probe (kernel.ipsec: an ESP SA with AES-GCM over NETLINK_XFRM, as Docker's overlay makes them),
the one-line refusal naming each host and what its kernel lacks, and the overlay's options
(encrypted on request, never attachable). The lab run is in test_swarm.py."""

import errno
import gzip
import socket
import struct
import subprocess
import sys

import pytest

from testbed.kernel import ipsec
from testbed.plan import parse_scenario
from testbed.scenario.schema import ScenarioError

from helpers import REPO, _engine, _run, is_root, run_up, write_scenario


# -- the scenario field --------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["auto", "netns", "docker"])
def test_encrypt_off_swarm_is_refused_in_one_line_naming_the_field(runtime):
    from testbed import runtimes

    sc = parse_scenario({"runtime": runtime, "network": {"encrypt": True}})  # the schema takes it; the runtime not
    lines = [line for line in runtimes.scenario_problems(sc) if "encrypt" in line]
    assert len(lines) == 1 and "network.encrypt: " in lines[0] and "runtime: swarm" in lines[0]


def test_encrypt_on_swarm_reaches_the_plan():
    from testbed.plan.cluster import build_cluster

    sc = parse_scenario({"runtime": "swarm", "network": {"encrypt": True}})
    assert build_cluster(sc, "abc123").encrypt is True
    assert build_cluster(parse_scenario({"runtime": "swarm"}), "abc123").encrypt is False
    with pytest.raises(ScenarioError, match="network.encrypt"):
        parse_scenario({"runtime": "swarm", "network": {"encrypt": "maybe"}})


# -- the kernel probe ------------------------------------------------------------------------------
def test_the_sa_message_has_the_kernels_layout():
    info = ipsec.usersa_info(0x0EB00001)
    assert len(info) == 224  # sizeof(struct xfrm_usersa_info) on 64-bit
    assert info[56:60] == socket.inet_aton(ipsec.PROBE_DST) and info[72:76] == b"\x0e\xb0\x00\x01"  # id.daddr, id.spi
    assert info[76] == ipsec.IPPROTO_ESP and info[80:84] == socket.inet_aton(ipsec.PROBE_SRC)  # id.proto, saddr
    assert struct.unpack_from("=HB", info, 212) == (socket.AF_INET, ipsec.XFRM_MODE_TRANSPORT)  # family, mode
    msg = ipsec.newsa(7, aead=True)
    length, kind = struct.unpack_from("=IH", msg)
    assert length == len(msg) and kind == ipsec.XFRM_MSG_NEWSA
    attr_len, attr_kind = struct.unpack_from("=HH", msg, 16 + 224)
    assert attr_kind == ipsec.XFRMA_ALG_AEAD and attr_len == 4 + 64 + 8 + 36
    assert msg[16 + 228:16 + 228 + 17] == ipsec.AEAD.encode()
    assert struct.unpack_from("=II", msg, 16 + 228 + 64) == (288, 128)  # key bits (AES-256 + salt), ICV bits


class _Kernel:
    """A NETLINK_XFRM socket that answers each request with the errno planned for its kind."""

    def __init__(self, aead: int, null: int):
        self.plan, self.sent, self._answer = {True: aead, False: null}, [], b""

    def send(self, msg: bytes) -> None:
        kind, = struct.unpack_from("=H", msg, 4)
        self.sent.append(kind)
        refused = 0
        if kind == ipsec.XFRM_MSG_NEWSA:
            attr_kind, = struct.unpack_from("=H", msg, 16 + 224 + 2)
            refused = self.plan[attr_kind == ipsec.XFRMA_ALG_AEAD]
        self._answer = struct.pack("=IHHII", 36, ipsec.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -refused) + msg[:16]

    def recv(self, size: int) -> bytes:
        return self._answer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.mark.parametrize("aead,null,found", [
    (0, 0, ipsec.SUPPORTED),
    (errno.ENOSYS, errno.EPROTONOSUPPORT, ipsec.NO_ESP_NO_GCM),  # this machine's kernel
    (errno.EPROTONOSUPPORT, errno.EPROTONOSUPPORT, ipsec.NO_ESP),
    (errno.ENOSYS, errno.ENOENT, ipsec.NO_GCM),  # ESP there (its null-cipher SA got past the type)
    (errno.EPERM, errno.EPERM, ipsec.NOT_ALLOWED),  # no CAP_NET_ADMIN (a job's, after it drops it)
    (errno.EINVAL, errno.EINVAL, ipsec.REFUSED),
])
def test_the_probe_tells_which_part_is_missing(aead, null, found):
    kernel = _Kernel(aead, null)
    assert ipsec.esp_support(lambda: kernel) == found
    if found == ipsec.SUPPORTED:  # the SA it made is removed again
        assert kernel.sent == [ipsec.XFRM_MSG_NEWSA, ipsec.XFRM_MSG_DELSA]


def _config() -> dict:
    try:
        text = gzip.open("/proc/config.gz", "rt").read()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("CONFIG_") and "=" in line)


def test_this_kernel_is_found_as_its_config_says():
    """In a scratch namespace of this machine: the probe agrees with the kernel's own config."""
    if not is_root():
        pytest.skip("needs root: an SA is made in a scratch network namespace")
    cfg = _config()
    if not cfg or "m" in (cfg.get("CONFIG_INET_ESP"), cfg.get("CONFIG_CRYPTO_GCM")):
        pytest.skip("no /proc/config.gz, or ESP/GCM as modules (loaded on demand): nothing to compare with")
    r = subprocess.run(["unshare", "--net", sys.executable, "-c",
                        "from testbed.kernel import ipsec; print(ipsec.esp_support())"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    esp, gcm = cfg.get("CONFIG_INET_ESP") == "y", cfg.get("CONFIG_CRYPTO_GCM") == "y"
    expected = {(True, True): ipsec.SUPPORTED, (False, False): ipsec.NO_ESP_NO_GCM, (False, True): ipsec.NO_ESP,
                (True, False): ipsec.NO_GCM}[(esp, gcm)]
    assert int(r.stdout) == expected, ipsec.MISSING.get(int(r.stdout))


# -- the swarm side --------------------------------------------------------------------------------
def test_the_refusal_is_one_line_naming_each_host_and_what_it_lacks():
    from testbed.runtimes.swarm.ipsec import refusal

    assert refusal({"h1": 0, "h2": 0}) == []
    lines = refusal({"h1": ipsec.NO_ESP_NO_GCM, "h2": ipsec.NO_ESP_NO_GCM, "h3": 0,
                     "h4": "its probe task rejected: No such image"})
    assert len(lines) == 1 and lines[0].startswith("network.encrypt: ") and "\n" not in lines[0]
    assert "hosts h1, h2: no IPsec ESP (CONFIG_INET_ESP) and no AES-GCM (CONFIG_CRYPTO_GCM)" in lines[0]
    assert "host h4: its probe task rejected: No such image" in lines[0] and "h3" not in lines[0]


class _Service:
    def __init__(self, args, kwargs, ended):
        self.args, self.kwargs, self.ended, self.removed = args, kwargs, ended, False

    def tasks(self):
        return [{"CreatedAt": "1", "Status": self.ended}]

    def remove(self):
        self.removed = True


class _Client:
    """A swarm manager whose probe tasks end as `outcome(host id)` says; networks recorded."""

    def __init__(self, outcome):
        self.outcome, self.made, self.nets = outcome, [], []
        self.services, self.networks = self, self

    def create(self, *args, **kwargs):
        if "driver" in kwargs:  # networks.create
            self.nets.append((args, kwargs))
            return kwargs
        node = kwargs["constraints"][0].split("==")[1]
        service = _Service(args[1] if len(args) > 1 else None, kwargs, self.outcome(node))
        self.made.append(service)
        return service


def _runtime(client):
    from testbed.runtimes.swarm.hosts import SwarmHost
    from testbed.runtimes.swarm.runtime import SwarmRuntime

    class Runtime(SwarmRuntime):
        labels = {"edgebed": "1", "edgebed.run": "abc123"}
        run_id = "abc123"

    rt = Runtime.__new__(Runtime)
    rt.client, rt.image, rt.encrypt, rt.say = client, "edgebed/node:s-x", False, lambda line: None
    hosts = [SwarmHost(id=f"n{i}", hostname=f"h{i}", address="", cpus=2, memory=1, gpus=0) for i in (1, 2)]
    return rt, hosts


def test_each_host_tries_its_kernel_and_a_lacking_one_stops_the_run_before_any_overlay():
    ended = {"n1": {"State": "complete", "ContainerStatus": {"ExitCode": 0}},
             "n2": {"State": "failed", "ContainerStatus": {"ExitCode": ipsec.NO_ESP_NO_GCM}, "Err": "non-zero exit"}}
    client = _Client(lambda node: ended[node])
    rt, hosts = _runtime(client)
    with pytest.raises(RuntimeError) as e:
        rt._require_encryption(hosts)
    assert str(e.value).startswith("network.encrypt: ") and "host h2: no IPsec ESP" in str(e.value)
    assert "h1" not in str(e.value)  # its kernel could
    probes = {s.kwargs["constraints"][0]: s for s in client.made}
    assert set(probes) == {"node.id==n1", "node.id==n2"} and all(s.removed for s in client.made)
    one = client.made[0]
    assert one.args == ["python", "-m", "testbed.kernel.ipsec"]  # edgebed's own probe, not a job
    one = one.kwargs
    assert one["cap_add"] == ["NET_ADMIN"] and one["labels"]["edgebed.run"] == "abc123"
    assert rt.encrypt is False and client.nets == []


def test_overlays_are_never_attachable_and_encrypted_once_every_host_can():
    client = _Client(lambda node: {"State": "complete", "ContainerStatus": {"ExitCode": 0}})
    rt, hosts = _runtime(client)
    rt.overlay("eb-abc123", "10.77.0.0/16")
    rt._require_encryption(hosts)
    rt.overlay("eb-abc123-wan-a-b", None)
    (_, plain), (_, encrypted) = client.nets
    assert plain["attachable"] is False and plain["options"] is None and plain["driver"] == "overlay"
    assert encrypted["attachable"] is False and encrypted["options"] == {"encrypted": ""}


def test_a_probe_task_that_never_ran_says_why():
    from testbed.runtimes.swarm.ipsec import exit_status

    assert exit_status({"Status": {"State": "complete", "ContainerStatus": {"ExitCode": 0}}}) == 0
    assert exit_status({"Status": {"State": "failed", "ContainerStatus": {"ExitCode": 5}}}) == 5
    assert exit_status({"Status": {"State": "rejected", "Err": "No such image: edgebed/node:s-x"}}) == \
        "its probe task rejected: No such image: edgebed/node:s-x"


def test_the_probe_command_exits_with_what_it_found():
    """`python -m testbed.kernel.ipsec`, as a probe task runs it: here without CAP_NET_ADMIN when
    not root (NOT_ALLOWED), else in a scratch namespace (what this kernel has)."""
    cmd = [sys.executable, "-m", "testbed.kernel.ipsec"]
    r = subprocess.run((["unshare", "--net"] if is_root() else []) + cmd, capture_output=True, cwd=REPO, timeout=60)
    assert r.returncode in ((ipsec.SUPPORTED, ipsec.NO_ESP, ipsec.NO_GCM, ipsec.NO_ESP_NO_GCM) if is_root()
                            else (ipsec.NOT_ALLOWED,)), r.stderr


# -- on the lab of two hosts (test_swarm's fixture) ----------------------------------------------
def _this_kernel() -> int:
    """What the lab hosts' kernel (this machine's) can do, tried in a scratch namespace."""
    r = subprocess.run(["unshare", "--net", sys.executable, "-c",
                        "from testbed.kernel import ipsec; print(ipsec.esp_support())"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def test_encrypt_on_the_lab_runs_only_where_every_kernel_has_esp_and_gcm(tmp_path, lab, clean_host):
    """Here (no ESP, no GCM) the run is refused in one line before any overlay is made, and
    nothing is left on either host; on a kernel with both, the smoke run trains across them."""
    import yaml

    sc = yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text())
    sc.update(runtime="swarm", network={**sc.get("network", {}), "encrypt": True},
              placement={"ps": "eb-lab-h1", "workers": "eb-lab-h2"})
    kernel = _this_kernel()
    if kernel == ipsec.SUPPORTED:
        run_dir = _run(tmp_path, sc)
        assert (run_dir / "summary.json").is_file()
    else:
        path = write_scenario(tmp_path, sc)
        r = run_up(path, tmp_path / "run", "-q", expect=None, timeout=600)
        said = [line for line in (r.stdout + r.stderr).splitlines() if "network.encrypt" in line]
        assert r.returncode != 0 and len(said) == 1, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"hosts eb-lab-h1, eb-lab-h2: {ipsec.MISSING[kernel]}" in said[0]
        assert "Traceback" not in r.stderr
        _no_probe_left(lab)  # and no run of this test is left (clean_host): nothing was made but the probes


def _no_probe_left(lab, timeout: float = 30.0) -> None:
    """No probe service on the manager, nor a probe's container on any host (the swarm removes a
    removed service's containers a moment later)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = [s.name for s in _engine(lab[0].socket).services.list(filters={"label": "edgebed"})]
        left += [c.name for h in lab for c in _engine(h.socket).containers.list(all=True, filters={"label": "edgebed"})]
        left = [name for name in left if "ipsec-probe" in name]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == []


def test_a_runs_overlay_cannot_be_joined_by_a_container_started_on_a_host(tmp_path, lab, clean_host):
    import io
    import os
    import secrets
    import tarfile
    import time

    import docker

    from testbed.runtimes.state import RunState
    from testbed.runtimes.swarm.runtime import SwarmRuntime, remove_swarm_resources

    run_id = secrets.token_hex(3)
    manager = _engine(lab[0].socket)
    rt = SwarmRuntime(RunState(run_id, os.getpid(), str(tmp_path), "t", runtime="swarm"), manager, "none")
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w") as tar:  # an image with no files: enough to try a join
        tar.addfile(tarfile.TarInfo("etc"), None)
    manager.api.import_image_from_data(empty.getvalue(), repository="eb-empty", tag=run_id)
    try:
        net = rt.overlay(f"eb-{run_id}", None)
        net.reload()
        deadline = time.monotonic() + 10
        while not net.attrs["Driver"] and time.monotonic() < deadline:  # the manager allocates it a moment later
            time.sleep(0.2)
            net.reload()
        assert net.attrs["Attachable"] is False and net.attrs["Driver"] == "overlay"
        with pytest.raises(docker.errors.APIError, match="attachable"):
            box = manager.containers.create(f"eb-empty:{run_id}", command=["/x"], network=net.name,
                                            labels={"edgebed": "1", "edgebed.run": run_id})
            try:
                box.start()
            finally:
                box.remove(force=True)
    finally:
        assert remove_swarm_resources(run_id, manager) == []
        manager.images.remove(f"eb-empty:{run_id}")
