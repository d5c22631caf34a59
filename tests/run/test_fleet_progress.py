"""A fleet's bring-up and teardown a person can follow: the runtime's ticks, as lines
in a log and as bars on a terminal."""

import io

import pytest

from testbed.run.progress import FleetProgress

from helpers import needs_root


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_line_at_each_tenth_with_rate_and_time_left_and_one_at_the_end():
    lines, clock = [], Clock()
    progress = FleetProgress(lines.append, clock=clock)
    for done in range(1, 1001):
        clock.now += 0.01  # 100 nodes a second
        progress("links", done, 1000)
    assert len(lines) == 10, lines  # nine tenths and the end, not a thousand lines
    assert lines[0] == "links: 100/1000 (100/s, 9 s left)", lines[0]
    assert lines[4] == "links: 500/1000 (100/s, 5 s left)", lines[4]
    assert lines[-1] == "links: 1000/1000 in 10.0 s (100/s)", lines[-1]
    assert progress.stages == {"links": pytest.approx(10.0)}


def test_each_stage_starts_its_own_count_and_clock():
    lines, clock = [], Clock()
    progress = FleetProgress(lines.append, clock=clock)
    for stage, seconds in (("namespaces", 2.0), ("links", 8.0)):
        for done in range(1, 11):
            clock.now += seconds / 10
            progress(stage, done, 10)
    assert progress.stages == {"namespaces": pytest.approx(2.0), "links": pytest.approx(8.0)}
    assert lines[-1] == "links: 10/10 in 8.0 s (1/s)"
    assert [line for line in lines if line.startswith("links")][0] == "links: 1/10 (1/s, 7 s left)"


def test_a_terminal_gets_bars_with_done_total_and_rate_and_no_lines():
    from rich.console import Console

    screen, lines, clock = io.StringIO(), [], Clock()
    progress = FleetProgress(lines.append, bar=True, clock=clock,
                             console=Console(file=screen, force_terminal=True, width=100))
    for stage in ("namespaces", "links"):
        for done in range(1, 301):
            progress(stage, done, 300)
    progress.close()
    shown = screen.getvalue()
    assert lines == [] and "namespaces" in shown and "links" in shown and "300/300" in shown, shown[-500:]
    assert set(progress.stages) == {"namespaces", "links"}


@needs_root
def test_the_netns_runtime_ticks_every_node_of_each_stage_up_and_down():
    from testbed.bench.harness import Bench

    ticks = []
    scenario = {"name": "ticks", "profiles": {"p": {"bandwidth": "10mbit"}}, "ps": {"profile": "p"},
                "evaluator": {"profile": "p"}, "workers": [{"count": 5, "profile": "p"}]}
    bench = Bench({}, "netns", scenario=scenario)
    bench.rt.progress = lambda stage, done, total: ticks.append((stage, done, total))
    with bench as (rt, spec):
        nodes = len(spec.nodes)
        up = list(ticks)
    assert nodes == 7
    for stage in ("namespaces", "links", "control links"):
        assert [(d, t) for s, d, t in up if s == stage] == [(i, nodes) for i in range(1, nodes + 1)], stage
    removing = [(d, t) for s, d, t in ticks if s == "removing"]
    assert removing and removing[-1][0] == removing[-1][1] >= nodes + 2  # the nodes', the switch's, the control's
    assert bench.problems == []
