"""A node's process polled from two threads at once (the monitor, and a trainer's start running
multiprocessing's _cleanup over every child) reads its exit status once: never 255 for a node
that ended with 0 (CPython's forkserver Popen read it twice: the second read found EOF)."""
import threading
from multiprocessing.connection import wait

from testbed.runtimes.netns.forkserver_process import ForkserverProcess


def _ends(code: int) -> None:
    raise SystemExit(code)


def test_threads_polling_an_ended_process_together_all_read_its_exit_status():
    for code in [0] * 40 + [3] * 10:
        p = ForkserverProcess(target=_ends, args=(code,))
        p.start()
        assert wait([p.sentinel], 30)  # ended: its status is there to read, not read yet
        barrier = threading.Barrier(4)
        seen: list = []

        def poll(barrier: threading.Barrier, seen: list, p: ForkserverProcess) -> None:
            barrier.wait()
            seen.append(p.exitcode)

        threads = [threading.Thread(target=poll, args=(barrier, seen, p)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [code] * 4 and p.exitcode == code and not p.is_alive()
        p.join()
        p.close()
