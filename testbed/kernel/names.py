"""The exact shapes of the names edgebed makes, to check every name it reads back before use.

A run id, a namespace, a cgroup folder or a label read from a state file, an engine or a
directory listing may have been planted: it becomes a path, a cgroup, a netns or a kill only
once it has the shape edgebed itself gives such names (Mininet's cleanup matches only its own
naming scheme). A name of another shape is skipped with one line on stderr, never used.
"""

from __future__ import annotations

import re
import sys
from typing import Optional

# secrets.token_hex(3): run/runner.py and bench/harness.py make every run id so
RUN_ID = r"[0-9a-f]{6}"
# a node (ps, eval, broker, producer, <group><i>: a group is [a-z][a-z0-9]{0,5}, i < 10000) or a site
NODE = r"[a-z][a-z0-9]{0,15}"
SHAPES = {
    "run id": re.compile(rf"(?P<run>{RUN_ID})"),
    "node": re.compile(NODE),
    # eb-<run>-<node> (netns.netns_name), eb-<run>-ctl (control_net), eb-<run>-sw[-<site>], eb-<run>-rt-<site> (fabric)
    "netns": re.compile(rf"eb-(?P<run>{RUN_ID})-(?:(?:sw|rt)-)?{NODE}"),
    # eb<run><index:04x><x|y> (state.temp_link_name; :03x in older names): a veth end left in the
    # root namespace by an older edgebed, which made veths there and moved them
    "veth": re.compile(rf"eb(?P<run>{RUN_ID})[0-9a-f]{{3,4}}[xy]"),
    # <euid>@<hostname>: whose run an engine's labels say it is
    "owner": re.compile(r"(?P<uid>[0-9]{1,10})@(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252})"),
    # <pid>:<start in clock ticks since boot>: the runner, as a state file's runner_pid and runner_start
    "runner": re.compile(r"(?P<pid>[1-9][0-9]{0,6}):(?P<start>[0-9]{1,20})"),
}
MAX_PID = 2 ** 22  # the kernel's largest pid_max


def shaped(kind: str, value: object) -> Optional[re.Match]:
    """The match of `value` against the whole shape of `kind`, None when it is not a str of it."""
    return SHAPES[kind].fullmatch(value) if isinstance(value, str) else None


def of_run(kind: str, value: object, run_id: str) -> bool:
    """Whether `value` has the shape of `kind` and names run `run_id` (a netns, a veth end)."""
    m = shaped(kind, value)
    return m is not None and m.group("run") == run_id


def warn_skipped(kind: str, value: object, source: str, why: str = "") -> None:
    """One line on stderr: a name read from `source` was skipped (quoted short and escaped: it
    may be anything, terminal escapes included)."""
    shown = ascii(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    print(f"edgebed: skipped {kind} {shown} from {ascii(source)[1:-1]}: {why or 'not the shape edgebed gives one'}",
          file=sys.stderr)


def checked(kind: str, value: object, source: str) -> Optional[str]:
    """`value` when it has the shape of `kind`; otherwise None, said in one line."""
    if shaped(kind, value):
        return value  # type: ignore[return-value]
    warn_skipped(kind, value, source)
    return None


def checked_pid(value: object, source: str) -> Optional[int]:
    """A pid read back (an int in 1..MAX_PID): never 0 or -1, which `kill` reads as a group or everyone."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_PID:
        return value
    warn_skipped("pid", value, source)
    return None
