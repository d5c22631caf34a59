"""Data injection's arithmetic: who shares at a step, Eq. 3's local batch, the per-step quota."""

import pytest

from testbed.node.roles.injection import local_batch, sharing_workers
from testbed.plan import parse_scenario
from testbed.scenario.schema import Injection


def test_sharing_subset_is_the_same_everywhere_and_ceil_alpha_n():
    workers = [f"w{i}" for i in range(10)]
    a = sharing_workers(workers, 0.25, seed=7, step=12)
    assert a == sharing_workers(list(reversed(workers)), 0.25, seed=7, step=12)  # every worker agrees
    assert len(a) == 3 and set(a) <= set(workers)  # ceil(0.25 * 10)
    subsets = {tuple(sharing_workers(workers, 0.25, 7, s)) for s in range(50)}
    assert len(subsets) > 20  # a fresh random subset each step
    counts = {w: sum(w in sharing_workers(workers, 0.25, 7, s) for s in range(2000)) for w in workers}
    assert all(c == pytest.approx(600, rel=0.15) for c in counts.values())  # each shares 30% of steps
    assert len(sharing_workers(workers, 0.01, 7, 1)) == 1  # at least one


def test_local_batch_eq3_and_knob():
    # Eq. 3: b' = b / (1 + alpha*beta*N): 32 / (1 + 0.25 * 4) = 16; 32 / (1 + 0.25 * 16) = 6.4
    assert local_batch(Injection(alpha=0.5, beta=0.5), 32, 4) == 16
    assert local_batch(Injection(alpha=0.5, beta=0.5), 32, 16) == 6
    assert local_batch(Injection(alpha=0.5, beta=0.5, local_batch=11), 32, 16) == 11  # the paper's b'
    assert local_batch(Injection(alpha=0.5, beta=0.5, local_batch="same"), 32, 16) == 32


def test_injection_validation_names_the_field():
    from testbed.scenario.schema import ScenarioError

    with pytest.raises(ScenarioError, match="workload.injection.alpha"):
        parse_scenario({"name": "x", "workload": {"injection": {"alpha": 1.5, "beta": 0.5}}})
    with pytest.raises(ScenarioError, match="workload.injection"):
        parse_scenario({"name": "x", "workload": {"injection": {"alpha": 0.5, "beta": 0.5}},
                        "algorithm": {"name": "dlion"}})
