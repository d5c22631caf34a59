"""A node's supervisor speaks with a key of its own that nothing the node runs holds
(node.supervisor_sender): the counters behind traffic.csv and resources.csv, its acks and its
role's state come with it (the hub takes them with no other key: tests/runtimes/test_channel_auth.py).
Its file is readable only with CAP_DAC_OVERRIDE; a forked sender reads it, removes it where it
can and sends what the supervisor hands it; what the supervisor forks closes its end first."""

import json
import os
import subprocess
import sys

import pytest

from testbed.kernel.privileges import drop_privileges
from testbed.node import channel_keys, supervisor

from helpers import REPO, in_child, loopback_hub, needs_root, until

NOBODY = 65534

SENDER = """
import json, os, sys
from testbed.node import supervisor_sender as s
up, node, path = sys.argv[1:4]
try:
    sender = s.SupervisorSender.start(up, node, path)
except s.SupervisorKeyError as e:
    print(json.dumps({"refused": str(e)}))
    sys.exit(0)
fd = s._held[0].fileno()
child = os.fork()
if child == 0:  # a process the supervisor forks: its copy of the end is gone once it forgets
    s.forget()
    try:
        os.fstat(fd)
        os._exit(1)
    except OSError:
        os._exit(0)
forgot = os.waitpid(child, 0)[1] == 0
sender.send("stats", {"node": node, "rx_bytes": 7})
sender.send("steps.csv", {"node": node})  # not a kind it sends: never leaves
sender.close()
print(json.dumps({"forgot": forgot, "file_left": os.path.exists(path)}))
"""


def _sender(hub, node: str, path) -> dict:
    out = subprocess.run([sys.executable, "-c", SENDER, hub.urls[0], node, str(path)], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_sender_reads_its_key_removes_it_and_sends_with_it_alone(tmp_path):
    hub = loopback_hub(tmp_path)
    try:
        hub.keys.admit("w0", "worker")
        path = tmp_path / "supervisor.key"
        path.write_text(hub.keys.supervisor("w0").to_text())
        assert _sender(hub, "w0", path) == {"forgot": True, "file_left": False}
        assert until(lambda: hub.stats.get("w0", {}).get("rx_bytes") == 7) and not hub.drops and hub.rows == 0
        path.write_text(hub.keys.supervisor("w0").to_text())
        assert _sender(hub, "w1", path) == {"refused": "the key of w0, not w1"}
        assert _sender(hub, "w0", tmp_path / "absent") == {"refused": f"no file {tmp_path / 'absent'}"}
    finally:
        hub.close()


@needs_root
@pytest.mark.parametrize("owner,mode", [(NOBODY, 0o400), (0, 0o000)])  # swarm's secret; docker's file
def test_a_supervisors_key_file_is_read_only_with_the_capabilities_a_node_s_processes_drop(tmp_path, owner, mode):
    path = tmp_path / "supervisor.key"
    path.write_text("secret")
    os.chown(path, owner, owner)
    path.chmod(mode)

    def read() -> dict:
        try:
            return {"read": path.read_text()}
        except OSError as e:
            return {"errno": e.errno}

    assert in_child(read) == {"read": "secret"}  # the supervisor's sender: root with its capabilities
    assert in_child(lambda: (drop_privileges(), read())[1]) == {"errno": 13}  # EACCES: uid 0, no capability


def test_what_a_supervisor_forks_closes_its_senders_end_before_anything_else(monkeypatch):
    calls: list[str] = []

    def drop(*identity):
        calls.append("drop")
        raise InterruptedError  # stops each entry point here

    monkeypatch.setattr(supervisor.supervisor_sender, "forget", lambda: calls.append("forget"))
    monkeypatch.setattr(supervisor, "join_cgroups", lambda procs: calls.append("join"))
    monkeypatch.setattr(supervisor, "drop_privileges", drop)
    for main, args in ((supervisor.role_main, ({}, None)), (supervisor.job_main, ("m:f", {})),
                       (supervisor.stress_main, (0.5, None))):
        calls.clear()
        with pytest.raises(InterruptedError):
            main(*args)
        assert calls == ["forget", "join", "drop"], main.__name__


def test_a_supervisor_without_its_own_key_does_not_start(monkeypatch, tmp_path, capsys):
    from testbed.runtimes.control.channel_auth import RunKeys

    monkeypatch.setattr(channel_keys, "KEY_FILE", str(tmp_path / "absent"))
    monkeypatch.setattr(channel_keys, "SUPERVISOR_KEY_FILE", str(tmp_path / "absent too"))
    monkeypatch.setenv(channel_keys.ENV, RunKeys().admit("w0", "worker").to_text())
    assert supervisor.main(["launch", "--supervise", "w0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("no supervisor key for w0 at ") and err.count("\n") == 1


def test_a_fleet_device_speaks_with_its_supervisors_key_and_forks_with_the_devices(tmp_path):
    """A fleet host's device: its acks, states and counters go with its supervisor's key (the hub
    takes them), what it forks is handed the device's keys alone."""
    import zmq

    from testbed.node import channel
    from testbed.node.fleet.device import FleetDevice, HostShare
    from testbed.node.fleet.plan import DevicePlan
    from testbed.node.supervisor import stress_main

    hub = loopback_hub(tmp_path)
    handed = []
    forks = type("Forks", (), {"fork": lambda self, *a: handed.append(a[4]) or object()})()
    ctx = zmq.Context()
    try:
        keys, supervisors = hub.keys.admit("d0", "worker"), hub.keys.supervisor("d0")
        share = HostShare(ctx, forks, None, channel.Heartbeat(20.0), hub.urls, "abcdef", "127.0.0.1", "10.9.0.1")
        device = FleetDevice(DevicePlan("d0", "10.9.0.2"), keys, supervisors, share)
        device._send_json("stats", {"node": "d0", "rx_bytes": 3})
        assert until(lambda: hub.stats.get("d0", {}).get("rx_bytes") == 3) and not hub.drops
        device._fork(stress_main, (0.5, None))
        assert handed == [keys.to_text()] and supervisors.secret.decode() not in handed[0]
        device.listener.close()
        device.sender.close()
    finally:
        ctx.term()
        hub.close()
