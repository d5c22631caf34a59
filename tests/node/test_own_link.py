"""A node shaping its own link (testbed.node.own_link, runtime swarm's nodes): partition and heal
by the node's own tc filters, in two namespaces of the test's (no Docker needed)."""

import subprocess
import sys
import textwrap
import uuid

import pytest

from helpers import REPO, needs_root

SHAPED = textwrap.dedent("""
    import socket, sys
    from testbed.node.own_link import OwnLink

    def reach(addr):
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect((addr, 9))
            return "open"
        except ConnectionRefusedError:
            return "refused"  # an answer came back: the path is open
        except OSError:
            return "silent"
        finally:
            s.close()

    link = OwnLink()
    link.shape("10.77.0.1", {"rate_bps": 10_000_000}, {"rate_bps": 10_000_000})
""")  # a node's shaped link, and whether it reaches an address on it

NODE = SHAPED + textwrap.dedent("""
    print(reach("10.77.0.2"), reach("10.77.0.3"))
    link.cut(["10.77.0.2"], True)
    link.cut(["10.77.0.2"], True)  # twice: still one cut
    print(reach("10.77.0.2"), reach("10.77.0.3"))
    link.cut(["10.77.0.2"], False)
    print(reach("10.77.0.2"), reach("10.77.0.3"))
""")


@pytest.fixture
def two_namespaces():
    tag = uuid.uuid4().hex[:6]
    a, b = f"ebtest-{tag}-a", f"ebtest-{tag}-b"  # not eb-: no run of edgebed
    cmds = [f"ip netns add {a}", f"ip netns add {b}",
            f"ip link add v{tag} netns {a} type veth peer name p{tag} netns {b}",
            f"ip -n {a} addr add 10.77.0.1/24 dev v{tag}", f"ip -n {a} link set v{tag} up",
            f"ip -n {b} addr add 10.77.0.2/24 dev p{tag}", f"ip -n {b} addr add 10.77.0.3/24 dev p{tag}",
            f"ip -n {b} link set p{tag} up"]
    try:
        for c in cmds:
            subprocess.run(c.split(), check=True, capture_output=True)
        yield a
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@needs_root
def test_a_cut_drops_one_peer_both_ways_and_a_heal_lets_it_through_again(two_namespaces):
    r = subprocess.run(["ip", "netns", "exec", two_namespaces, sys.executable, "-c", NODE], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    before, cut, healed = [line.split() for line in r.stdout.split("\n") if line]
    assert before == ["refused", "refused"]  # nothing listens on port 9: the peer answers with a reset
    assert cut == ["silent", "refused"]  # the cut peer is gone, its other address is not
    assert healed == ["refused", "refused"]


CLASSES = textwrap.dedent("""
    import json, socket, time
    from testbed.node.own_link import OwnLink

    link = OwnLink()
    link.shape("10.77.0.1", {"rate_bps": 8_000_000}, {"rate_bps": 4_000_000})
    before = link.class_stats()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(200):
        s.sendto(b"x" * 1000, ("10.77.0.2", 9))
    time.sleep(0.5)  # 200 kB at 8 Mbit/s: 0.2 s in the class's queue
    print(json.dumps([before, link.class_stats()]))
""")


@needs_root
def test_a_self_shaping_node_reports_its_classes_for_the_fidelity_monitor(two_namespaces):
    """What a swarm node adds to its stats (the runner cannot read its classes): each direction's
    HTB class, its rate and counters, flat for the channel (runtimes.swarm.services.reported_classes)."""
    import json

    from testbed.runtimes.swarm.services import reported_classes

    r = subprocess.run(["ip", "netns", "exec", two_namespaces, sys.executable, "-c", CLASSES], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    before, after = json.loads(r.stdout.strip().splitlines()[-1])
    assert before["up_class_rate_bps"] == 8_000_000 and before["down_class_rate_bps"] == 4_000_000
    assert after["up_class_bytes"] - before["up_class_bytes"] >= 200 * 1000  # the datagrams left through it
    assert after["up_class_packets"] - before["up_class_packets"] >= 200
    report = {**after, "time": 100.0}
    got = reported_classes({"w0": report}, {"w0": 2.0})
    assert got["w0/up"]["rate_bps"] == 8_000_000 and got["w0/up"]["bytes"] == after["up_class_bytes"]
    assert got["w0/down"]["time"] == 98.0  # on the runner's clock


EVERYONE = SHAPED + textwrap.dedent("""
    import subprocess
    link.bpf_cuts = {bpf}
    print(link.cut_everyone(True, ["10.77.0.3"]))
    link.cut_everyone(True, ["10.77.0.3"])  # twice: still one cut
    print(reach("10.77.0.2"), reach("10.77.0.3"))
    shown = subprocess.run(["tc", "filter", "show", "dev", "{dev}", "egress"], capture_output=True, text=True).stdout
    print(link.everyone_kind, shown.count("edgebed-cut"), shown.count("pref 999 "))
    print(link.cut_everyone(False, ["10.77.0.3"]))
    print(reach("10.77.0.2"), reach("10.77.0.3"))
    print(subprocess.run(["tc", "filter", "show", "dev", "{dev}", "egress"], capture_output=True,
                         text=True).stdout.count("pref 999 "))
""")


@needs_root
@pytest.mark.parametrize("bpf", [None, False])
def test_a_cut_from_everyone_spares_the_runners_path_and_heals(two_namespaces, bpf):
    """A device gone offline (availability, runtime swarm) is cut from everyone but the path to
    the runner's hub: one eBPF classifier each way where the node may load one, else a few u32
    prefixes; never a filter pair for each of thousands of peers."""
    dev = "v" + two_namespaces.split("-")[1]
    script = EVERYONE.replace("{bpf}", str(bpf)).replace("{dev}", dev)
    r = subprocess.run(["ip", "netns", "exec", two_namespaces, sys.executable, "-c", script], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    said_cut, cut, kind, said_healed, healed, left = [line for line in r.stdout.split("\n") if line]
    assert said_cut == "cut off from everyone but 10.77.0.3" and said_healed == "healed with everyone but 10.77.0.3"
    assert cut.split() == ["silent", "refused"]  # everyone is gone but the spared address
    assert healed.split() == ["refused", "refused"]
    kind, programs, lines = kind.split()
    assert kind == ("u32" if bpf is False else "bpf")
    # one classifier (tc shows it in two lines), or the 32 prefixes (and u32's own hash tables)
    assert (int(programs), int(lines) >= 32) == ((1, False) if kind == "bpf" else (0, True)), (programs, lines)
    assert left == "0"


@pytest.mark.parametrize("spare", [[], ["10.205.0.1"], ["10.205.0.1", "10.201.0.254"], ["0.0.0.0"]])
def test_everyone_but_the_spared_is_every_other_address_in_a_few_prefixes(spare):
    import ipaddress
    import random

    from testbed.node.own_link import spared_complement

    nets = spared_complement(spare)
    assert len(nets) <= max(1, 32 * len(spare))
    assert sum(n.num_addresses for n in nets) == 2**32 - len(spare)  # disjoint, and all but the spared
    rng = random.Random(1)
    for address in [*spare, *(str(ipaddress.IPv4Address(rng.getrandbits(32))) for _ in range(200))]:
        inside = any(ipaddress.IPv4Address(address) in n for n in nets)
        assert inside == (address not in spare), address
