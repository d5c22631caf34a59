"""What the docker and swarm runtimes share: nodes run by a supervisor in a
container (node.supervisor.RoleSupervisor) that takes the runner's requests over the control
channel (runtimes.control.hub): the run's stop told through the hub (HubStop), a role's end by its
supervisor's word (role_ended), processes seen by polling (join_polling), and the requests
both send the same way (SupervisedNodes)."""

from __future__ import annotations

import time
from typing import Callable, Optional

from testbed.node import control
from testbed.runtimes.state import run_labels

GO_TIMEOUT = 180.0  # s for a new container's supervisor to answer its first request (python starting)
# Where a supervised node's processes may write: the rest of its root file system is read-only.
WRITABLE_TMPFS = {"/tmp": "mode=1777", "/var/tmp": "mode=1777"}
# A fleet host's too: it binds its devices' namespaces under /run/netns and mounts cgroups under /run/edgebed.
FLEET_HOST_TMPFS = {"/run": "mode=0755"}


def tmpfs_mode(options: str) -> int:
    """The mode of a tmpfs given as Docker's options ("mode=1777"), as a swarm mount takes it."""
    return int(dict(o.split("=", 1) for o in options.split(","))["mode"], 8)


class HubStop:
    """The run's stop event where nodes are containers: set() tells every node through the hub
    (whose heartbeats, should the runner be killed, stop: the containers then stop by themselves)."""

    def __init__(self, hub):
        self.hub = hub

    def set(self) -> None:
        self.hub.set_stop()

    def is_set(self) -> bool:
        return self.hub.stopping


def role_ended(states: dict, node: str, gen: int) -> Optional[int]:
    """The exit code once generation `gen` of a node's role has ended by its supervisor's word
    (ControlHub.states; superseded by a restart before its end was heard: -9), else None."""
    st = states.get(node)
    if st is None:
        return None
    if st.get("gen", 0) > gen:
        ended = st.get("ended")
        return ended[1] if ended and ended[0] == gen and ended[1] is not None else -9
    if st.get("gen") == gen and not st.get("running"):
        return st["exitcode"] if st.get("exitcode") is not None else -9
    return None


def join_polling(is_alive: Callable[[], bool], timeout: Optional[float], every: float) -> None:
    """Wait until `is_alive()` is false, asking every `every` s, for at most `timeout` s (None: no limit)."""
    deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
    while time.monotonic() < deadline and is_alive():
        time.sleep(every)


class SupervisedNodes:
    """Mixed into a runtime (before Runtime) whose nodes' supervisors take requests (`_request`)
    and whose handles have `node` and `processes`."""

    @property
    def labels(self) -> dict:
        return run_labels(self.state)

    def make_stop_event(self) -> HubStop:
        return HubStop(self.hub)

    @staticmethod
    def stress_of(node) -> list[float]:
        """The node's background stress, one load (cores) per process, for its supervisor."""
        stress = node.profile.stress
        return [] if stress is None else [stress.cpu / stress.processes] * stress.processes

    def set_stress(self, node: str, load: float) -> str:
        return self._request(node, control.Stress(load).to_wire())

    def start_idle(self, stop_event) -> None:
        """Let every node's supervisor idle (hosting `start` jobs) until the stop event."""
        for name, h in self.handles.items():
            if h.node.image is None:  # a foreign image runs its own entrypoint
                self._request(name, control.Go(idle=True).to_wire(), timeout=GO_TIMEOUT)

    def join_processes(self, grace: float) -> None:
        """Wait up to `grace` s in all for every node process (each gets at least 0.1 s)."""
        deadline = time.monotonic() + grace
        for h in self.handles.values():
            for p in h.processes:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
