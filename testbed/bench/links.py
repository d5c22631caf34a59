"""Link fidelity benchmarks: does a shaped link carry its rate (link, topology), lose what its loss
model says (loss), and delay by its latency (delay)?"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, measure_transfer, save_result
from testbed.errors import RunFailed
from testbed.node import mailbox
from testbed.run.flows import BENCH_PORT, ping_client, ping_server
from testbed.runtimes import runtime_class
from testbed.scenario import units


def topology_benchmark(*, lan: str = "1gbit", wan: str = "100mbit", seconds: float = 5.0,
                       out_dir: Path | None = None, say: Callable[[str], None] = print,
                       tolerance: float = 0.05, runtime: str = "netns") -> dict:
    """Two sites (a: ps, w0; b: w1) with `lan` LANs and a `wan` link: a transfer inside a site
    runs at the LAN rate and never touches the WAN; one across sites runs at the WAN rate."""
    lan_bps, wan_bps = units.parse_rate(lan), units.parse_rate(wan)
    scenario = {"name": "bench", "runtime": runtime, "profiles": {"lan": {"bandwidth": lan}},
                "sites": {"a": {"lan": "lan"}, "b": {"lan": "lan"}}, "wan": {"default": {"bandwidth": wan}},
                "ps": {"site": "a"}, "evaluator": {"site": "a"},
                "workers": [{"count": 1, "site": "a"}, {"count": 1, "site": "b"}]}
    bench = Bench({}, runtime, scenario=scenario)
    results = []
    with bench as (rt, spec):
        ps = spec.node("ps")
        for path, peer, configured in (("lan", spec.node("w0"), lan_bps), ("wan", spec.node("w1"), wan_bps)):
            for direction, sender, receiver in (("up", peer, ps), ("down", ps, peer)):
                wan_link = ("b", "a") if direction == "up" else ("a", "b")
                before = rt.wan_counters()[wan_link]["up_bytes"]
                goodput, wire = measure_transfer(bench, sender, receiver, seconds, 1, f"{path}-{direction}",
                                          lambda n=peer.name, d=direction: rt.link_counter(n, f"{d}_bytes"))
                wan_bytes = rt.wan_counters()[wan_link]["up_bytes"] - before
                results.append({"path": path, "direction": direction, "configured_bps": configured,
                                "goodput_bps": goodput, "wire_bps": wire, "goodput_ratio": goodput / configured,
                                "wan_bytes": wan_bytes})
                say(f"{path} {direction:4s} configured {units.format_rate(configured):>8s}  goodput "
                    f"{goodput / 1e6:8.2f} Mbit/s ({100 * goodput / configured:5.1f}%)  bytes on the WAN "
                    f"{wan_bytes / 1e6:8.2f} MB")
    problems = bench.problems
    ok = (all(abs(1 - r["goodput_ratio"]) <= tolerance for r in results) and not problems
          and all((r["wan_bytes"] < 1e5) == (r["path"] == "lan") for r in results))
    out = {"benchmark": "topology", "runtime": runtime, "lan_bps": lan_bps, "wan_bps": wan_bps,
           "seconds": seconds, "results": results, "ok": ok, "tolerance": tolerance,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "lan: w0 <-> ps in site a; wan: w1 (site b) <-> ps (site a) through both routers; "
                   "wan_bytes = bytes the WAN link carried in that direction during the transfer"}
    name = f"topology-{runtime}-{units.format_rate(lan_bps)}-{units.format_rate(wan_bps)}.json"
    return save_result(out, out_dir, name, say)


def link_benchmark(rate: str, *, seconds: float = 5.0, flows: int = 1, out_dir: Path | None = None,
                   say: Callable[[str], None] = print, tolerance: float = 0.05, runtime: str = "netns",
                   encrypt: bool = False) -> dict:
    """Shape w0's access link to `rate` both ways, saturate each direction with TCP between w0 and ps
    (`encrypt`: on runtime swarm's encrypted overlay)."""
    configured = units.parse_rate(rate)
    scenario = {"name": "bench", "runtime": runtime, "network": {"encrypt": True}, "profiles": {"shaped": {
        "bandwidth": rate}}, "workers": [{"count": 1, "profile": "shaped"}]} if encrypt else None
    bench = Bench({"bandwidth": rate}, runtime, scenario=scenario)
    results = []
    with bench as (rt, spec):
        w0, ps = spec.node("w0"), spec.node("ps")
        for direction, sender, receiver in (("up", w0, ps), ("down", ps, w0)):
            goodput, wire = measure_transfer(bench, sender, receiver, seconds, flows, direction,
                                      lambda d=direction: rt.link_counter("w0", f"{d}_bytes"))
            results.append({"direction": direction, "goodput_bps": goodput, "wire_bps": wire,
                            "goodput_ratio": goodput / configured, "wire_ratio": wire / configured})
            say(f"{direction:4s} configured {units.format_rate(configured):>8s}  goodput {goodput / 1e6:8.3f} Mbit/s "
                f"({100 * goodput / configured:5.1f}%)  wire {wire / 1e6:8.3f} Mbit/s "
                f"({100 * wire / configured:5.1f}%)")
    problems = bench.problems
    ok = all(abs(1 - r["goodput_ratio"]) <= tolerance for r in results) and not problems
    out = {"benchmark": "link", "runtime": runtime, "configured_bps": configured, "flows": flows, "seconds": seconds,
           "encrypted": encrypt, "results": results, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "shaper": runtime_class(runtime).shaper,
           "note": "goodput = TCP payload bytes received per second after a 1 s warm-up; wire = bytes "
                   "counted by the veth (IP packets + Ethernet header) over the steady-state window. "
                   "TCP/IP + Ethernet headers are ~4.4% of a 1514-byte frame, so goodput "
                   "sits below the configured rate by about that much"}
    name = f"link-{runtime}{'-encrypted' if encrypt else ''}-{units.format_rate(configured)}-{flows}flow.json"
    return save_result(out, out_dir, name, say)


def _udp_rcvbuf_errors() -> int:
    """UDP datagrams this namespace dropped for a full socket buffer (not the link's loss)."""
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")]
    return int(dict(zip(lines[0][1:], lines[1][1:]))["RcvbufErrors"])


def udp_sink(port: int, seconds: float, result_path: str, ready_path: str = "", probe_path: str = "") -> None:
    errors_before = _udp_rcvbuf_errors()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", port))
    if ready_path:
        mailbox.touch(ready_path)  # UDP has no handshake: the sender must not start before this
    s.settimeout(0.5)
    got = 0
    probed = False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = s.recv(2048)
        except socket.timeout:
            continue
        if data == b"PROBE":  # path check before the measured sequence (ARP, a slow start)
            if probe_path and not probed:
                mailbox.touch(probe_path)
                probed = True
            continue
        if data == b"END":
            break
        got += 1
    mailbox.write_text(result_path, json.dumps({"received": got,
                                                "rcvbuf_errors": _udp_rcvbuf_errors() - errors_before}))


def _udp_source(addr: str, port: int, packets: int, rate_pps: float, probe_path: str = "") -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 200
    if probe_path:
        # Probe until the sink has heard one: the path works end to end before we count.
        deadline = time.monotonic() + 30
        heard = mailbox.Waiter(probe_path)
        while not heard.poll(10) and time.monotonic() < deadline:
            s.sendto(b"PROBE", (addr, port))
        heard.close()
        time.sleep(0.05)
    t0 = time.monotonic()
    for i in range(packets):
        # paced, so no queue overflows: every lost datagram is the loss model's
        while time.monotonic() < t0 + i / rate_pps:
            pass
        s.sendto(payload, (addr, port))
    time.sleep(0.3)
    for _ in range(50):  # END markers can be lost too
        s.sendto(b"END", (addr, port))
        time.sleep(0.01)


def loss_benchmark(loss: str, *, packets: int = 20000, out_dir: Path | None = None,
                   say: Callable[[str], None] = print, runtime: str = "netns") -> dict:
    """Send paced UDP datagrams over a lossy uplink; compare the measured loss with the configured one."""
    from math import sqrt

    p = units.parse_fraction(loss)
    bench = Bench({"uplink": {"loss": loss}}, runtime)
    with bench as (rt, spec):
        mech = rt.handles["w0"].uplink.mechanisms.get("loss", "none")
        res_file = bench.result("loss.json")
        rate_pps = 10000.0
        ready = bench.result("sink.ready")
        probe = str(bench.result("sink.probed"))
        sink = rt.start("ps", udp_sink, {"port": BENCH_PORT, "seconds": packets / rate_pps + 60,
                                          "result_path": str(res_file), "ready_path": str(ready), "probe_path": probe})
        for _ in range(3000):
            if ready.exists():
                break
            time.sleep(0.01)
        else:
            raise RunFailed("the UDP sink did not start within 30 s")
        src = rt.start("w0", _udp_source, {"addr": spec.ps.address, "port": BENCH_PORT, "packets": packets,
                                           "rate_pps": rate_pps, "probe_path": probe})
        src.join(packets / rate_pps + 60)
        sink.join(packets / rate_pps + 70)
        sink_result = json.loads(res_file.read_text())
        received, host_drops = sink_result["received"], sink_result["rcvbuf_errors"]
    problems = bench.problems
    # Datagrams the receiving host dropped (CPU-starved reader) are not the link's loss.
    measured = 1 - (received + host_drops) / packets
    # 3 standard deviations of a binomial proportion, at least 0.2 points
    tol = max(0.002, 3 * sqrt(max(p * (1 - p), 1e-9) / packets))
    ok = abs(measured - p) <= tol and not problems and not mech.startswith("not-applied")
    say(f"loss configured {100 * p:.2f}%  measured {100 * measured:.2f}% over {packets} datagrams  "
        f"(mechanism: {mech}, tolerance +/-{100 * tol:.2f} points)")
    out = {"benchmark": "loss", "runtime": runtime, "configured": p, "measured": measured, "packets": packets,
           "received": received, "receiver_buffer_drops": host_drops,
           "mechanism": mech, "ok": ok, "tolerance": tol, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return save_result(out, out_dir, f"loss-{runtime}-{p:g}.json", say)


def delay_benchmark(latency: str, *, jitter: str = "0ms", count: int = 50, size: int = 64,
                    out_dir: Path | None = None, say: Callable[[str], None] = print, runtime: str = "netns") -> dict:
    """Round trips of small training messages between w0 (link latency L) and an unshaped PS: expect 2L."""
    import statistics

    lat = units.parse_duration(latency)
    jit = units.parse_duration(jitter)
    prof = {"latency": latency} | ({"jitter": jitter} if jit else {})
    bench = Bench(prof, runtime)
    with bench as (rt, spec):
        h = rt.handles["w0"]
        mech = h.uplink.mechanisms.get("latency", "none")
        # netem delays packets; without it the transport's delay line does (same as a run).
        w_delay = {"up": h.uplink.transport_delay_s, "up_jitter": h.uplink.transport_jitter_s,
                   "down": h.downlink.transport_delay_s, "down_jitter": h.downlink.transport_jitter_s}
        res_file = bench.result("delay.json")
        srv = rt.start("ps", ping_server, {"address": spec.ps.address, "delay": {}, "count": count + 1})
        cli = rt.start("w0", ping_client, {"ps_address": spec.ps.address, "delay": w_delay, "count": count + 1,
                                            "size": size, "result_path": str(res_file)})
        cli.join(120)
        srv.join(10)
        rtts = json.loads(res_file.read_text())["rtts"][1:]  # the first includes connection set-up
    problems = bench.problems
    expected = 2 * lat
    med = statistics.median(rtts)
    ok = abs(med - expected) <= max(0.002, 0.1 * expected) and not problems
    say(f"latency {1000 * lat:g} ms each way (jitter {1000 * jit:g} ms): RTT median {1000 * med:.2f} ms, "
        f"p10 {1000 * sorted(rtts)[len(rtts) // 10]:.2f}, p90 {1000 * sorted(rtts)[9 * len(rtts) // 10]:.2f}, "
        f"stdev {1000 * statistics.pstdev(rtts):.2f} ms; expected {1000 * expected:g} ms  (mechanism: {mech})")
    out = {"benchmark": "delay", "runtime": runtime, "latency_s": lat, "jitter_s": jit, "expected_rtt_s": expected,
           "median_rtt_s": med, "stdev_rtt_s": statistics.pstdev(rtts), "rtts_s": rtts, "message_bytes": size,
           "mechanism": mech, "ok": ok, "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return save_result(out, out_dir, f"delay-{runtime}-{1000 * lat:g}ms-{1000 * jit:g}ms.json", say)
