"""The test tiers (README, "Tests"): `make test-fast` (-m "not slow") leaves out every test that
brings something real up, marked by tests/conftest.py from what the test uses."""

import os
import subprocess
import sys

import pytest

from helpers import REPO

# run inside the collecting pytest: each test in the order it runs, with its tier marks (one
# collection of the whole suite instead of one a tier)
PRINT_TIERS = """
def pytest_collection_finish(session):
    for item in session.items:
        marks = ",".join(m for m in ("slow", "real") if item.get_closest_marker(m))
        print(f"TIER\\t{item.nodeid}\\t{marks}")
"""


@pytest.fixture(scope="module")
def tiers(tmp_path_factory) -> tuple[list[str], list[str]]:
    """The fast tier's tests (`-m "not slow"`) and the real ones (`-m real`), each in the order they run."""
    plugin = tmp_path_factory.mktemp("tiers")
    (plugin / "print_tiers.py").write_text(PRINT_TIERS)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "print_tiers"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                           str(plugin), os.environ.get("PYTHONPATH", "")]))})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [line.split("\t") for line in r.stdout.splitlines() if line.startswith("TIER\t")]
    fast = [nodeid for _, nodeid, marks in rows if "slow" not in marks.split(",")]
    real = [nodeid for _, nodeid, marks in rows if "real" in marks.split(",")]
    return fast, real


def test_the_fast_tier_has_no_real_run_and_keeps_the_unit_tests(tiers):
    fast, real = set(tiers[0]), set(tiers[1])
    assert not fast & real and len(real) >= 100
    assert {"tests/run/test_api.py::test_run_in_python_gives_the_records_as_dataframes",  # needs_root + clean_host
            "tests/lab/test_swarm.py::test_hosts_lists_the_lab",  # the lab fixture
            "tests/plugins/test_plugins.py::test_the_listings_show_an_installed_plugin",  # the installed fixture
            "tests/lab/test_swarm.py::test_a_command_cannot_remove_its_shaping_or_take_an_address_on_swarm",
            "tests/data/test_broker.py::test_tansu_roundtrip_between_namespaces",  # module marked root
            } <= real
    # a module's helper that runs `edgebed up` makes its callers real, through the helper
    assert {t for t in real if t.startswith("tests/runs/test_algorithms_run.py::")} and not {
        t for t in fast if t.startswith(("tests/runs/test_algorithms_run.py::", "tests/runs/test_smoke_run.py::",
                                         "tests/runtimes/netns/test_netns_runtime.py::",
                                         "tests/runs/test_dynamics_run.py::"))}
    assert {"tests/lab/test_swarm.py::test_the_spread_puts_nodes_where_most_cpus_are_left",
            "tests/run/test_api.py::test_a_bad_change_is_one_line_naming_the_field",
            # in-process refusals
            "tests/scenario/test_scenario.py::test_up_overrides_algorithm_and_params_with_field_errors",
            } <= fast


def test_the_labs_tests_run_last_together(tiers):
    """One lab for the session, up only while its tests run: they come after every other test."""
    order = tiers[1]
    first_lab = order.index("tests/lab/test_ipsec.py::"
                            "test_encrypt_on_the_lab_runs_only_where_every_kernel_has_esp_and_gcm")
    assert order.index("tests/lab/test_swarm.py::test_hosts_lists_the_lab") > first_lab
    assert order.index("tests/records/test_tensorboard.py::test_a_run_writes_scalars_while_it_goes") < first_lab
    assert len(order) - first_lab == 13  # 2 in test_ipsec, 10 in test_swarm, 1 in test_swarm_fleet
