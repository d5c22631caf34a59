"""The node image's wheels, pinned: a lock in pip's requirements format (`name==version
--hash=sha256:HEX`, one requirement a line, `\\` continues one), and the check that a wheelhouse
holds exactly the wheels its lock lists, byte for byte."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from testbed.errors import BadInput

PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)")


class LockError(BadInput):
    """A lock line, or a wheel measured against a lock, that does not match (one line, naming it)."""


@dataclass(frozen=True)
class Pin:
    name: str  # normalized (PEP 503)
    version: str
    hashes: frozenset[str]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _requirements(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, requirement) with comments dropped and continued lines joined."""
    start = 0
    parts: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not parts:
            start = number
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            joined = " ".join(p for p in parts if p)
            parts = []
            if joined:
                yield start, joined


def read_lock(path: Path) -> dict[str, Pin]:
    """The lock's pins by normalized name; any other line is refused."""
    pins: dict[str, Pin] = {}
    for number, requirement in _requirements(path.read_text()):
        m = PIN.fullmatch(requirement)
        if m is None:
            raise LockError(f"{path.name} line {number}: not `name==version --hash=sha256:<64 hex digits>`")
        name = normalize(m[1])
        if name in pins:
            raise LockError(f"{path.name} line {number}: {name} is pinned twice")
        pins[name] = Pin(name, m[2], frozenset(re.findall(r"[0-9a-f]{64}", m[3])))
    return pins


def _wheel_identity(path: Path) -> tuple[str, str]:
    parts = path.name.removesuffix(".whl").split("-")
    if not path.name.endswith(".whl") or len(parts) not in (5, 6):
        raise LockError(f"{path.name[:120]}: not a wheel, and a wheelhouse holds only the wheels its lock lists")
    return normalize(parts[0]), parts[1]


def check_wheelhouse(folder: Path, lock: Path) -> None:
    """Every file in `folder` (not its subfolders) is a wheel `lock` pins, with a hash it lists,
    and every pin has its wheel."""
    pins, found = read_lock(lock), set()
    for wheel in sorted(p for p in folder.iterdir() if p.is_file()):
        name, version = _wheel_identity(wheel)
        pin = pins.get(name)
        if pin is None or pin.version != version:
            raise LockError(f"{wheel.name[:120]}: not a wheel {lock.name} lists (its wheels are pinned by version)")
        digest = file_sha256(wheel)
        if digest not in pin.hashes:
            raise LockError(f"{wheel.name}: sha256 {digest[:16]}... is not one {lock.name} lists for "
                            f"{name}=={version}")
        if name in found:
            raise LockError(f"{wheel.name}: a second wheel of {name}, which {lock.name} pins once")
        found.add(name)
    missing = sorted(set(pins) - found)
    if missing:
        raise LockError(f"{folder.name}: no wheel for {', '.join(missing)}, which {lock.name} pins")
