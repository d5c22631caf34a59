"""`edgebed bench fleet`'s parts that need no run: its scenario is valid at every size it is
run at, and the memory it reads is the process's own."""

import os

import pytest

from testbed.bench.fleet import mem_used, rollup, scenario
from testbed.plan import parse_scenario


@pytest.mark.parametrize("devices, clients, trainers", [(100, 10, "per_round"), (1000, 50, "per_round"),
                                                        (16, 16, "always")])
def test_the_fleet_scenario_validates(devices, clients, trainers):
    sc = parse_scenario(scenario(devices, clients, trainers, 60, "mlp"))
    assert sc.n_workers == devices and sc.algorithm.params["trainers"] == trainers


def test_memory_readings_are_this_process_s():
    own = rollup(os.getpid())
    assert 0 < own["Private_Clean"] + own["Private_Dirty"] <= own["Rss"] and 0 < own["Pss"] <= own["Rss"]
    assert rollup(2**22 + 1) == {}  # no such process
    assert mem_used() > own["Rss"]
