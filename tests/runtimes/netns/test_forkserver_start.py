"""A node's process starts from the netns runtime's forkserver without importing the runner's
main module again: the forkserver imports it once (its preload), where each node used to run it
as it started (0.84 s of a 2.1-s per-round trainer start under load, before its first line)."""

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize("how", ["path", "module"])  # `edgebed`, a user's script | `python -m testbed.cli`
def test_nodes_fork_without_importing_the_main_module_again(tmp_path, how):
    imports = tmp_path / "imports.txt"
    script = tmp_path / "runner_main.py"
    script.write_text(textwrap.dedent(f"""
        import os
        with open({str(imports)!r}, "a") as f:
            f.write(f"{{__name__}} {{os.getpid()}}\\n")


        def node(out):
            with open(out, "a") as f:
                f.write(f"node {{os.getpid()}}\\n")


        if __name__ == "__main__":
            from testbed.runtimes.netns.runtime import NetnsRuntime
            from testbed.runtimes.state import RunState

            rt = NetnsRuntime(RunState(run_id="abcdef", runner_pid=os.getpid(), run_dir=".", scenario="s"))
            rt.set_preload([])
            for _ in range(3):
                p = rt._ctx.Process(target=node, args=({str(imports)!r},))
                p.start()
                p.join(30)
                assert p.exitcode == 0, p.exitcode
    """))
    cmd = [str(script)] if how == "path" else ["-m", "runner_main"]
    subprocess.run([sys.executable, *cmd], check=True, timeout=120, cwd=tmp_path)
    lines = [line.split() for line in imports.read_text().splitlines()]
    names = [name for name, _ in lines]
    assert names.count("node") == 3, lines
    # the runner's own import, and one in the forkserver: none in the nodes
    assert names.count("__main__") == 1 and names.count("__mp_main__") == 1, lines
    forkserver = next(pid for name, pid in lines if name == "__mp_main__")
    assert forkserver not in {pid for name, pid in lines if name == "node"}
