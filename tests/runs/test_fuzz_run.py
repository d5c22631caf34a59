"""A live run survives a node that sends garbage: random bytes, random ZeroMQ messages and
mutated edgebed messages to the PS or to a peer's inbox, from inside a worker's own namespace,
for a bounded time."""
import json
import subprocess
import sys
import time

import pytest
import yaml
from helpers import REPO, needs_root, start_up

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]

FUZZER = r'''
import os, random, socket, sys, time
import zmq
sys.path.insert(0, os.environ["EDGEBED_REPO"])
from testbed.node.wire import Message, encode
import torch
ps, seconds, port, kind = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(7)
ctx = zmq.Context()
good = [bytes(f) for f in encode(Message(kind, {"w": torch.ones(4)}, {"base_version": 0, "step": 1}))]
sent = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    kind = sent % 3
    if kind == 0:  # raw bytes on a TCP connection: not even ZMTP
        try:
            with socket.create_connection((ps, port), timeout=1) as s:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300))))
        except OSError:
            pass
    else:  # ZeroMQ messages, under a worker's name or none, random or mutated
        d = ctx.socket(zmq.DEALER)
        if kind == 1:
            d.setsockopt(zmq.IDENTITY, rng.choice([b"w99", b"intruder"]))  # not a node: taking over one is not fuzzing
        d.connect(f"tcp://{ps}:{port}")
        frames = [bytearray(f) for f in good]
        for _ in range(rng.randrange(1, 8)):
            f = frames[rng.randrange(len(frames))]
            f[rng.randrange(len(f))] = rng.getrandbits(8)
        d.send_multipart([bytes(f) for f in frames])
        time.sleep(0.02)
        d.close(linger=200)
    sent += 1
print(sent)
'''


@pytest.mark.parametrize("receiver,algorithm,port,kind", [
    ("ps", "asgd", 5555, "push"),
    ("w1", "gaia", 5556, "grad"),  # a decentralized peer's inbox (its coordinator is the "ps" node)
])
def test_a_run_completes_while_a_node_sends_garbage(tmp_path, receiver, algorithm, port, kind):
    scenario = {"name": "fuzz", "seed": 1, "runtime": "netns",
                "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_interval": 20},
                "stop": {"seconds": 30}, "algorithm": {"name": algorithm},
                "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}}, "workers": [{"count": 3, "profile": "edge"}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    run_dir = tmp_path / "run"
    p = start_up(tmp_path / "s.yaml", run_dir, "-q")
    deadline = time.time() + 90
    while not (run_dir / "steps.csv").exists() or len((run_dir / "steps.csv").read_text().splitlines()) < 4:
        assert p.poll() is None and time.time() < deadline, "training did not start"
        time.sleep(0.2)
    meta = json.loads((run_dir / "meta.json").read_text())
    target, netns = meta["nodes"][receiver]["address"], meta["nodes"]["w0"]["netns"]
    fuzz = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", FUZZER, target, "12", str(port), kind],
                          capture_output=True, text=True, timeout=120, env={"EDGEBED_REPO": str(REPO), "PATH": "/usr/bin:/bin"})
    assert fuzz.returncode == 0, fuzz.stderr[-2000:]
    assert int(fuzz.stdout) > 100
    out, _ = p.communicate(timeout=200)
    assert p.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best_accuracy"] > 0.7, summary  # it trained on
    assert summary["messages_dropped"] > 50, summary
