"""The runner's side of the control channel (testbed.node.channel is the nodes' side).

It listens on the run's control network (runtimes.control.network) and is the one writer of the
run directory for everything the nodes send:
- record rows, [table name, one CSV line], each appended to its table as it arrives: a node's
  rows up to its crash are kept, and a crash of the runner leaves every line written so far
  readable. Rows are checked first (a known table, one line of that table's column count, a
  bounded size); anything else is counted and dropped: a node's bytes never end the run or
  corrupt a table;
- messages, [b"!" + kind, payload]: a supervisor's acks and its role's state, a role's report
  (ps.json), a replica (forwarded to the coordinator), a crash request (for the timeline), the
  broker's readiness.
Only the run's nodes get in: both sockets are CURVE servers, and a client is let in only with a
key the runner made for one of its nodes (runtimes.control.channel_auth; others are refused and
counted). A message's sender is the node of the key it came with (its ZAP User-Id), never a
name in it: each node may send only what its role sends, and only for itself (the rules are
runtimes.control.hub_rules: a row, state, ack or request about another node is dropped as such), and
a worker's replica is forwarded on a topic naming it. Whatever arrives is read as untrusted
(node.untrusted's strict JSON: no NaN or Infinity, int64 at most, bounded depth; a size limit
per kind of message): what the hub cannot use is dropped and counted by reason (`drops`,
summary.json's `control_dropped`), and no message ends its thread.
Down, it publishes every BEAT seconds a heartbeat that carries the stop, each node's link delays
(taken up by its transport; repeated, so a node that subscribes late still gets them), and
requests to a node's supervisor, repeated until acknowledged.

What a node costs the hub is bounded in bytes, as no frame either way is longer than
node.channel.CHUNK (64 KiB; a longer message goes in parts, each saying the whole length):
- a frame longer than MAX_FRAME closes its connection before the hub takes it in; a message
  longer than its kind allows is dropped at its first part; a message's parts are held under
  (sender, kind) up to that kind's limit (1 MiB an ack or a put, 4 MiB the PS's report: 2 MiB a
  node, 6 MiB the PS), a replica's are forwarded as they come; UP_QUEUE frames a connection
  wait to be read (16 MiB);
- a subscriber that stops reading holds PUB_QUEUE frames: 16 MiB (and its socket's kernel
  buffer). Replicas go to the coordinator alone (the hub applies each subscription itself), and
  a replica's part waits for room in its queue (FORWARD_WAIT at most): a coordinator that reads
  holds the workers back and loses no part, one that stopped costs the hub that wait once;
- a node's subscriptions: the XPUB is manual, the hub applies each one it allows. One that starts
  no topic the hub publishes or is longer than any is refused (a subscriber's frame longer than
  MAX_SUBSCRIPTION closes its connection unread), and a node holds MAX_SUBSCRIPTIONS (64) distinct
  prefixes at most over all of its connections (`Shares`: a closed connection gives its own back).
  ZeroMQ keeps its own record of each subscription a connection sends, applied or not, until it
  unsubscribes or closes (some 50 bytes of memory a byte): the hub bounds that in length, not in number.
ZeroMQ does not bound the frames of one message (it holds them all before the hub reads the first).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import zmq

from testbed.errors import RunFailed
from testbed.kernel.files import replace_text
from testbed.kernel.netlink import entered_netns
from testbed.node import channel, untrusted
from testbed.node.channel import MESSAGE_PREFIX, topic
from testbed.records import metrics
from testbed.runtimes.control import hub_rules as rules
from testbed.runtimes.control.channel_auth import ZAP_ENDPOINT, RunKeys, answer_zap, by_supervisor, handshake_failures

MAX_REPLICA = 512 * 1024 * 1024  # bytes: a replica of the largest model a node trains
MAX_FRAME = max(channel.CHUNK, rules.MAX_ROW) + channel.CURVE_FRAMING  # bytes: the longest frame a node may send
UP_QUEUE = 256  # messages (parts) taken in from one connection before the hub has read them
MAX_REQUESTS = 1000  # nodes' requests waiting for the timeline
MAX_NODES = 10_000  # distinct names the hub keeps a state, a readiness or counters for
PUB_QUEUE = 256  # messages (parts) queued per subscriber: beats and requests repeat, a slow reader loses new ones
REPORTS = ("ps.json",)  # the files a role may have written
MAX_SLOTS = 10_000  # mailbox slots a run's measuring jobs may fill
RECEIVE_BATCH = 1000  # messages taken in a row before the hub answers handshakes and beats again
LISTEN_BACKLOG = 4096  # connections waiting to be accepted: a fleet host's thousand devices connect at once
BEAT = 0.5  # s between heartbeats (a node stops on its own after channel.HEARTBEAT_TIMEOUT without one)
RESEND = 0.2  # s between repeats of an unanswered request
FORWARD_WAIT = 0.5  # s a replica's part waits for room in the coordinator's queue (the workers wait for the hub)
MAX_TRAINERS = 100_000  # train requests waiting for the runner
MAX_SUBSCRIPTION = 1 + rules.MAX_TOPIC + channel.CURVE_FRAMING  # bytes: a subscriber's longest frame (one subscription)


class Shares:
    """The prefixes each node holds on the hub's XPUB, counted once per connection that holds it
    (ZeroMQ names a subscription's node, not its connection). A closed connection gives back what
    it held, but ZeroMQ says that without the node: each node that holds the prefix has one fewer
    (a shared prefix may be counted short, never long). An unsubscription gives nothing back: it
    may come from a connection of the node that never held the prefix while another holds it. A
    node that asked beyond its share gets no new prefix after: one refused on a connection, then
    taken on another, would be given back when the first closed, while the second holds it."""

    def __init__(self):
        self.held: dict[str, dict[bytes, int]] = {}  # node -> prefix -> its connections that hold it
        self._holders: dict[bytes, set[str]] = {}  # prefix -> the nodes that hold it
        self._beyond: set[str] = set()  # nodes that asked beyond their share

    def take(self, node: str, prefix: bytes) -> Optional[str]:
        """Why `node` may not hold `prefix` on one more connection; else None, and it holds it."""
        held = self.held.setdefault(node, {})
        why = rules.share_refused(prefix, held, node in self._beyond)
        if why:
            self._beyond.add(node)
            return why
        held[prefix] = held.get(prefix, 0) + 1
        self._holders.setdefault(prefix, set()).add(node)
        return None

    def closed(self, prefix: bytes) -> None:
        """A connection that held `prefix` (or asked for it) closed."""
        for node in list(self._holders.get(prefix, ())):
            held = self.held[node]
            held[prefix] -= 1
            if not held[prefix]:
                del held[prefix]
                self._holders[prefix].discard(node)
        if not self._holders.get(prefix, True):
            del self._holders[prefix]


class ControlHub:
    def __init__(self, netns: Optional[str], address: str, records_port: int, control_port: int, run_dir: Path,
                 keys: Optional[RunKeys] = None):
        """`keys`: the run's (its nodes admitted as they are made); a hub of its own if None."""
        self.run_dir = Path(run_dir)
        self.keys = keys or RunKeys()
        self.reports_open = False  # a command workload's: its programs report from any node (open_reports)
        self.evaluator = rules.EVALUATOR  # the role whose nodes write eval.csv
        self._slots: dict[str, set[str]] = {}  # mailbox slot -> the nodes whose jobs were given it
        self.rows = 0
        self.drops = untrusted.Drops("control hub")  # what the hub dropped, by reason
        self.node_drops: dict[str, dict[str, int]] = {}  # what each node's supervisor dropped, as it last said
        self.max_replica = MAX_REPLICA  # bytes of a replica; the runner lowers it (0: the run has none)
        self._parts = channel.Parts()  # messages coming in parts, under (sender, kind)
        self._tables: dict[bytes, metrics.CsvLog] = {}
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._acks: dict[tuple[str, int], str] = {}
        self._awaited: set[tuple[str, int]] = set()  # (node, seq) of the requests waiting for an answer
        self.states: dict[str, dict] = {}  # node -> its supervisor's last word on its role
        self.ready: set[str] = set()  # nodes that said their service is up (the broker)
        self.puts: dict[str, str] = {}  # mailbox slot -> what a measuring job put there (node.mailbox)
        self.stats: dict[str, dict] = {}  # node -> its own link counters and usage (nodes that shape their own link)
        self.stats_at: dict[str, float] = {}  # node -> when (monotonic) its last report came
        self._requests: list[dict] = []  # crash requests from the nodes, for the timeline
        self._trainers: list[str] = []  # workers whose trainers the PS asked for, for the runner
        self._delays: dict[str, bytes] = {}
        self.shares = Shares()  # what each node holds of the XPUB's subscriptions
        self._stopping = False
        self._seq = 0
        self._pub_lock = threading.Lock()
        self._ctx = zmq.Context()
        self._zap, self._pull, self._pub, self._monitors = _open_sockets(self._ctx, netns, address, records_port,
                                                                          control_port, self.keys)
        self._thread = threading.Thread(target=self._loop, name="edgebed-hub", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Messages dropped, all reasons together."""
        return sum(self.drops.values())

    # -- up: rows and messages ---------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        for sock in (self._zap, self._pull, *self._monitors):
            poller.register(sock, zmq.POLLIN)
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + BEAT
                    self._beat()
                self._subscriptions()
                ready = dict(poller.poll(50))
                if self._zap in ready:  # a handshake waits for it
                    self._authenticate()
                if self._pull in ready:
                    self._receive()
                for monitor in set(self._monitors) & set(ready):
                    for why in handshake_failures(monitor):
                        self.drops.add(why)
            except Exception as e:  # the hub's own error (a socket's), not a message's: say it, go on
                self.drops.add("hub error", f"{type(e).__name__}: {e}")
                time.sleep(0.05)

    def _authenticate(self) -> None:
        why = answer_zap(self._zap, self.keys)
        if why:
            self.drops.add(why)

    def _receive(self) -> None:
        for _ in range(RECEIVE_BATCH):
            try:
                frames = self._pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            sender = _sender(frames[0])
            why = rules.holder_refused(frames[0].bytes, by_supervisor(frames[0]), self.keys.supervised(sender))
            if why:  # a supervisor's word without its key, or its key sending what its node does
                self.drops.add(why)
            else:
                self._take([f.bytes for f in frames], sender)
            self._last = time.monotonic()

    def _take(self, frames: list[bytes], sender: str) -> None:
        """One message from node `sender` (its key's): taken, or dropped and counted by reason.
        Nothing in it ends the hub."""
        try:
            if len(frames) in (2, 3) and frames[0].startswith(MESSAGE_PREFIX):
                kind = frames[0][len(MESSAGE_PREFIX):].decode("ascii", "replace")[:20]
                why = self._message(kind, frames[1], sender) if len(frames) == 2 else \
                    self._part(kind, frames[1], frames[2], sender)
            else:
                why = self._row(frames, sender)
        except Exception as e:  # a field of the wrong type, a full disk: never the hub's end
            why = untrusted.error_reason(e)
        if why:
            self.drops.add(why)

    def _row(self, frames: list[bytes], sender: str) -> Optional[str]:
        """None once the row is in its table, else why it was dropped."""
        table = self._table(frames[0]) if len(frames) == 2 and len(frames[1]) <= rules.MAX_ROW else None
        row = rules.one_row(frames[1], len(table.columns)) if table is not None else None
        if row is None:
            return "bad row"
        if not rules.may_write(frames[0].decode("ascii"), self.keys.roles.get(sender), self.reports_open,
                               self.evaluator):
            return "row of a table not its role's"
        if "node" in table.columns and row[table.columns.index("node")] != sender:
            return "row for another node"
        table.append(frames[1])
        self.rows += 1
        return None

    def open_reports(self, evaluator: str = rules.EVALUATOR) -> None:
        """A command workload: its programs may report from any of its nodes (edgebed.report), and
        evaluations from the nodes of role `evaluator` alone (workload.eval_role)."""
        self.reports_open, self.evaluator = True, evaluator

    def grant_put(self, key: str, node: str) -> None:
        """Mailbox slot `key` was handed to a job of `node`: it may fill it (others may not)."""
        self._slots.setdefault(key, set()).add(node)

    def _table(self, name: bytes) -> Optional[metrics.CsvLog]:
        if name not in self._tables:
            text = name.decode("ascii", "replace")
            if text not in metrics.TABLES:
                return None
            self._tables[name] = metrics.open_table(self.run_dir, text)
        return self._tables[name]

    def _part(self, kind: str, header: bytes, body: bytes, sender: str) -> Optional[str]:
        """A part of a message (channel.framed): None once taken, else why it was dropped. Each
        part declares its message's length: one too long for its kind is dropped at its first
        part, and the hub holds at most that length under (sender, kind) until the last comes."""
        try:
            head = channel.part_header(header, len(body))
        except untrusted.Refused as e:
            self._parts.drop((sender, kind))
            return e.reason
        why = rules.kind_refused(kind, head[2], self.keys.roles.get(sender), self.max_replica)
        if why:
            self._parts.drop((sender, kind))
            return why
        if kind == "replica":  # its parts go on as they came: the coordinator puts them together
            return self._forward([topic("replica", sender), header, body])
        whole = self._parts.add((sender, kind), head, body)
        return None if whole is None else self._message(kind, whole, sender)

    def _message(self, kind: str, payload: bytes, sender: str) -> Optional[str]:
        """None once taken, else why it was dropped."""
        role = self.keys.roles.get(sender)
        why = rules.kind_refused(kind, len(payload), role, self.max_replica)
        if why:
            return why
        if kind == "replica":  # bytes for the coordinator, as they came, named by the key they came with
            return self._forward([topic("replica", sender), payload])
        data = untrusted.loads(payload, max_bytes=rules.KIND_LIMITS[kind])
        if not isinstance(data, dict):
            return f"{kind} not a mapping"
        why = rules.claim_refused(kind, data, sender, role, self._slots)
        if why:
            return why
        handler = {"ack": self._on_ack, "state": self._on_state, "report": self._on_report,
                   "request": self._on_request, "ready": self._on_ready, "stats": self._on_stats,
                   "put": self._on_put}[kind]
        return None if handler(data) else f"bad {kind}"

    def _on_ack(self, data: dict) -> bool:
        node, seq, detail = data.get("node"), data.get("seq"), data.get("detail", "")
        if not rules.is_name(node) or type(seq) is not int or type(detail) is not str:
            return False
        with self._cond:
            if (node, seq) in self._awaited:  # a repeat's answer, or one no request asked for, is not kept
                self._acks[(node, seq)] = detail
                self._cond.notify_all()
        self._note_node_drops(node, data.get("dropped"))
        return True

    def _on_state(self, data: dict) -> bool:
        code, node = data.get("exitcode"), data.get("node")
        if not rules.is_name(node) or type(data.get("gen")) is not int or type(data.get("running")) is not bool or \
                not (code is None or type(code) is int) or not self._room(self.states, node):
            return False  # the runner's view of a role is built on these (runtimes.docker.nodes.RoleProcess)
        with self._cond:
            before = self.states.get(node)
            # the generation before's end, kept past the next's start (a per-round trainer's device
            # starts the next at once: its last exit code must not read as "superseded")
            ended = [before["gen"], before["exitcode"]] if before and not before["running"] else \
                before.get("ended") if before else None
            self.states[node] = {**data, "ended": ended}  # the hub's word, never the node's
            self._cond.notify_all()
        self._note_node_drops(node, data.get("dropped"))
        return True

    def _note_node_drops(self, node: str, counts) -> None:
        """A supervisor's own count of the requests it dropped (cumulative), if well formed."""
        if isinstance(counts, dict) and len(counts) <= 16 and self._room(self.node_drops, node) and all(
                type(k) is str and len(k) <= 60 and type(v) is int and v >= 0 for k, v in counts.items()):
            self.node_drops[node] = counts

    @staticmethod
    def _room(table: dict, name: str) -> bool:
        """Whether `table` may hold `name` (a forger cannot grow it without bound)."""
        return name in table or len(table) < MAX_NODES

    def _on_report(self, data: dict) -> bool:
        if data.get("name") not in REPORTS:
            return False
        replace_text(self.run_dir / data["name"], json.dumps(data.get("data"), default=str))  # never through a link
        return True

    def _on_request(self, data: dict) -> bool:
        """(the timeline checks what it asks for: timeline.request_change; the runner, a train
        request's node: run.trainers)"""
        with self._cond:
            if data.get("action") == rules.TRAIN:
                if len(self._trainers) >= MAX_TRAINERS:
                    return False
                self._trainers.append(data["node"])
                return True
            if len(self._requests) >= MAX_REQUESTS:
                return False
            self._requests.append(data)
        return True

    def _on_ready(self, data: dict) -> bool:
        node = data.get("node")
        if not rules.is_name(node) or not (node in self.ready or len(self.ready) < MAX_NODES):
            return False
        with self._cond:
            self.ready.add(node)
        return True

    def _on_put(self, data: dict) -> bool:
        key, text = data.get("key"), data.get("data")
        if not rules.is_name(key) or type(text) is not str or (key not in self.puts and len(self.puts) >= MAX_SLOTS):
            return False
        with self._cond:
            self.puts[key] = text
            self._cond.notify_all()
        self._publish(topic("put", key), b"")  # a job waiting for this flag (it is repeated with each beat)
        return True

    def _on_stats(self, data: dict) -> bool:
        node, values = data.get("node"), [v for k, v in data.items() if k != "node"]
        if not rules.is_name(node) or not self._room(self.stats, node) or \
                not all(v is None or type(v) in (int, float) for v in values):
            return False  # counters go into traffic.csv and resources.csv as numbers
        with self._cond:
            self.stats[node] = data
            self.stats_at[node] = time.monotonic()
        return True

    def wait_put(self, key: str, timeout: float) -> bool:
        """Whether a job's put into slot `key` has arrived within `timeout` seconds. A job that
        ended has sent its put, but this hub's thread may not have read it yet (a loaded host)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self.puts and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            return key in self.puts

    def take_requests(self) -> list[dict]:
        """The nodes' crash requests since the last call, oldest first."""
        with self._cond:
            out, self._requests = self._requests, []
        return out

    def take_trainers(self) -> list[str]:
        """The workers whose trainers the PS asked for since the last call, oldest first."""
        with self._cond:
            out, self._trainers = self._trainers, []
        return out

    def drain(self, quiet: float = 0.5, limit: float = 10.0) -> None:
        """Wait until nothing has arrived for `quiet` seconds (at most `limit`): the nodes' last rows
        are in before the runner reads the tables."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and time.monotonic() - self._last < quiet:
            time.sleep(0.05)

    # -- down: beats, delays, requests -----------------------------------------------------
    def _publish(self, t: bytes, payload: bytes) -> None:
        """`payload` on topic `t`: in parts if it is longer than channel.CHUNK."""
        for frames in channel.framed(t, payload):
            self._send(frames)

    def _send(self, frames: list, wait: bool = False) -> bool:
        """Whether `frames` went to every subscriber of their topic: without `wait` a subscriber
        whose queue is full loses them (True all the same); with it they go to none then (False)."""
        with self._pub_lock:
            if self._pub.closed:  # closed by close() while another thread still asked
                raise RunFailed("the control channel is closed: the run has ended")
            if not wait:
                self._pub.send_multipart(frames)  # (a lossy XPUB never blocks)
                return True
            self._pub.setsockopt(zmq.XPUB_NODROP, 1)
            try:
                self._pub.send_multipart(frames, flags=zmq.DONTWAIT)
            except zmq.Again:
                return False
            finally:
                self._pub.setsockopt(zmq.XPUB_NODROP, 0)
        return True

    def _forward(self, frames: list) -> Optional[str]:
        """A replica, or a part of one, on to the coordinator: it waits for room in the
        coordinator's queue up to FORWARD_WAIT (a coordinator that reads holds the hub, and so the
        workers, back: no part is lost), then goes to those with room (one that stopped reading
        costs the hub that wait once, and no memory). None once every subscriber has it, else why not."""
        deadline = time.monotonic() + FORWARD_WAIT
        while not self._send(frames, wait=True):
            if time.monotonic() >= deadline:
                self._send(frames)
                return "replica part lost by a subscriber behind"
            time.sleep(0.001)
        return None

    def _subscriptions(self) -> None:
        """The subscriptions that came, each applied as runtimes.control.hub_rules says (ZeroMQ applies
        none by itself: the XPUB is manual): a node hears what it subscribes to, within its share,
        and replicas only the coordinator; what is refused is counted. At most RECEIVE_BATCH a
        pass: a flood of subscriptions holds the hub's loop no longer than a flood of rows."""
        with self._pub_lock:
            for _ in range(RECEIVE_BATCH):
                if self._pub.closed or not self._pub.poll(0):
                    return
                frame = self._pub.recv(zmq.NOBLOCK, copy=False)
                data = frame.bytes
                if data and data[0] in (0, 1):
                    why = self._subscription(data[0] == 1, data[1:], _sender(frame))
                    if why:
                        self.drops.add(why)

    def _subscription(self, subscribe: bool, prefix: bytes, sender: str) -> Optional[str]:
        """A (un)subscription, just read: ZeroMQ applies setsockopt to the connection of the last
        one read. None once applied, else why not."""
        if not sender:  # a closed connection's, said by ZeroMQ (which took it out itself)
            if not subscribe:
                self.shares.closed(prefix)
            return None
        allowed = rules.subscriptions(prefix, self.keys.roles.get(sender))
        if not subscribe:
            for p in allowed:
                self._pub.setsockopt(zmq.UNSUBSCRIBE, p)
            return None
        not_replicas = None if allowed == [prefix] else "subscription to replicas, not the coordinator's"
        why = rules.subscription_refused(prefix) or (None if allowed else not_replicas) or \
            self.shares.take(sender, prefix)
        if why:
            return why
        for p in allowed:
            self._pub.setsockopt(zmq.SUBSCRIBE, p)
        return not_replicas

    def _beat(self) -> None:
        self._publish(topic("beat"), json.dumps({"stop": self._stopping}).encode())
        for node, payload in list(self._delays.items()):
            self._publish(topic("delay", node), payload)
        for key in list(self.puts):  # a job that subscribed after the slot was filled
            self._publish(topic("put", key), b"")

    def set_stop(self) -> None:
        """Tell every node to stop (now, and in every beat after)."""
        self._stopping = True
        self._beat()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def set_delay(self, node: str, delays: dict) -> None:
        """A node's transport delays from now on (runtimes.live, where the kernel has no netem)."""
        self._delays[node] = json.dumps(delays).encode()
        self._publish(topic("delay", node), self._delays[node])

    def request(self, node: str, req: dict, timeout: float = 10.0,
                gone: Callable[[], Optional[str]] = lambda: None) -> str:
        """Hand a request to a node's supervisor (testbed.node.supervisor.RoleSupervisor); its answer.
        Repeated until answered: a supervisor that subscribes late still gets it, and answers a
        repeat it has already acted on without acting again. `gone` says why no answer can come
        (the node's container ended), or None."""
        answers, why = self._exchange([node], req, timeout, gone)
        detail = answers[node]
        if detail is None and why:
            raise RunFailed(f"{node}: no answer to a {req['op']} request: {why}")
        if detail is None:
            raise RunFailed(f"{node}: its container did not answer a {req['op']} request in {timeout:.0f} s")
        if detail.startswith("failed:"):
            raise RunFailed(f"{node}: {detail}")
        return detail

    def ask_all(self, nodes: list[str], req: dict, timeout: float = 1.0) -> dict[str, Optional[str]]:
        """The same request to many nodes at once (each numbered, repeated until answered); each
        node's answer, None where none came within `timeout` (a node that is gone is no error)."""
        return self._exchange(nodes, req, timeout)[0]

    def _exchange(self, nodes: list[str], req: dict, timeout: float,
                  gone: Callable[[], Optional[str]] = lambda: None) -> tuple[dict[str, Optional[str]], Optional[str]]:
        """Each node's answer to `req` (numbered per node, published again every RESEND until
        answered), None where none came within `timeout`; and why the wait ended early, if `gone`
        said (it is asked before each send, outside the lock: it may ask an engine)."""
        with self._cond:
            seqs = {}
            for node in nodes:
                self._seq += 1
                seqs[node] = self._seq
            self._awaited.update(seqs.items())
        deadline = time.monotonic() + timeout
        next_send, why, waiting = 0.0, None, list(nodes)
        with self._cond:
            while True:
                waiting = [n for n in waiting if (n, seqs[n]) not in self._acks]  # each wake: those left
                now = time.monotonic()
                if self._stop.is_set():  # closing: no answer will be read
                    why = why or "the run has ended"
                if not waiting or now > deadline or why:
                    break
                if now >= next_send:
                    self._cond.release()
                    try:
                        why = gone()
                        for n in waiting:
                            self._publish(topic("node", n), json.dumps({**req, "seq": seqs[n]}).encode())
                    finally:
                        self._cond.acquire()
                    next_send = now + RESEND
                    continue  # an answer may have come meanwhile
                self._cond.wait(max(0.0, min(next_send, deadline) - time.monotonic()))
            self._awaited.difference_update(seqs.items())
            return {n: self._acks.pop((n, seqs[n]), None) for n in nodes}, why

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with self._cond:  # a request waiting for an answer ends now
            self._cond.notify_all()
        self._thread.join(timeout=5)
        with self._pub_lock:
            self._pub.close(linger=0)
        for sock in (*self._monitors, self._pull, self._zap):
            sock.close(linger=0)
        self._ctx.term()
        for t in self._tables.values():
            t.close()


def _open_sockets(ctx: zmq.Context, netns: Optional[str], address: str, records_port: int, control_port: int,
                  keys: RunKeys) -> tuple[zmq.Socket, zmq.Socket, zmq.Socket, list[zmq.Socket]]:
    """The hub's sockets: its ZAP handler's (answered before anyone can connect), then its two
    listening sockets, made inside the control network, CURVE servers with the run's hub key:
    PULL (up: rows and messages, a frame of MAX_FRAME at most, UP_QUEUE of them per connection)
    and XPUB (down: PUB_QUEUE messages, each a frame of channel.CHUNK at most, per subscriber);
    and a monitor of each (failed handshakes)."""
    zap = ctx.socket(zmq.REP)
    zap.setsockopt(zmq.LINGER, 0)
    zap.bind(ZAP_ENDPOINT)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)  # a sender of a longer frame is disconnected, the frame unread
    pull.setsockopt(zmq.RCVHWM, UP_QUEUE)
    pull.setsockopt(zmq.LINGER, 0)
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.XPUB_MANUAL, 1)  # the hub applies each subscription it allows (_subscriptions)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, PUB_QUEUE)  # a subscriber that stops reading loses messages, the hub no memory
    pub.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION)  # a longer subscription closes its connection unread
    monitors = []
    for sock in (pull, pub):
        sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
        keys.serve(sock)
        monitors.append(sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL))
    with entered_netns(netns):
        pull.bind(f"tcp://{address}:{records_port}")
        pub.bind(f"tcp://{address}:{control_port}")
    return zap, pull, pub, monitors


def _sender(frame: zmq.Frame) -> str:
    """The node a message came from: the User-Id its connection's key got from ZAP."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return ""


def parsed_answer(answer: Optional[str]):
    """A node's JSON answer to a request (ask_all's, request's); None where none came or it is
    not strict JSON (node.untrusted)."""
    try:
        return untrusted.loads(answer) if answer else None
    except untrusted.Refused:
        return None
