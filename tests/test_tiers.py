"""The test tiers (README, "Tests"): `make test-fast` (-m "not slow") leaves out every test that
brings something real up, marked by tests/conftest.py from what the test uses."""

import subprocess
import sys

import pytest
from conftest import REPO


def _collected(*args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [line for line in r.stdout.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def tiers() -> tuple[list[str], list[str]]:
    """The fast tier's tests and the real ones, each in the order they run."""
    return _collected("-m", "not slow"), _collected("-m", "real")


def test_the_fast_tier_has_no_real_run_and_keeps_the_unit_tests(tiers):
    fast, real = set(tiers[0]), set(tiers[1])
    assert not fast & real and len(real) >= 100
    assert {"tests/test_api.py::test_run_in_python_gives_the_records_as_dataframes",  # needs_root + clean_host
            "tests/test_swarm.py::test_hosts_lists_the_lab",  # the lab fixture
            "tests/test_plugins.py::test_the_listings_show_an_installed_plugin",  # the installed fixture
            "tests/test_swarm.py::test_a_command_cannot_remove_its_shaping_or_take_an_address_on_swarm",
            "tests/test_broker.py::test_tansu_roundtrip_between_namespaces",  # module marked root
            } <= real
    # a module's helper that runs `edgebed up` makes its callers real, through the helper
    assert {t for t in real if t.startswith("tests/test_algorithms_run.py::")} and not {
        t for t in fast if t.startswith(("tests/test_algorithms_run.py::", "tests/test_smoke_run.py::",
                                         "tests/test_netns_runtime.py::", "tests/test_dynamics_run.py::"))}
    assert {"tests/test_swarm.py::test_the_spread_puts_nodes_where_most_cpus_are_left",
            "tests/test_api.py::test_a_bad_change_is_one_line_naming_the_field",
            "tests/test_scenario.py::test_up_overrides_algorithm_and_params_with_field_errors",  # in-process refusals
            } <= fast


def test_the_labs_tests_run_last_together(tiers):
    """One lab for the session, up only while its tests run: they come after every other test."""
    order = tiers[1]
    first_lab = order.index("tests/test_ipsec.py::test_encrypt_on_the_lab_runs_only_where_every_kernel_has_esp_and_gcm")
    assert order.index("tests/test_swarm.py::test_hosts_lists_the_lab") > first_lab
    assert order.index("tests/test_tensorboard.py::test_a_run_writes_scalars_while_it_goes") < first_lab
    assert len(order) - first_lab == 12  # 2 in test_ipsec, 10 in test_swarm
