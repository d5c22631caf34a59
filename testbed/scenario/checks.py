"""What only the whole scenario can tell (cross-checks between fields), and every problem as
one line naming its field: `ScenarioError`, pydantic's errors reworded, `validate_schema`."""

from __future__ import annotations

import ipaddress
from importlib.metadata import entry_points
from typing import Any, Iterable, Optional

from pydantic import ValidationError

from testbed.errors import BadInput
from testbed.scenario.devices.catalog import catalog, unknown_device_line
from testbed.scenario.document import Scenario
from testbed.scenario.profiles import Profile, cpu_quota_problem
from testbed.scenario.safe_yaml import excerpt
from testbed.scenario.streaming import split_host_port
from testbed.scenario.trace_checks import event_trace_problems, trace_problems

# In all groups together: what names and veth indices take. What a machine can hold is less, and
# preflight says so (runtimes/preflight.py: memory and open files); one bridge's 1,023 ports
# bound the docker and swarm runtimes (kernel/bridges.py), the netns runtime makes a tree.
MAX_WORKERS = 10_000
FIXED_SPLIT_DATASETS = ("mnist", "fashion_mnist", "idx", "cifar10")


class ScenarioError(BadInput):
    """Invalid scenario. `lines` holds one 'field.path: message' line per problem."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


def _fmt_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic adds the union member's type name ('str', 'Profile', 'function-before[...]') to loc.
            if part in ("str", "Profile", "int", "list[int]") or "[" in str(part) or part.startswith("function"):
                continue
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fmt_msg(err: dict) -> str:
    msg = err.get("msg", "")
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "literal_error":
        return f"{excerpt(err.get('input'))} is not one of the allowed values ({msg.split('Input should be ')[-1]})"
    return msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE - 3] + "..."  # never echo much of the input


MAX_MESSAGE = 200


def _errors_to_lines(e: ValidationError) -> list[str]:
    lines: list[str] = []
    seen = set()
    for err in e.errors():
        line = f"{_fmt_loc(tuple(err['loc']))}: {_fmt_msg(err)}"
        # A union field (profile: str | Profile) fails once per member; the str member's
        # complaint ("Input should be a valid string") is noise when the dict was meant.
        if "Input should be a valid string" in line or "Input should be a valid integer" in line and "gpus" in line:
            continue
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines or [str(e)]


def _external_broker_problems(sc: Scenario) -> list[str]:
    """The nodes reach an external broker at the run's gateway address only (the relay's)."""
    broker = sc.streaming.broker if sc.streaming is not None else None
    if broker is None or broker.kind != "external":
        return []
    gateway = str(next(ipaddress.IPv4Network(sc.network.subnet).hosts()))
    host, port = split_host_port(broker.bootstrap)
    if host != gateway:
        return [f"streaming.broker.bootstrap: the nodes reach an external broker at the run's gateway, "
                f"{gateway}:{port} (relayed to upstream {excerpt(broker.upstream)}), not at {excerpt(host)}"]
    return []


def _cross_checks(sc: Scenario) -> list[str]:
    """What no single field can tell, one line per problem, in the order a reader meets the fields."""
    refs = profile_refs(sc)
    lines = _streaming_problems(sc)
    lines += _reference_problems(sc, refs)
    lines += _event_problems(sc, sc.node_names())
    lines += _worker_problems(sc)
    lines += _algorithm_problems(sc)
    lines += _placement_problems(sc) + _runtime_name_problems(sc)
    if sc.workload.test_size is not None and sc.workload.dataset.split(":")[0] in FIXED_SPLIT_DATASETS:
        lines.append(f"workload.test_size: dataset '{sc.workload.dataset}' comes with its own test split")
    return (lines + _jitter_problems(sc, refs) + trace_problems(sc, refs) + _device_problems(sc, refs)
            + _dilation_problems(sc))


def _dilation_problems(sc: Scenario) -> list[str]:
    """What a dilated run cannot slow down: a command workload's own clocks (its timeouts, its
    round deadlines, its rates) run on the wall."""
    if sc.dilation != 1 and sc.workload.command is not None:
        return ["dilation: a command workload's programs keep their own clocks, which edgebed cannot slow "
                "down: give dilation 1 (or leave it out)"]
    return []


def _device_problems(sc: Scenario, refs: list[tuple[str, Any]]) -> list[str]:
    """`device:` names a catalog entry (edgebed's, a plugin's or the scenario's `devices:`); the
    scenario's own entries do not shadow the catalog's."""
    try:
        known = catalog()
    except ValueError as e:  # a plugin's entries
        return [str(e)]
    lines = [f"devices.{n}: a device of that name is in the catalog already; give yours another name"
             for n in sc.devices or {} if n in known]
    known = {**known, **(sc.devices or {})}
    checked = [(f"profiles.{n}", p) for n, p in sc.profiles.items()]
    checked += [(w, ref) for w, ref in refs if isinstance(ref, Profile)]
    for where, prof in checked:
        if prof.device is not None and prof.device not in known:
            lines.append(unknown_device_line(f"{where}.device", prof.device, known))
    return lines


def apply_devices(sc: Scenario) -> Scenario:
    """A device's memory becomes its profiles' memory limit unless they set one."""
    known = {**catalog(), **(sc.devices or {})}
    profiles = list(sc.profiles.values()) + [ref for _, ref in profile_refs(sc) if isinstance(ref, Profile)]
    for prof in profiles:
        if prof.device is not None and prof.memory is None:
            prof.memory = known[prof.device].memory
    return sc


def _streaming_problems(sc: Scenario) -> list[str]:
    lines: list[str] = []
    if sc.streaming is not None and isinstance(sc.streaming.rates, list) and len(sc.streaming.rates) != sc.n_workers:
        lines.append(f"streaming.rates: {len(sc.streaming.rates)} rates for {sc.n_workers} workers")
    if sc.sites and sc.streaming is not None and sc.streaming.broker.kind != "tansu":
        lines.append(f"streaming.broker.kind: {sc.streaming.broker.kind} with sites is not supported yet (use tansu)")
    return lines + _external_broker_problems(sc)


def _reference_problems(sc: Scenario, refs: list[tuple[str, Any]]) -> list[str]:
    """Profiles and nodes named where they are not defined; links between nodes that repeat."""
    lines: list[str] = []
    known = ", ".join(sorted(sc.profiles)) or "none defined"
    for where, ref in refs:
        if isinstance(ref, str) and ref not in sc.profiles:
            lines.append(f"{where}: unknown profile '{ref}' (defined: {known})")
    all_nodes = sc.node_names()
    pairs: set[frozenset] = set()
    for i, link in enumerate(sc.links):
        a, b = link.between
        for n in (a, b):
            if n not in all_nodes:
                lines.append(f"links[{i}].between: unknown node '{n}' (nodes: {', '.join(all_nodes)})")
        if a == b:
            lines.append(f"links[{i}].between: a link from node '{a}' to itself")
        if frozenset((a, b)) in pairs:
            lines.append(f"links[{i}].between: a second link between '{a}' and '{b}'")
        pairs.add(frozenset((a, b)))
    return lines


def _worker_problems(sc: Scenario) -> list[str]:
    lines: list[str] = []
    names = [n for n, _ in sc.worker_names()]
    nodes = len(sc.node_names())  # the broker and producer nodes too
    if nodes + 1 > ipaddress.IPv4Network(sc.network.subnet).num_addresses - 2:
        lines.append(f"network.subnet: {sc.network.subnet} has too few addresses for {nodes} nodes and a gateway")
    if len(names) > MAX_WORKERS:
        lines.append(f"workers: {len(names)} workers in all; a run takes at most {MAX_WORKERS}")
    for n in names:
        if n in ("ps", "eval", "broker", "producer"):
            lines.append(f"workers: node name '{n}' is reserved")
    if len(set(names)) != len(names):
        lines.append("workers: two groups produce the same node names; give them different 'name' prefixes")
    return lines


def _algorithm_problems(sc: Scenario) -> list[str]:
    """The algorithm's name and its parameters (its own Params model), and what it cannot run with."""
    from testbed.strategies import StrategyError, get_strategy_class

    lines: list[str] = []
    try:
        cls = get_strategy_class(sc.algorithm.name)
    except StrategyError as e:
        lines.append(f"algorithm.name: {e}")
    else:
        try:
            cls.Params(**sc.algorithm.params)
        except ValidationError as e:
            lines += [f"algorithm.params.{line}" for line in _errors_to_lines(e)]
        except TypeError as e:
            lines.append(f"algorithm.params: {e}")
        if cls.decentralized and sc.workload.injection is not None:
            lines.append(f"workload.injection: {cls.name} is decentralized; data injection runs with PS algorithms")
        if cls.decentralized and sc.streaming is not None:
            lines.append(f"algorithm.name: {cls.name} is decentralized (no PS) and does not train from streams; "
                         "streaming needs a PS algorithm")
    return lines


def _placement_problems(sc: Scenario) -> list[str]:
    lines: list[str] = []
    for key, value in sc.placement.items():
        if not resolve_target(sc, key) and key not in sc.sites:
            lines.append(f"placement.{key}: names no node, worker group or site")
        if not value or (value.startswith("label:") and "=" not in value):
            lines.append(f"placement.{key}: '{value}' is neither a host name nor label:KEY=VALUE")
    return lines


def unknown_runtime(name: str, registered: Optional[Iterable[str]] = None) -> Optional[str]:
    """One line if `name` is neither `auto` nor a registered runtime, else None: `registered`, or
    the `edgebed.runtimes` entry point group's names (read here: the runtimes layer is above this
    one). What that runtime cannot run is its own check (testbed.runtimes.scenario_problems)."""
    names = registered if registered is not None else (ep.name for ep in entry_points(group="edgebed.runtimes"))
    known = sorted(set(names))
    if name == "auto" or name in known:
        return None
    return f"runtime: unknown runtime '{name}' (known: {', '.join(['auto', *known])})"


def _runtime_name_problems(sc: Scenario) -> list[str]:
    line = unknown_runtime(sc.runtime)
    return [] if line is None else [line]


def _jitter_problems(sc: Scenario, refs: list[tuple[str, Any]]) -> list[str]:
    lines: list[str] = []
    # Named profiles and inline ones (`workers[0].profile: {jitter: 5ms}`) alike.
    checked = [(f"profiles.{n}", p) for n, p in sc.profiles.items()]
    checked += [(w, ref) for w, ref in refs if isinstance(ref, Profile)]
    for where, prof in checked:
        for d in ("uplink", "downlink"):
            r = prof.resolved_direction(d)  # type: ignore[arg-type]
            if r.jitter and not r.latency:
                lines.append(f"{where}.{d}: jitter without latency")
    return lines


def resolve_target(sc: Scenario, target: str) -> list[str]:
    """Node names a target stands for ([] when it names nothing)."""
    if target in sc.node_names():
        return [target]
    if target.startswith("wan:"):  # a WAN link between two sites: the target itself
        a, sep, b = target[4:].partition("-")
        linked = sc.wan.mesh or any({a, b} == set(link.between) for link in sc.wan.links)
        return [target] if sep and a in sc.sites and b in sc.sites and a != b and linked else []
    workers = [n for n, _ in sc.worker_names()]
    if target == "workers":
        return workers
    groups: dict[str, list[str]] = {}
    for (name, gi) in sc.worker_names():
        groups.setdefault(sc.workers[gi].name or "w", []).append(name)
    return groups.get(target, [])


def _event_problems(sc: Scenario, all_nodes: list[str]) -> list[str]:
    lines = []
    groups = sorted({g.name or "w" for g in sc.workers})
    for i, ev in enumerate(sc.events):
        nodes = resolve_target(sc, ev.target)
        if not nodes:
            lines.append(f"events[{i}].target: '{ev.target}' is no node, worker group, 'workers' or WAN link "
                         f"wan:A-B (nodes: {', '.join(all_nodes)}; groups: {', '.join(groups)})")
        elif ev.action in ("kill", "restart", "pause", "resume") and set(nodes) & {"broker", "producer"} \
                and sc.streaming is not None and sc.streaming.broker.kind == "kafka":
            lines.append(f"events[{i}].target: {ev.action} of the kafka broker's node is not supported")
        elif ev.action == "restart" and set(nodes) & {"broker", "producer"}:
            lines.append(f"events[{i}].action: the broker's node is not restarted (killing it ends the run: "
                         "the workers' streams and topics go with it)")
        if ev.target.startswith("wan:") and nodes and ev.action != "link":
            lines.append(f"events[{i}].action: a WAN link ({ev.target}) takes link events only, not {ev.action}")
        if ev.action == "cpu" and ev.cpus is not None:
            refs = [sc.node_profile_ref(n) for n in nodes]
            periods = {sc.profile_of(r).cpu_period for r in refs if not isinstance(r, str) or r in sc.profiles}
            for problem in {cpu_quota_problem(ev.cpus, p) for p in periods} - {None}:
                lines.append(f"events[{i}].cpus: {problem}")
        for peer in ev.peers:
            if not resolve_target(sc, peer):
                lines.append(f"events[{i}].peers: '{peer}' is no node, worker group or 'workers'")
    return lines + event_trace_problems(sc)


KAFKA_NEEDS = "kafka runs Apache Kafka from its image"


def gpu_fields(sc: Scenario) -> list[str]:
    """The fields that ask for GPUs: named profiles and inline ones."""
    return [where for where, _ in gpu_profiles(sc)]


def gpu_profiles(sc: Scenario) -> list[tuple[str, Profile]]:
    """(`...gpus` field, profile) of every profile with GPUs: named ones and inline ones."""
    found = [(f"profiles.{n}.gpus", p) for n, p in sc.profiles.items() if p.has_gpus()]
    return found + [(f"{w}.gpus", ref) for w, ref in profile_refs(sc) if isinstance(ref, Profile) and ref.has_gpus()]


def profile_refs(sc: Scenario) -> list[tuple[str, Any]]:
    """(field, profile name or inline profile) of every place a scenario names a profile."""
    refs: list[tuple[str, Any]] = [("ps.profile", sc.ps.profile), ("evaluator.profile", sc.evaluator.profile)]
    refs += [(f"workers[{i}].profile", g.profile) for i, g in enumerate(sc.workers)]
    if sc.streaming is not None:
        refs.append(("streaming.broker.profile", sc.streaming.broker.profile))
        refs.append(("streaming.broker.producer_profile", sc.streaming.broker.producer_profile))
    return refs + [(f"sites.{n}.lan", site.lan) for n, site in sc.sites.items()]


def uses_kafka_image(sc: Scenario) -> bool:
    return sc.streaming is not None and sc.streaming.broker.kind == "kafka"


def validate_schema(data: Any) -> Scenario:
    """The scenario's fields and their cross-checks, one line per problem naming the field.
    What needs a plan (sites' subnets, WAN connectivity) is checked by testbed.plan.parse_scenario,
    the function callers use."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(["(top level): a scenario must be a mapping of fields"])
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(_errors_to_lines(e)) from None
    lines = _cross_checks(sc)
    if lines:
        raise ScenarioError(lines)
    return apply_devices(sc)
