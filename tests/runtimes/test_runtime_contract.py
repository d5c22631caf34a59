"""The runtime contract: a runtime is its own folder plus an entry point. No module outside
testbed/runtimes/<name>/ branches on a runtime's name; every registered runtime implements the
contract; what a runtime cannot do, it says by name."""
import ast
import multiprocessing as mp
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed import runtimes
from testbed.runtimes.base import Features, NodeProcess, Runtime, StopEvent, Unavailable

PACKAGE = Path(__file__).resolve().parents[2] / "testbed"
# Branches the lead removes when scenario/schema.py moves its runtime checks to the runtimes
# (runtimes.scenario_problems): network.encrypt needs swarm, kafka's image needs docker.
PENDING: dict[str, int] = {}


def _names_in(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e, names) for e in node.elts)
    return False


def name_branches(source: str, names: set[str]) -> list[int]:
    """Lines that compare with a runtime's name (`== "netns"`, `in ("auto", "docker")`) or look
    one up in a table keyed by runtime names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_in(x, names) for x in [node.left, *node.comparators]):
            found.append(node.lineno)
        elif isinstance(node, ast.Dict) and sum(_names_in(k, names) for k in node.keys if k is not None) >= 2:
            found.append(node.lineno)
        elif isinstance(node, ast.Match):
            found += [c.pattern.lineno for c in node.cases if any(
                isinstance(p, ast.MatchValue) and _names_in(p.value, names) for p in ast.walk(c.pattern))]
    return sorted(found)


def test_the_checker_finds_branches_on_a_runtime_name():
    names = {"netns", "docker"}
    code = ('if rt == "netns": pass\nif name in ("auto", "docker"): pass\nx = {"netns": 1, "docker": 2}[n]\n'
            'if sc.runtime != "other": pass\nhelp = "netns | docker"\nd = {"netns": h.netns}\n')
    assert name_branches(code, names) == [1, 2, 3]


def test_no_branch_on_a_runtime_name_outside_its_own_folder():
    names = set(runtimes.runtime_names())
    assert {"netns", "docker", "swarm"} <= names
    own = tuple(f"testbed/runtimes/{n}/" for n in names)
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith(own):
            continue
        lines = name_branches(path.read_text(), names)
        if lines:
            found[rel] = lines
    assert {f: len(lines) for f, lines in found.items()} == PENDING, found


@pytest.mark.parametrize("name", runtimes.runtime_names())
def test_every_registered_runtime_implements_the_contract(name):
    cls = runtimes.runtime_class(name)
    assert issubclass(cls, Runtime) and cls.name == name and isinstance(cls.features, Features)
    assert not getattr(cls, "__abstractmethods__", None), cls.__abstractmethods__
    for hook in ("available", "auto_refusal", "scenario_problems", "problems", "auto_problems", "plugin_refusals"):
        assert callable(getattr(cls, hook)), hook
    assert cls.auto_rank is None or isinstance(cls.auto_rank, int)
    assert isinstance(cls.shaper, str) and cls.shaper


def test_what_start_node_and_start_return_are_node_processes():
    from testbed.runtimes.docker.runtime import ContainerProcess, ExecProcess, RoleProcess
    from testbed.runtimes.swarm.runtime import SwarmJob, TaskRoleProcess

    members = ("is_alive", "exitcode", "join", "kill")
    for cls in (mp.Process, ContainerProcess, RoleProcess, ExecProcess, TaskRoleProcess, SwarmJob):
        assert all(hasattr(cls, m) for m in members), cls
    assert isinstance(mp.get_context("fork").Process(target=print), NodeProcess)
    job = SwarmJob(SimpleNamespace(task_running=lambda node: True), "w0", SimpleNamespace(exists=lambda: False))
    assert isinstance(job, NodeProcess) and job.is_alive() and job.exitcode is None
    states = iter([{"Running": True}, {"Running": True}, {"Running": False, "ExitCode": 3}])
    ex = object.__new__(ExecProcess)  # as the engine reports it: running, then exit code 3
    ex.api, ex.exec_id = SimpleNamespace(exec_inspect=lambda i: next(states)), "x"
    assert ex.is_alive() and ex.exitcode is None and ex.exitcode == 3
    container = SimpleNamespace(reload=lambda: None, attrs={"State": {"Running": False, "ExitCode": 0}})
    role = RoleProcess(container, {"w0": {"gen": 2, "running": True}}, "w0", 1)
    assert not role.is_alive() and role.exitcode == -9  # superseded by a restart
    assert not ContainerProcess(container).is_alive() and ContainerProcess(container).exitcode == 0


def test_both_stop_events_are_stop_events():
    from testbed.runtimes.engine.supervised import HubStop

    hub = SimpleNamespace(stopping=False)
    hub.set_stop = lambda: setattr(hub, "stopping", True)
    stop = HubStop(hub)
    assert isinstance(stop, StopEvent) and not stop.is_set()
    stop.set()
    assert stop.is_set()
    assert isinstance(mp.get_context("fork").Event(), StopEvent)


class Bare(Runtime):
    """A runtime with only the abstract methods: every optional operation says it is missing."""
    name = "bare"

    def create(self, spec): pass
    def make_stop_event(self): pass
    def start_node(self, node, cfg, stop_event): pass
    def start(self, node, target, kwargs, label=""): pass
    def counters(self): return {}
    def stop_processes(self, grace): pass
    def teardown(self): return []


def test_an_operation_a_runtime_lacks_names_the_runtime():
    rt = object.__new__(Bare)
    rt.handles = {"w0": SimpleNamespace(node=SimpleNamespace(address="10.0.0.2"))}
    rt._cuts = {}
    for call, what in ((lambda: rt.set_stress("w0", 1.0), "changing background stress"),
                       (lambda: rt.set_cpus("w0", 0.5), "changing a CPU quota"),
                       (lambda: rt.freeze("w0", True), "freezing a node"),
                       (lambda: rt.kill_node("w0"), "killing a node"),
                       (lambda: rt.partition("w0", ["w0"], True), "partitions")):
        with pytest.raises(NotImplementedError, match=f"^runtime bare does not support {what}"):
            call()


def test_an_unknown_runtime_is_one_clear_line():
    line = "runtime: unknown runtime 'k8s' (known: auto, docker, netns, swarm)"
    with pytest.raises(runtimes.RuntimeUnavailable) as e:
        runtimes.runtime_class("k8s")
    assert str(e.value) == line
    with pytest.raises(runtimes.RuntimeUnavailable, match=r"^runtime: unknown runtime 'k8s' \(known: auto, "):
        runtimes.select_runtime("k8s")
    assert runtimes.scenario_problems(SimpleNamespace(runtime="k8s")) == [line]
    assert runtimes.unknown_runtime("auto") is None and runtimes.unknown_runtime("netns") is None


class Near(Bare):
    name = "near"
    auto_rank = 0
    why = Unavailable("nothing answers", "runtime near: nothing answers (start it)")

    @classmethod
    def available(cls):
        return cls.why


class Far(Bare):
    name = "far"
    auto_rank = 1
    why = None

    @classmethod
    def available(cls):
        return cls.why


def test_auto_runs_the_first_available_runtime_by_rank_and_says_why(monkeypatch):
    eps = {n: metadata.EntryPoint(n, f"test_runtime_contract:{c}", runtimes.GROUP)
           for n, c in (("near", "Near"), ("far", "Far"), ("bare", "Bare"))}
    monkeypatch.setattr(runtimes, "_entry_points", lambda: eps)
    assert runtimes.runtime_names() == ["bare", "far", "near"]  # a third party's runtime, by its entry point
    assert [c.name for c in runtimes.auto_candidates()] == ["near", "far"]  # bare has no rank: only when named
    said = []
    assert runtimes.select_runtime("auto", said.append) == "far"
    assert said == ["runtime auto: far, because nothing answers"]
    with pytest.raises(runtimes.RuntimeUnavailable, match=r"^runtime near: nothing answers \(start it\)$"):
        runtimes.select_runtime("near")
    monkeypatch.setattr(Far, "why", Unavailable("no", "runtime far: no"))
    with pytest.raises(runtimes.RuntimeUnavailable, match="^runtime far: no$"):  # the last candidate's line
        runtimes.select_runtime("auto")
    assert runtimes.select_runtime("bare") == "bare"


def test_auto_passes_over_docker_for_a_plugin_without_packages():
    from testbed.runtimes.docker.runtime import DockerRuntime

    plugin = SimpleNamespace(packages=[], algorithm=SimpleNamespace(name="theirs.mod:Algo"),
                             workload=SimpleNamespace(model="mlp", dataset="mnist5k"))
    assert DockerRuntime.auto_refusal(plugin) == "theirs.mod:Algo is a plugin (on docker it needs `packages:`)"
    assert DockerRuntime.auto_refusal(SimpleNamespace(**{**vars(plugin), "packages": ["pkg"]})) is None


def test_runtime_checks_of_a_scenario_are_the_runtimes():
    from testbed.plan import parse_scenario
    from testbed.scenario.schema import KAFKA_NEEDS

    encrypt = SimpleNamespace(runtime="auto", network=SimpleNamespace(encrypt=True),
                              streaming=None, workload=SimpleNamespace(dataset="mnist5k"),
                              node_names=lambda: ["ps", "eval", "w0"])
    [line] = runtimes.scenario_problems(encrypt)  # every auto candidate has it: auto cannot encrypt
    assert line.startswith("network.encrypt: encrypts runtime swarm's overlay")
    assert runtimes.scenario_problems(SimpleNamespace(**{**vars(encrypt), "runtime": "swarm"})) == []
    kafka = parse_scenario({"runtime": "docker", "workers": [{"count": 2}],
                            "streaming": {"broker": {"kind": "kafka"}}})
    assert runtimes.scenario_problems(kafka) == []
    netns = runtimes.runtime_class("netns")
    assert netns.scenario_problems(kafka) == [f"streaming.broker.kind: {KAFKA_NEEDS} and needs the docker runtime "
                                              "(runtime: docker or auto)"]
    assert runtimes.scenario_problems(kafka.model_copy(update={"runtime": "auto"})) == []  # docker can


def test_swarm_sites_need_only_their_narrow_interface():
    """SwarmSites works against anything with SiteServices' members (no SwarmRuntime internals):
    overlays per site and WAN link, a router service per site on its host, routes from the tasks'
    addresses, WAN counters asked of the routers at once."""
    from testbed.kernel.shaping import KernelCaps
    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.swarm.sites import SwarmSites

    sc = parse_scenario({"runtime": "swarm", "sites": {"a": {}, "b": {}, "c": {}},
                         "wan": {"mesh": False, "default": {"bandwidth": "20mbit"},
                                 "links": [{"between": ["a", "b"]}, {"between": ["b", "c"]}]},
                         "ps": {"site": "a"}, "workers": [{"count": 1, "site": "c"}]})
    spec = build_cluster(sc, "abc123")
    caps = KernelCaps(htb=True, netem=True, tbf=True, ifb=True, bpf_loss=True)

    class Services:  # exactly SiteServices' members
        run_id = "abc123"

        def __init__(self):
            self.asked, self.made = [], []

        def overlay(self, name, subnet):
            self.made.append(name)
            return SimpleNamespace(name=name, id=name)

        def service(self, name, host, networks, resources=None, sysctls=None, directions=(), env=None, role="router"):
            return SimpleNamespace(name=f"eb-abc123-{name}", host=host, networks=[n.name for n, _ in networks])

        def wait_running(self, services):
            return {name: {"service": svc} for name, svc in services.items()}

        def address_on(self, task, network):
            return f"{task['service'].name}@{network.name}"

        def ask(self, name, req):
            self.asked.append((name, req["op"]))
            return "ok"

        def ask_all(self, names, req):
            return {n: '{"x": {"up_bytes": 1, "time": 5.0}}' for n in names}

        def ask_kernel(self, name):
            return caps

        def clock_offset(self, name):
            return (1.0, 0.001)

    rt = Services()
    sites = SwarmSites(rt, spec, caps, {"a": SimpleNamespace(hostname="h1"), "b": SimpleNamespace(hostname="h2"),
                                        "c": SimpleNamespace(hostname="h2")})
    sites.make_lans()
    sites.make_routers()
    sites.route()
    assert rt.made == ["eb-abc123-a", "eb-abc123-b", "eb-abc123-c", "eb-abc123-wan-a-b", "eb-abc123-wan-b-c"]
    assert sites.services["b"].networks == ["eb-abc123-b", "eb-abc123-wan-a-b", "eb-abc123-wan-b-c"]
    assert sorted(rt.asked) == [("rt-a", "route"), ("rt-b", "route"), ("rt-c", "route")]
    assert sites.node_routes("c") == {spec.topology.site("a").subnet: "eb-abc123-rt-c@eb-abc123-c",
                                      spec.topology.site("b").subnet: "eb-abc123-rt-c@eb-abc123-c"}
    assert sites.wan_counters()[("a", "x")]["time"] == 4.0  # the router's clock moved onto the runner's
    assert sites.topology_meta()["routers"]["c"]["host"] == "h2"


def test_swarm_sets_a_quota_through_the_nodes_host_engine():
    from testbed.runtimes.swarm.services import set_container_quota

    posted = []
    api = SimpleNamespace(_url=lambda path, cid: path.format(cid), _raise_for_status=lambda r: None,
                          _post_json=lambda url, data: posted.append((url, data)))
    host = SimpleNamespace(hostname="h2", engine_client=lambda: SimpleNamespace(api=api))
    set_container_quota("w0", host, "c0", None, 0.5)
    set_container_quota("w0", host, "c0", 0.02, 0.5)
    set_container_quota("w0", host, "c0", 0.02, None)
    assert posted == [("/containers/c0/update", {"NanoCpus": 500_000_000}),
                      ("/containers/c0/update", {"CpuPeriod": 20000, "CpuQuota": 10000}),
                      ("/containers/c0/update", {"CpuPeriod": 20000, "CpuQuota": -1})]
    with pytest.raises(RuntimeError, match="the CPUs of w0 are set by host h2's engine"):
        set_container_quota("w0", SimpleNamespace(hostname="h2", engine_client=lambda: None), "c0", None, 1.0)
