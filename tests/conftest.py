import inspect
import os
import re
from pathlib import Path

import pytest

from helpers import is_root, our_netns


def _descends_from_me(pid) -> bool:
    """Whether a process is this one or was started by it (a CLI run in a subprocess); another
    lane's runner is neither."""
    while pid and pid > 1:
        if pid == os.getpid():
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


@pytest.fixture
def clean_host(tmp_path, request):
    """Fail a test that leaves namespaces, cgroups, containers or state files of edgebed behind.

    Only runs this test made count (runner is this process, or the run dir is in the test's
    tmp_path; a run with no state file counts unless an engine's labels name a live runner that
    is not this process's): other edgebed runs on the same machine, another lane's, must not fail it.
    A test that does not use the lab counts no run the lab's swarm alone holds: the lab's lane
    kills runners on purpose (`edgebed down` after kill -9), and their services outlive their
    state files for a few seconds.
    """
    from testbed.kernel import cgroups
    from testbed.runtimes import load_backends
    from testbed.runtimes.state import RUN_LABEL, SWEEPERS, known_runs, labelled_runs

    load_backends()
    before = set(known_runs())
    yield

    def ours(rid, st) -> bool:
        if st is None:  # no state file (yet, or any more): an engine's labels may name its runner
            if rid in swarm_only:
                return False
            engine = labelled.get(rid)
            return engine is None or not engine.runner_alive() or _descends_from_me(engine.runner_pid)
        return st.runner_pid == os.getpid() or str(st.run_dir).startswith(str(tmp_path))

    labelled = labelled_runs()
    swarm_only: set = set()
    if "lab" not in request.fixturenames and "swarm" in SWEEPERS:
        others = {labels.get(RUN_LABEL) for name, sweeper in SWEEPERS.items() if name != "swarm"
                  for _, labels in sweeper.find_labels()}
        swarm_only = {labels.get(RUN_LABEL) for _, labels in SWEEPERS["swarm"].find_labels()} - others
    after = {rid for rid, st in known_runs(labelled).items() if rid not in before and ours(rid, st)}
    assert not after, f"leftover runs: {after}; netns {our_netns()}; cgroups {cgroups.list_runs()}"


def _lab_or_skip():
    import shutil

    if not is_root():
        pytest.skip("needs root: the lab starts dockerds in network namespaces")
    for tool in ("dockerd", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"the lab needs {tool} (apt install docker.io)")


@pytest.fixture(scope="session")
def lab():
    """The lab of two emulated hosts (`edgebed lab up --hosts 2`), one for the whole session: its
    tests run last (pytest_collection_modifyitems), so it is up only while they run, and the node
    image is loaded onto its engines once. One already up (made by hand) is used and left up if
    its engines answer; one that does not (a crashed session's) is taken down and made anew."""
    from testbed.runtimes.swarm import lab as lab_mod

    _lab_or_skip()
    made = not lab_mod.lab_hosts()
    if not made and not _lab_answers(lab_mod.lab_hosts()):  # one a crashed session left behind
        lab_mod.lab_down()
        made = True
    if made:
        lab_mod.lab_up(2)
    yield lab_mod.lab_hosts()
    if made:
        assert lab_mod.lab_down() == []


def _lab_answers(hosts) -> bool:
    """Whether every host's engine of a lab that is up answers, with the swarm's hosts all ready."""
    import docker

    try:
        engines = [docker.DockerClient(base_url=h.socket, timeout=5) for h in hosts]
        ready = [n for n in engines[0].nodes.list() if n.attrs["Status"]["State"] == "ready"]
        return all(e.ping() for e in engines) and len(ready) == len(hosts)
    except Exception:
        return False


@pytest.fixture
def job_out():
    """A folder a netns node's job may write its result into: a node runs as its own uid, to which
    pytest's tmp_path (under root's 0700 folder) is closed. Runs' own jobs use the mailbox."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="edgebed-test-jobs-"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- test tiers -----------------------------------------------------------------------------------
# A test is `real` (and `slow`) when it brings up something real: root's namespaces, cgroups or tc, a
# Docker engine, the lab, or a subprocess `edgebed up`. `make test-fast` (-m "not slow") runs the
# rest. Marked from what a test uses, so a new test is put in its tier without anyone remembering.
REAL_FIXTURES = {"clean_host", "lab", "cluster", "image", "installed", "two_namespaces", "host_forward_drop"}
REAL_CALLS = re.compile(r"\b(run_up|start_up|netns_cluster|lab_up|NetnsRuntime|DockerRuntime|SwarmRuntime|"
                        r"_docker_or_skip|_lab_or_skip)\(|edgebed_cmd\(\) \+ \[\"up\"")


UNIT_TIMEOUT_S = 300  # (pytest-timeout) a test with no real run that takes this long is stuck


def _calls(src: str, names: set[str]) -> bool:
    return bool(REAL_CALLS.search(src)) or any(re.search(rf"\b{re.escape(n)}\(", src) for n in names)


def _real_helpers(module) -> set[str]:
    """The module's own functions, and those it takes from helpers.py, that (transitively) bring
    something real up."""
    if module is None:
        return set()
    cached = module.__dict__.get("_edgebed_real_helpers")
    if cached is not None:
        return cached
    funcs = {}
    for name, f in vars(module).items():
        if inspect.isfunction(f) and f.__module__ in (module.__name__, "helpers") and not name.startswith("test_"):
            try:
                funcs[name] = inspect.getsource(f)
            except (OSError, TypeError):
                pass
    real: set[str] = set()
    while True:
        more = {n for n, src in funcs.items() if n not in real and _calls(src, real)}
        if not more:
            break
        real |= more
    module._edgebed_real_helpers = real
    return real


def is_real(item) -> bool:
    if item.get_closest_marker("real") or item.get_closest_marker("root"):
        return True
    if any(str(m.kwargs.get("reason", "")).startswith("needs root") for m in item.iter_markers("skipif")):
        return True
    if REAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    fn = getattr(item, "function", None)
    try:
        src = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        src = ""
    return _calls(src, _real_helpers(getattr(item, "module", None)))


# the test files whose tests use the lab (a session fixture): `make test`'s lanes give each file's
# tests to one lane together, so one lab is brought up, once
LAB_FILES = ("tests/lab/test_swarm.py", "tests/lab/test_ipsec.py", "tests/lab/test_swarm_fleet.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_real(item):
            item.add_marker(pytest.mark.real)
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))  # `make test`'s --timeout is for real runs
    uses_lab = {item.nodeid for item in items if "lab" in getattr(item, "fixturenames", ())}
    strays = sorted(n for n in uses_lab if n.split("::", 1)[0] not in LAB_FILES)
    if strays:
        raise pytest.UsageError(f"tests using the lab outside LAB_FILES (tests/conftest.py): {strays}")
    # the lab's tests last, together (stable otherwise): the session's lab is up only while they run
    items.sort(key=lambda item: item.nodeid in uses_lab)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s lanes (pytest-xdist): the lab's files are one unit of work, the largest, so one
    lane starts on them at once while the other lanes share out every other test, one at a time.
    (pytest-xdist's own --dist loadgroup marks no longer group anything under pytest 9.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LabTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "lab" if nodeid.split("::", 1)[0] in LAB_FILES else nodeid

    return LabTogether(config, log)


@pytest.fixture
def ps_port_free():
    """A PS role made in the test binds its port (5555) on loopback: skip if something holds it."""
    import zmq

    s = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        s.bind("tcp://127.0.0.1:5555")
    except zmq.ZMQError:
        pytest.skip("port 5555 on loopback is taken")
    finally:
        s.close(linger=0)
