"""What the runner sees of a docker node (runtimes.docker.runtime): its container's cgroup (usage), the
container and its role as processes, a function exec'd inside it, and its channel keys put into
its file system."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from testbed.kernel.cgroups import ROOT as CGROUP_ROOT, CgroupUsage, is_v2, v1_mount
from testbed.runtimes.engine.supervised import WRITABLE_TMPFS, join_polling, role_ended

KEYS_VOLUME_AT = "/run"  # a volume of the container's own: the engine copies keys into it before the start


def sealed_root(labels: dict) -> dict:
    """The host config of a container of edgebed's node image: its root file system read-only
    (Kubernetes' "restricted" profile: nothing a node runs can change what its supervisor imports),
    tmpfs where a node writes, and an anonymous volume, labelled as the run's, for its keys (the
    engine refuses to copy into a read-only root, not into a volume)."""
    from docker.types import Mount

    return {"read_only": True, "tmpfs": dict(WRITABLE_TMPFS),
            "mounts": [Mount(KEYS_VOLUME_AT, None, type="volume", labels=labels)]}


class PidCgroup(CgroupUsage):
    """CPU and memory accounting of a container, read from its PID's cgroups."""

    def __init__(self, pid: int):
        self.paths: dict[str, str] = {}
        try:
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, ctrls, path = line.split(":", 2)
                for c in ctrls.split(",") if ctrls else ["unified"]:
                    self.paths[c] = path
        except OSError:
            pass

    def _file(self, ctrl: str, name: str) -> Optional[Path]:
        if is_v2():
            return CGROUP_ROOT / self.paths.get("unified", "/").lstrip("/") / name
        mount = v1_mount(ctrl)
        return mount / self.paths.get(ctrl, "/").lstrip("/") / name if mount else None


class EngineState:
    """A process the engine reports on (`State` of a container, an exec's inspection): alive
    while Running, then its ExitCode."""

    def _engine_state(self) -> dict:
        raise NotImplementedError

    def is_alive(self) -> bool:
        return bool(self._engine_state().get("Running"))

    @property
    def exitcode(self) -> Optional[int]:
        st = self._engine_state()
        return None if st.get("Running") else st.get("ExitCode")


class ContainerProcess(EngineState):
    """The multiprocessing.Process-like view of a node container the runner monitors."""

    def __init__(self, container, stop_on_join: bool = False):
        self.container = container
        self.stop_on_join = stop_on_join  # a foreign image does not listen to edgebed's heartbeats
        self._state: dict = {}
        self._checked = 0.0

    def _refresh(self, max_age: float = 0.5) -> dict:
        if time.monotonic() - self._checked > max_age:
            try:
                self.container.reload()
                self._state = self.container.attrs["State"]
            except Exception:
                self._state = {"Running": False, "ExitCode": -1}
            self._checked = time.monotonic()
        return self._state

    def _engine_state(self) -> dict:
        return self._refresh()

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            if self.stop_on_join:
                self.container.stop(timeout=int(max(1, timeout or 10)))
            self.container.wait(timeout=timeout)
        except Exception:
            pass
        self._checked = 0.0

    def kill(self) -> None:
        try:
            self.container.kill()
        except Exception:
            pass
        self._checked = 0.0


class RoleProcess(ContainerProcess):
    """The runner's view of the role in an edgebed node container, one generation of it (a restart
    starts the next): alive while the container runs and its supervisor says the role runs (its
    word on the role comes over the control channel: ControlHub.states)."""

    def __init__(self, container, states: dict, node: str, gen: int):
        super().__init__(container)
        self.states, self.node, self.gen = states, node, gen

    def _ended(self) -> Optional[int]:
        return role_ended(self.states, self.node, self.gen)

    def is_alive(self) -> bool:
        # not yet started (an older state file) counts as alive while the container is
        return self._ended() is None and super().is_alive()

    @property
    def exitcode(self) -> Optional[int]:
        code = self._ended()
        return code if code is not None else super().exitcode

    def _alive_now(self) -> bool:
        self._checked = 0.0  # the container's state read again
        return self.is_alive()

    def join(self, timeout: Optional[float] = None) -> None:
        join_polling(self._alive_now, timeout, 0.05)


class ExecProcess(EngineState):
    """A function run with `docker exec` inside a node container, seen as a process."""

    def __init__(self, client, container, target, kwargs: dict):
        self.api = client.api
        name = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        payload = json.dumps({"target": name, "kwargs": kwargs})
        self.exec_id = self.api.exec_create(container.id,
                                            ["python", "-m", "testbed.node.supervisor", "--exec", payload])["Id"]
        self.api.exec_start(self.exec_id, detach=True)

    def _engine_state(self) -> dict:
        try:
            return self.api.exec_inspect(self.exec_id)
        except Exception:
            return {"Running": False, "ExitCode": -1}

    def join(self, timeout: Optional[float] = None) -> None:
        join_polling(self.is_alive, timeout, 0.05)

    def kill(self) -> None:
        pass  # dies with its container


def put_channel_keys(api, container_id: str, keys, supervisor_keys) -> None:
    """A node's channel keys into its container alone (node.channel_keys.KEY_FILE, 0400, in a
    folder 0700), and its supervisor's (SUPERVISOR_KEY_FILE, 0000: only CAP_DAC_OVERRIDE reads it,
    and the supervisor's sender removes it once read), copied into the created container's own
    file system: no host folder is mounted."""
    import io
    import posixpath
    import tarfile

    from testbed.node.channel_keys import KEY_FILE, SUPERVISOR_KEY_FILE

    parent, base = posixpath.split(posixpath.dirname(KEY_FILE))  # (KEYS_VOLUME_AT, its folder)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(base)
        d.type, d.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(d)
        for path, held, mode in ((KEY_FILE, keys, 0o400), (SUPERVISOR_KEY_FILE, supervisor_keys, 0o000)):
            data = held.to_text().encode()
            f = tarfile.TarInfo(f"{base}/{posixpath.basename(path)}")
            f.size, f.mode = len(data), mode
            tar.addfile(f, io.BytesIO(data))
    api.put_archive(container_id, parent, buf.getvalue())
