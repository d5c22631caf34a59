"""A netns node process's own view of the host's control files: read-only.

A node's code keeps uid 0 after it drops its capabilities (kernel.privileges), and root owns the
cgroup files and sysctls: without this, a role or a command's program could raise its own CPU
quota, move itself out of its cgroup or change the kernel's settings, and the run would go on
measuring a device it no longer is. So before it drops, the process takes a mount namespace of
its own (propagation from the host only, never back) in which every mount under
/sys/fs/cgroup and /proc/sys is remounted read-only. Writes there then fail with EROFS; the
runner, in the host's namespace, still changes the node's limits (the timeline's cpu events).

The docker and swarm runtimes need none of this: Docker mounts /sys and /proc/sys read-only in
a container already.

A netns node also runs as a uid of its own (kernel.identity), which cannot pass through a 0700
folder of root's. What it must read there (the interpreter under /root/.pyenv, a checkout or a
venv in root's home) is reached through bridges in its mount namespace: a tmpfs over the closed
folder with only the needed entries bound back in, so nothing else of that folder shows.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from testbed.errors import HostCannot

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 19
KEPT_FLAGS = 2 | 4 | 8  # nosuid, nodev, noexec: the same bits in statvfs's f_flag and mount's flags
READ_ONLY = ("/sys/fs/cgroup", "/proc/sys")
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8


class MountError(HostCannot):
    pass


def _call(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise MountError(f"{what}: {os.strerror(err)}")


def mount_points(under: tuple[str, ...], mountinfo: str) -> list[str]:
    """The mount points at or below any of `under`, parents first (from /proc/self/mountinfo)."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in under):
                points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def read_only_host_controls(paths: tuple[str, ...] = READ_ONLY, hide_others: bool = False) -> list[str]:
    """This process in a mount namespace of its own where `paths` are read-only (needs
    CAP_SYS_ADMIN: call before dropping it). With `hide_others`, its /proc is a procfs of its own
    that shows a uid without CAP_SYS_PTRACE only its own processes (hidepid=invisible: a netns
    node then lists neither its neighbours nor the runner). Returns the mount points made read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    _call(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _call(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    if hide_others:
        _call(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=invisible"),
              "a procfs of its own on /proc (hidepid=invisible: Linux 5.8)")
    with open("/proc/self/mountinfo") as f:
        points = mount_points(paths, f.read())
    for path in paths:  # a path that is no mount point of its own (/proc/sys) becomes one
        if path not in points and os.path.isdir(path):
            _call(libc.mount(path.encode(), path.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")
            points.insert(0, path)
    for point in points:
        kept = os.statvfs(point).f_flag & KEPT_FLAGS
        _call(libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None),
              f"remount {point} read-only")
    return points


def hide_mounts(paths: tuple[str, ...]) -> None:
    """This process in a mount namespace of its own (propagation from its parent's only, never
    back) without the mounts at `paths` (a fleet host's cgroup hierarchy, which a device's
    processes have joined their cgroup through: they need not see the other devices' limits).
    Needs CAP_SYS_ADMIN: call before dropping it. A path that is no mount is passed over."""
    libc = ctypes.CDLL(None, use_errno=True)
    _call(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    _call(libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    for path in paths:
        if libc.umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0 and \
                ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):  # no mount there, no such path
            _call(-1, f"umount {path}")


Bridge = tuple[str, tuple[str, ...]]  # a folder closed to strangers, and the entries bound back into it
MAX_ENTRIES = 256  # of a closed folder a node reads whole (each is a bind mount at every process start)


def _closed(st: os.stat_result) -> bool:
    """Whether a folder is closed to a uid that neither owns it nor is in its group (a node's)."""
    return not st.st_mode & 0o001


def bridges(paths: list[str], whole: frozenset[str] = frozenset()) -> list[Bridge]:
    """The folders on the way to `paths` (absolute, no symbolic links: os.path.realpath's) that
    a node's uid cannot pass, each with the entries of it the paths go through, parents first;
    a path of `whole` that is itself such a folder (an import folder made 0700) with all its
    entries, up to MAX_ENTRIES. Pure but for stat: the runner plans them once, each node process
    makes them."""
    needed: dict[str, set[str]] = {}
    for path in paths:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts) + 1):
            folder = "/" + "/".join(parts[:depth])
            try:
                closed = _closed(os.stat(folder))
            except OSError:
                break
            if closed and depth < len(parts):
                needed.setdefault(folder, set()).add(parts[depth])
            elif closed and path in whole and os.path.isdir(folder):
                needed.setdefault(folder, set()).update(os.listdir(folder)[:MAX_ENTRIES])
    return [(f, tuple(sorted(needed[f]))) for f in sorted(needed, key=lambda f: (f.count("/"), f))]


def make_bridges(plan: list[Bridge]) -> None:
    """Each planned folder covered by a tmpfs (0755) in this process's mount namespace (its own:
    read_only_host_controls made it) with only its planned entries bound back in. Needs
    CAP_SYS_ADMIN: call before dropping it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    for folder, entries in plan:
        held = {}
        for name in entries:  # held open: the tmpfs hides them from their path next
            try:
                held[name] = os.open(os.path.join(folder, name), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
        try:
            _call(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"),
                  f"tmpfs over {folder}")
            for name, fd in held.items():
                point = os.path.join(folder, name)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(point)
                else:
                    os.close(os.open(point, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
                _call(libc.mount(f"/proc/self/fd/{fd}".encode(), point.encode(), None, MS_BIND | MS_REC, None),
                      f"bind {point} back")
        finally:
            for fd in held.values():
                os.close(fd)
