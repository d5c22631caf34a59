"""The runner's side of measuring jobs' mailbox (node.mailbox): slots on the control channel that
read like files, so the link check and the benchmarks name a job's result as they would a path
(`box / "w1.json"`, `.exists()`, `.read_text()`) while the job, on any host, puts it over the
channel."""

from __future__ import annotations

import secrets
from typing import Optional

# s: how long a slot may take to arrive after the job that filled it ended (its put has left the
# node, but the runner's hub thread may not have read it yet on a loaded host)
ARRIVAL_S = 10.0


class Slot:
    def __init__(self, box: "Mailbox", key: str):
        self.box, self.key = box, key

    def __str__(self) -> str:  # what a job gets: where to put it
        return f"{self.box.up} {self.box.down} {self.key}"

    def exists(self) -> bool:
        """Filled by now (a flag polled while its job runs)."""
        return self.key in self.box.hub.puts

    def arrived(self, timeout: Optional[float] = None) -> bool:
        """Filled, waiting up to `timeout` (ARRIVAL_S) for it: what to ask once the job that fills it ended."""
        return self.box.hub.wait_put(self.key, ARRIVAL_S if timeout is None else timeout)

    def read_text(self) -> str:
        """The slot's text, once it arrived (ARRIVAL_S at most: its job has ended)."""
        if not self.arrived():
            raise FileNotFoundError(self.key)
        return self.box.hub.puts[self.key]

    def unlink(self, missing_ok: bool = False) -> None:
        if self.box.hub.puts.pop(self.key, None) is None and not missing_ok:
            raise FileNotFoundError(self.key)


class Mailbox:
    """A folder-like set of slots, unique to one use (a random prefix)."""

    def __init__(self, hub, up: str, down: str, name: str = ""):
        self.hub, self.up, self.down = hub, up, down
        self.prefix = f"{name or 'box'}-{secrets.token_hex(4)}"

    def __truediv__(self, name: str) -> Slot:
        return Slot(self, f"{self.prefix}/{name}")

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        pass  # nothing to make: slots exist once filled
