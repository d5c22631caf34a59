"""One update's transfer: the time for the PS to receive a full update over a shaped uplink,
against the ideal (its bits at the configured rate plus one round trip)."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, save_result
from testbed.node import mailbox
from testbed.scenario import units


def _update_server(address: str, count: int) -> None:
    """The PS side: take each update whole, answer a small ack (what a PS's model reply starts with)."""
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.ps_endpoint(ctx, address, transport.DelaySpec())
    answered = 0
    deadline = time.monotonic() + 600
    while answered < count and time.monotonic() < deadline:
        for sender, _msg, _ in ep.recv(0.1):
            ep.send(Message("ack"), sender)
            answered += 1
    time.sleep(0.2)
    ep.close()
    ctx.term()


def _update_client(ps_address: str, params: int, repeats: int, result_path: str) -> None:
    """The worker side: a ping (connection set-up), then `repeats` dense updates of `params` float32s,
    each timed from send to the PS's ack."""
    import torch
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.node_endpoint(ctx, ps_address, "w0", transport.DelaySpec())

    def round_trip(tensors: dict) -> tuple[float, int]:
        t = time.monotonic()
        sent = ep.send(Message("push", tensors))
        while not ep.recv(0.5):
            pass
        return time.monotonic() - t, sent

    round_trip({})  # connect
    rtts = [round_trip({})[0] for _ in range(5)]
    update = {"g": torch.zeros(params, dtype=torch.float32)}
    times, wire_bytes = [], 0
    for _ in range(repeats):
        time.sleep(0.5)  # let the shaper's bucket refill, as a worker's compute step would
        dt, wire_bytes = round_trip(update)
        times.append(dt)
    mailbox.write_text(result_path, json.dumps({"rtt": statistics.median(rtts), "times": times,
                                             "message_bytes": wire_bytes}))
    ep.close()
    ctx.term()


# TCP over Ethernet at MTU 1500 carries 1448 payload bytes (timestamps on) per 1514-byte frame
# counted by the shaper: the best a shaped link can give a message is rate * 1448/1514.
FRAME_EFFICIENCY = 1448 / 1514


def update_benchmark(params: int, rate: str, *, repeats: int = 3, out_dir: Path | None = None,
                     say: Callable[[str], None] = print, tolerance: float = 0.10, runtime: str = "netns") -> dict:
    """Time for the PS to receive one full update of `params` parameters over w0's `rate` uplink,
    against the ideal 32 * params / rate + one round trip."""
    configured = units.parse_rate(rate)
    bench = Bench({"bandwidth": rate}, runtime)
    with bench as (rt, spec):
        res_file = bench.result("update.json")
        srv = rt.start("ps", _update_server, {"address": spec.ps.address, "count": repeats + 6})
        cli = rt.start("w0", _update_client, {"ps_address": spec.ps.address, "params": params, "repeats": repeats,
                                              "result_path": str(res_file)})
        cli.join(120 + repeats * (64 * params / configured + 5))
        srv.join(10)
        res = json.loads(res_file.read_text())
    measured = statistics.median(res["times"])
    ideal = 32 * params / configured + res["rtt"]
    framed = 8 * res["message_bytes"] / (configured * FRAME_EFFICIENCY) + res["rtt"]
    ratio = measured / ideal
    ok = abs(ratio - 1) <= tolerance and not bench.problems
    say(f"{params / 1e6:g}M parameters ({res['message_bytes'] / 1e6:.2f} MB message) "
        f"over {units.format_rate(configured)}: "
        f"{measured:.3f} s; ideal 32P/B + RTT {ideal:.3f} s ({100 * (ratio - 1):+.1f}%), with TCP/IP/Ethernet "
        f"framing {framed:.3f} s ({100 * (measured / framed - 1):+.1f}%)")
    out = {"benchmark": "update", "runtime": runtime, "params": params, "configured_bps": configured,
           "repeats": repeats, "times_s": res["times"], "median_s": measured, "rtt_s": res["rtt"],
           "message_bytes": res["message_bytes"], "ideal_s": ideal, "ratio": ratio, "framed_ideal_s": framed,
           "ratio_to_framed": measured / framed, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "ideal = 32 * params / rate + RTT (payload only); framed = the message's bytes at "
                   f"{FRAME_EFFICIENCY:.4f} of the rate (1448 TCP payload bytes per 1514-byte frame) + RTT"}
    return save_result(out, out_dir, f"update-{runtime}-{params}-{units.format_rate(configured)}.json", say)
