"""Submit the Flower app to a SuperLink and wait for it to finish: `flwr run --stream`, with the
SuperLink connection that Flower's CLI reads from $FLWR_HOME/config.toml written first (the CLI
takes a connection by name only). scenarios/byo/flower.yaml runs it on the evaluator node, as a
researcher's laptop would submit to a real federation. The exit code is flwr's."""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wait_for(address: str, seconds: float) -> bool:
    """Until the SuperLink accepts connections (it may start after this program)."""
    host, _, port = address.rpartition(":")
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return True
        except OSError:
            time.sleep(0.5)
    return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--superlink", required=True, help="host:port of the SuperLink's control API")
    ap.add_argument("--app", default=str(Path(__file__).parent), help="the Flower app's folder")
    ap.add_argument("--run-config", default="", help="overrides, e.g. 'num-server-rounds=3'")
    ap.add_argument("--wait", type=float, default=120, help="seconds to wait for the SuperLink")
    args = ap.parse_args()
    if not wait_for(args.superlink, args.wait):
        print(f"no SuperLink at {args.superlink} after {args.wait:.0f} s", file=sys.stderr)
        return 1
    home = Path(os.environ.get("FLWR_HOME") or tempfile.mkdtemp(prefix="flwr-home-"))
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "edgebed"\n\n[superlink.edgebed]\n'
                                      f'address = "{args.superlink}"\ninsecure = true\n')
    flwr = Path(sys.executable).with_name("flwr")
    cmd = [str(flwr), "run", args.app, "edgebed", "--stream"]
    if args.run_config:
        cmd += ["--run-config", args.run_config]
    return subprocess.call(cmd, env={**os.environ, "FLWR_HOME": str(home)})


if __name__ == "__main__":
    sys.exit(main())
