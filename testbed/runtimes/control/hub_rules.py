"""What a node may send the runner's hub (runtimes.control.hub): the rules, apart from the sockets.

A message's sender is the node of the key it came with, never a name in it (runtimes.control.hub). Each
node may send only what its role sends, and only for itself: a row of a table its role writes,
naming itself; a message of a kind its role sends, of at most that kind's size, about itself;
a request for its own drawn crash; the PS alone asks for a worker's trainer. It subscribes to
starts of the topics the hub publishes, MAX_SUBSCRIPTIONS at most. Every function here is pure:
it says why something is refused (or that it is not), and the hub counts the reason.
"""

from __future__ import annotations

import csv
from typing import Collection, Optional

from testbed.node.channel import MESSAGE_PREFIX, topic

MAX_ROW = 64 * 1024  # bytes; a record row is a few hundred
# The largest message of each kind (a replica's limit is the hub's max_replica): a larger one is
# dropped at its first part (node.channel.framed: each part says the whole length). A node's
# answer carries its kernel probe or counters; a report is ps.json.
KIND_LIMITS = {"ack": 1 << 20, "state": 16 * 1024, "report": 4 << 20, "request": 16 * 1024,
               "ready": 1024, "stats": 16 * 1024, "put": 1 << 20}
MAX_NAME = 256  # characters of a node's name, a slot's key

# What a node may send, by its role (a site's router on swarm: only what every supervisor sends).
# A table's rows come from these roles only, and a table with a node column only with the
# sender's name in it; traffic.csv and resources.csv are the runner's own. A command workload's
# programs report steps and metrics from any node (`edgebed.report`: ControlHub.open_reports), and
# evaluations from the role the scenario names (workload.eval_role) alone.
TABLE_ROLES: dict[str, tuple[str, ...]] = {
    "steps.csv": ("worker",), "stream.csv": ("worker",), "buffer.csv": ("worker",), "peers.csv": ("worker",),
    "eval.csv": ("evaluator",), "server.csv": ("ps",), "rounds.csv": ("ps",), "events.csv": ("ps",), "report.csv": (),
    "traffic.csv": (), "resources.csv": (), "shaping.csv": ()}
REPORT_TABLES = ("steps.csv", "report.csv")  # what edgebed.report writes from any of a command workload's nodes
EVALUATOR = "evaluator"  # the role whose rows eval.csv holds (a command workload may name another)
REPORT_ROLES = ("ps", "worker", "evaluator")  # the nodes that run a command workload's programs
KIND_ROLES = {"report": ("ps",), "replica": ("worker",), "ready": ("broker", "producer")}  # others: any node
SELF_KINDS = ("ack", "state", "stats", "ready", "request")  # their "node" is the sender's own name
# A supervisor's word on its node (acks, with the counters it read; its role's state; its link's
# and cgroup's counters): from a node run under a supervisor, only with the supervisor's own key.
SUPERVISOR_KINDS = ("ack", "state", "stats")
SUPERVISOR_SENDS = (*SUPERVISOR_KINDS, "put")  # all a supervisor's key sends (a job's end: put)
CRASH_ACTIONS = ("pause", "kill")  # all a node may ask of the timeline: its own drawn crash
TRAIN = "train"  # the PS's one request about another node: start a worker's per-round trainer
REPLICA_TOPICS = b"replica:"  # what every replica's topic starts with (node.channel.topic)
OTHER_TOPICS = (b"beat:", b"node:", b"delay:", b"put:")  # what every other topic starts with
BEAT = topic("beat")  # the one topic without a name; every other is its kind's start, a name, a NUL
# bytes of the longest topic the hub publishes: a kind's start and a name of MAX_NAME characters
# (4 bytes at most each in UTF-8), then its NUL
MAX_TOPIC = len(REPLICA_TOPICS) + 4 * MAX_NAME + 1
MAX_SUBSCRIPTIONS = 64  # distinct prefixes a node holds; its code takes beat, node:, delay:, replica:, a put: per job


def may_write(table: str, role: Optional[str], reports_open: bool, evaluator: str = EVALUATOR) -> bool:
    """Whether a node of `role` may add rows to `table` (a known table's name); eval.csv's come
    from the `evaluator` role alone."""
    if table == "eval.csv":
        return role == evaluator
    return role in TABLE_ROLES[table] or (reports_open and table in REPORT_TABLES and role in REPORT_ROLES)


def holder_refused(head: bytes, by_supervisor: bool, supervised: bool) -> Optional[str]:
    """Why a message whose first frame is `head` (a table's name, or "!" and a kind) is dropped for
    the key it came with: a supervisor's (`by_supervisor`), or the node's own, of a node that has a
    supervisor's key (`supervised`); else None."""
    prefix = len(MESSAGE_PREFIX)
    kind = head[prefix:prefix + 20].decode("ascii", "replace") if head.startswith(MESSAGE_PREFIX) else None
    if by_supervisor and kind not in SUPERVISOR_SENDS:
        return "beyond what a supervisor sends"
    if supervised and not by_supervisor and kind in SUPERVISOR_KINDS:
        return f"{kind} not with its supervisor's key"
    return None


def subscriptions(prefix: bytes, role: Optional[str]) -> list[bytes]:
    """What a node of `role` that subscribes to `prefix` is subscribed to: that prefix, but for
    the replicas, which go to the coordinator (on the PS's node) alone (the hub holds their parts
    back for its queue, and for no other's): a prefix of every topic ("") is all the other
    kinds', a replica's topic none."""
    if role == "ps" or not (prefix.startswith(REPLICA_TOPICS) or REPLICA_TOPICS.startswith(prefix)):
        return [prefix]
    return [kind for kind in OTHER_TOPICS if kind.startswith(prefix)]


def subscription_refused(prefix: bytes) -> Optional[str]:
    """Why a subscription to `prefix` is applied for no node: it starts no topic the hub
    publishes (node.channel.topic: a kind's start, a name, a NUL; "beat:" has no name); else None."""
    if len(prefix) > MAX_TOPIC:
        return "subscription longer than any topic"
    for start in (REPLICA_TOPICS, *OTHER_TOPICS):
        if start.startswith(prefix):  # a kind's start, or less of it ("": every topic)
            return None
        if prefix.startswith(start):
            name = prefix[len(start):].removesuffix(b"\0")
            if start + b"\0" == BEAT:
                return None if prefix == BEAT else "subscription to no topic"
            return None if name and b"\0" not in name and len(name) <= 4 * MAX_NAME else "subscription to no topic"
    return "subscription to no topic"


def share_refused(prefix: bytes, held: Collection[bytes], beyond: bool) -> Optional[str]:
    """Why a node that holds the prefixes `held` may not hold `prefix` too: it would be one more
    than MAX_SUBSCRIPTIONS, or the node asked beyond them before (`beyond`) and gets no new one;
    else None. A prefix it holds it may take again (on another of its connections)."""
    if prefix in held or not (beyond or len(held) >= MAX_SUBSCRIPTIONS):
        return None
    return "subscription beyond a node's share"


def kind_refused(kind: str, size: int, role: Optional[str], max_replica: int) -> Optional[str]:
    """Why a message of `kind` and `size` bytes from a node of `role` is dropped unread; else None."""
    limit = max_replica if kind == "replica" else KIND_LIMITS.get(kind)
    if limit is None:
        return "unknown kind"
    if size > limit:
        return f"{kind} too large"
    if kind in KIND_ROLES and role not in KIND_ROLES[kind]:
        return f"{kind} not its role's"
    return None


def claim_refused(kind: str, data: dict, sender: str, role: Optional[str],
                  slots: dict[str, set[str]]) -> Optional[str]:
    """Why a message speaks for another than its sender, or asks more than a node may; else None.
    `slots`: each mailbox slot's key -> the nodes it was given to."""
    if kind == "request" and data.get("action") == TRAIN:
        if role != "ps" or data.get("fields", {}) != {} or not is_name(data.get("node")):
            return "a train request not the PS's"
        return None
    if kind in SELF_KINDS and data.get("node") != sender:
        return f"{kind} for another node"
    if kind == "request" and (data.get("action") not in CRASH_ACTIONS or data.get("fields", {}) != {}):
        return "request beyond a node's own crash"
    if kind == "put" and sender not in slots.get(str(data.get("key")), ()):
        return "put into a slot not given to it"
    return None


def is_name(value) -> bool:
    """A node's name or a slot's key as the hub keeps it: a short string."""
    return type(value) is str and 0 < len(value) <= MAX_NAME


def one_row(line: bytes, columns: int) -> Optional[list[str]]:
    """The row's fields if `line` is one CSV row of `columns` fields, else None."""
    if not line.endswith(b"\n") or (line.count(b"\n") != 1 and b'"' not in line):
        return None  # a newline inside a row only within a quoted field (csv decides below)
    try:
        rows = list(csv.reader([line.decode()]))
    except (UnicodeDecodeError, csv.Error):
        return None
    return rows[0] if len(rows) == 1 and len(rows[0]) == columns else None
