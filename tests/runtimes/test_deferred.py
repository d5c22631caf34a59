"""runtimes.netns.deferred: a node's arguments are opened only after it gave up its powers, so a
forkserver that has not imported torch (a second run in one process reuses the first run's) still
gives the node a single thread to drop capabilities in (the failure of `bench all --quick`)."""

import json
import subprocess
import sys
import textwrap

from testbed.runtimes.netns.deferred import Deferred

SCRIPT = textwrap.dedent("""
    import json, multiprocessing as mp, sys
    from testbed.runtimes.netns.deferred import Deferred

    def threads():
        return int(next(l for l in open("/proc/self/status") if l.startswith("Threads")).split()[1])

    def node(args, wrap, out):
        seen = {"torch_before": "torch" in sys.modules, "threads_before": threads()}
        kwargs = args.open() if wrap else args
        kwargs["ready"].set()
        seen.update(torch_after="torch" in sys.modules, cfg=type(kwargs["cfg"]).__name__)
        out.put(seen)

    if __name__ == "__main__":
        from testbed.node.roles.common import RoleConfig  # the runner has torch; the forkserver not
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([])
        results = {}
        for wrap in (True, False):
            ready, out = ctx.Event(), ctx.Queue()
            kwargs = {"cfg": RoleConfig.__new__(RoleConfig), "ready": ready}
            p = ctx.Process(target=node, args=(Deferred(kwargs) if wrap else kwargs, wrap, out))
            p.start()
            results["deferred" if wrap else "plain"] = out.get(timeout=60)
            p.join(60)
            results["ready_" + str(wrap)] = ready.is_set()
        print(json.dumps(results))
""")


def test_a_node_opens_its_arguments_with_one_thread_and_torch_not_yet_imported(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    deferred, plain = got["deferred"], got["plain"]
    assert deferred == {"torch_before": False, "threads_before": 1, "torch_after": True, "cfg": "RoleConfig"}
    assert got["ready_True"] and got["ready_False"]  # the event crossed, and works, either way
    # what the test guards against: unpickled as mp passes it, RoleConfig brings torch and its thread
    assert plain["torch_before"] and plain["threads_before"] > 1, plain


def test_deferred_arguments_are_bytes_until_opened():
    import pickle
    sealed = pickle.loads(pickle.dumps(Deferred({"a": [1, 2]})))
    assert sealed.open() == {"a": [1, 2]}
