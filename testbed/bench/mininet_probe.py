"""Mininet's side of `edgebed bench mininet`: run by the system Python that Debian's `mininet`
package installs into (it imports nothing of edgebed). Brings up N CPULimitedHosts with TCLinks
on one switch, measures start-up, memory, one TCP transfer h1 -> h2 (iperf3) and stop, and prints
one JSON line.

    python3 testbed/bench/mininet_probe.py --hosts 8 --rate 10 --cpu 0.25

Docker's engine leaves the host's FORWARD policy at DROP with bridged traffic passing iptables;
Mininet's Linux bridge then drops everything between hosts (FACTS.md). The probe adds one rule
accepting what its own bridge forwards, and removes it afterwards.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10.0, help="Mbit/s of every host's link (TCLink bw)")
    ap.add_argument("--cpu", type=float, default=0.25, help="cores per host (CPULimitedHost)")
    ap.add_argument("--seconds", type=float, default=6.0)
    a = ap.parse_args()

    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import CPULimitedHost
    from mininet.nodelib import LinuxBridge
    from mininet.topo import Topo

    setLogLevel("error")
    ncpu = os.cpu_count() or 1

    class Star(Topo):
        def build(self):
            s = self.addSwitch("s1")
            for i in range(a.hosts):
                h = self.addHost(f"h{i + 1}", cpu=a.cpu / ncpu)  # Mininet's cpu = share of the whole machine
                self.addLink(h, s, bw=a.rate)

    rule = ["FORWARD", "-i", "s1", "-o", "s1", "-j", "ACCEPT"]
    before = mem_available()
    t0 = time.time()
    net = Mininet(topo=Star(), host=CPULimitedHost, link=TCLink, switch=LinuxBridge, controller=None,
                  autoSetMacs=True)
    subprocess.run(["iptables", "-I", *rule], check=False)
    try:
        net.start()
        up_s = time.time() - t0
        used = before - mem_available()
        h1, h2 = net.get("h1"), net.get("h2")
        h2.cmd("iperf3 -s -1 -D")
        time.sleep(0.5)
        out = h1.cmd(f"iperf3 -c {h2.IP()} -t {a.seconds} -O 1 -J")
        try:
            goodput = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        except (ValueError, KeyError):
            goodput = None
        t1 = time.time()
    finally:
        net.stop()
        subprocess.run(["iptables", "-D", *rule], check=False)
    stop_s = time.time() - t1
    print(json.dumps({"tool": "mininet", "hosts": a.hosts, "rate_mbit": a.rate, "cpu": a.cpu, "up_seconds": up_s,
                      "stop_seconds": stop_s, "memory_used_bytes": used, "goodput_bps": goodput}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
