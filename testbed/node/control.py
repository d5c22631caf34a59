"""The control channel's requests and replies, typed: what the runner asks a node's supervisor
(testbed.node.supervisor.RoleSupervisor) and what it answers.

A request is one dataclass per operation, named on the wire by its `op`; `parse_request` reads
one from what arrived (already JSON, read with node.untrusted's checks), strictly: an unknown
op, a missing or unknown field, or a field of the wrong type is `untrusted.Refused`, never a
KeyError in a handler. The runner builds the same dataclasses and sends `to_wire()`, so both
ends share one definition. A reply is `Reply(ok, detail, error)`; on the wire (the "ack"
message) a failed reply's `detail` is "failed: ERROR", so a hub that reads only
`detail` still sees the failure.

    wire down   {"op": "stress", "load": 0.5, "seq": 7}
    wire up     {"node": "w0", "seq": 7, "ok": true, "detail": "stress 0.5 cores in 1 process(es) (was 0)"}
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Optional, Union

from testbed.node.untrusted import Refused

FAILED = "failed: "  # a failed reply's detail starts so (runtimes.control.hub raises on it)


@dataclass(frozen=True)
class Request:
    """Base of every request: `op` names it on the wire."""

    op: ClassVar[str] = ""

    def to_wire(self) -> dict:
        """The mapping the hub numbers and sends (its `seq` is added there)."""
        return {"op": self.op, **asdict(self)}


@dataclass(frozen=True)
class Go(Request):
    """The first request: start the role with its RoleConfig (as a mapping) and background stress,
    or, with idle, only host `exec` jobs until the run's stop."""

    op = "go"
    cfg: Optional[dict] = None
    stress: list[float] = field(default_factory=list)
    gen: Optional[int] = None
    cpuset: Optional[str] = None  # a runtime without a cpuset of its own (swarm): the role's CPUs
    idle: bool = False


@dataclass(frozen=True)
class Start(Go):
    """Start the role again after a kill (a restart)."""

    op = "start"


@dataclass(frozen=True)
class Kill(Request):
    op = "kill"


@dataclass(frozen=True)
class Pause(Request):
    op = "pause"


@dataclass(frozen=True)
class Resume(Request):
    op = "resume"


@dataclass(frozen=True)
class Stress(Request):
    op = "stress"
    load: float


@dataclass(frozen=True)
class Exec(Request):
    """Run `module:function` with kwargs; its exit code goes into the mailbox slot `done`."""

    op = "exec"
    target: str
    kwargs: dict
    done: str


@dataclass(frozen=True)
class Counters(Request):
    op = "counters"


@dataclass(frozen=True)
class Clock(Request):
    op = "clock"


@dataclass(frozen=True)
class Kernel(Request):
    op = "kernel"


@dataclass(frozen=True)
class Shape(Request):
    """Shape the node's own link (node.own_link): plans as mappings (kernel.shaping.DirectionPlan)."""

    op = "shape"
    address: str
    uplink: dict
    downlink: dict
    routes: Optional[dict] = None


@dataclass(frozen=True)
class Reshape(Request):
    op = "reshape"
    which: str
    old: dict
    new: dict


@dataclass(frozen=True)
class Replay(Request):
    """Replay link traces on the node's own link from run time `t0` (wall clock): per direction,
    its rates per tick (node.trace_replay.schedules_to_wire)."""

    op = "replay"
    schedules: dict
    t0: float


@dataclass(frozen=True)
class Cut(Request):
    """Drop the traffic to and from `addresses` (cut) or let it through again; `everyone`: with
    every address but the runner's path (a device gone offline, cut from the whole cluster: a
    few filters, not two for each of thousands of peers; node.own_link), `addresses` unused."""

    op = "cut"
    addresses: list[str]
    cut: bool
    everyone: bool = False


@dataclass(frozen=True)
class Route(Request):
    """Make the node a site's router (node.own_router)."""

    op = "route"
    lan: str
    wan: list
    routes: dict


@dataclass(frozen=True)
class ReshapeWan(Request):
    op = "reshape_wan"
    peer: str
    old: dict
    new: dict


@dataclass(frozen=True)
class WanCounters(Request):
    op = "wan_counters"


REQUESTS: dict[str, type[Request]] = {cls.op: cls for cls in (
    Go, Start, Kill, Pause, Resume, Stress, Exec, Counters, Clock, Kernel, Shape, Reshape, Cut, Route, ReshapeWan,
    WanCounters, Replay)}


def _fits(value: Any, kind: Any) -> bool:
    """Whether a JSON value is of a field's declared type (str, int, float, bool, dict, list,
    list[X], Optional[X]); a bool is no number, an int is a float."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union:
        return any(_fits(value, a) for a in args)
    if kind is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if kind is float:
        return type(value) in (int, float)
    if kind in (int, str, bool, dict, list):
        return type(value) is kind
    return False


def parse_request(data: dict) -> Request:
    """The request in a mapping from the channel (without its seq), or Refused saying why."""
    cls = REQUESTS.get(data.get("op"))  # type: ignore[arg-type]
    if cls is None:
        raise Refused(f"unknown request {data.get('op')!r}"[:120])
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    extra = sorted(set(data) - names - {"op"})
    if extra:
        raise Refused(f"{cls.op}: unknown field {extra[0]!r}"[:120])
    for f in fields(cls):
        if f.name in data and not _fits(data[f.name], hints[f.name]):
            raise Refused(f"{cls.op}: {f.name} is not {getattr(hints[f.name], '__name__', hints[f.name])}"[:120])
    try:
        return cls(**{k: v for k, v in data.items() if k != "op"})
    except TypeError:  # a required field left out
        missing = [f.name for f in fields(cls) if f.name not in data]
        raise Refused(f"{cls.op}: {missing[0] if missing else 'a field'} missing") from None


@dataclass(frozen=True)
class Reply:
    """A supervisor's answer: ok with a detail (text, or JSON for counters/kernel), or an error."""

    ok: bool
    detail: str = ""
    error: str = ""

    @classmethod
    def failed(cls, error: str) -> "Reply":
        return cls(False, error=error[:600])

    def to_wire(self) -> dict:
        """The ack's fields: a failure's detail says so too (runtimes.control.hub reads `detail`)."""
        if self.ok:
            return {"ok": True, "detail": self.detail}
        return {"ok": False, "detail": FAILED + self.error, "error": self.error}

    @classmethod
    def from_wire(cls, data: dict) -> "Reply":
        detail = data.get("detail", "")
        if data.get("ok") is False or (isinstance(detail, str) and detail.startswith(FAILED)):
            error = data.get("error")
            return cls.failed(error if isinstance(error, str) else str(detail)[len(FAILED):])
        return cls(True, detail=str(detail))
