"""The package's shape (issue: a layout that shows the architecture): no import cycle, imports
only downward through the layers, runtimes that start roles without importing them, short
functions. `python tests/architecture.py` prints the same measures."""
import architecture as arch


def test_no_import_cycles():
    assert arch.cycles() == []


def test_the_checker_finds_a_cycle_and_an_upward_import():
    graph = {"testbed.kernel.a": {"testbed.run.b"}, "testbed.run.b": {"testbed.kernel.a"}}
    assert arch.cycles(graph) == [["testbed.kernel.a", "testbed.run.b"]]
    assert arch.upward_imports(graph) == [("testbed.kernel.a", "testbed.run.b")]


def test_imports_follow_the_layer_order():
    assert arch.upward_imports() == []


def test_no_module_imports_another_modules_private_names():
    assert arch.private_imports() == []


def test_the_checker_finds_a_private_import(tmp_path, monkeypatch):
    (tmp_path / "testbed").mkdir()
    (tmp_path / "testbed" / "a.py").write_text("def _hidden():\n    pass\n")
    (tmp_path / "testbed" / "b.py").write_text("from testbed.a import _hidden\nimport testbed.a as a\na._hidden()\n")
    monkeypatch.setattr(arch, "PACKAGE", tmp_path / "testbed")
    assert arch.private_imports() == [("testbed.b", "testbed.a._hidden")]


def test_no_backend_imports_another_and_the_shared_rooms_import_none():
    assert arch.cross_backend_imports() == []


def test_the_checker_finds_a_cross_backend_import():
    graph = {"testbed.runtimes.swarm.runtime": {"testbed.runtimes.docker.nodes", "testbed.runtimes.swarm.hosts",
                                                "testbed.runtimes.engine.client"},
             "testbed.runtimes.control.hub": {"testbed.runtimes.netns.runtime"},
             "testbed.cli.lab": {"testbed.runtimes.swarm.lab"}}
    assert arch.cross_backend_imports(graph) == [("testbed.runtimes.control.hub", "testbed.runtimes.netns.runtime"),
                                                 ("testbed.runtimes.swarm.runtime", "testbed.runtimes.docker.nodes")]


def test_every_backend_is_a_folder_of_runtimes_named_as_its_entry_point():
    from importlib import metadata

    points = {e.name: e.value for e in metadata.entry_points(group="edgebed.runtimes")}
    assert set(arch.BACKENDS) <= set(points)
    for name in arch.BACKENDS:
        assert (arch.PACKAGE / "runtimes" / name / "__init__.py").is_file(), name
        assert points[name].startswith(f"testbed.runtimes.{name}."), points[name]


def test_runtimes_import_no_role():
    graph = arch.import_graph()
    found = [(m, t) for m, ts in graph.items() if m.startswith("testbed.runtimes") for t in ts
             if t.startswith("testbed.node.roles")]
    assert found == []


def test_role_targets_name_functions_that_exist():
    from testbed.node.roles import DECENTRALIZED_ROLES, PS_ROLES, resolve_target
    from testbed.runtimes.netns.runtime import STRESS_TARGET

    for target in {*PS_ROLES.values(), *DECENTRALIZED_ROLES.values(), STRESS_TARGET}:
        assert callable(resolve_target(target)), target
    assert PS_ROLES["ps"] != DECENTRALIZED_ROLES["ps"] and PS_ROLES["worker"] != DECENTRALIZED_ROLES["worker"]


def test_no_function_is_longer_than_80_lines():
    long = [(n, f) for n, f in arch.function_lengths() if n > arch.LONGEST_FUNCTION]
    assert long == []


def test_the_forkserver_preload_names_modules_that_exist():
    import importlib

    from testbed.run.runner import PRELOAD

    for name in PRELOAD:  # the forkserver skips a module it cannot import, silently
        importlib.import_module(name)


def test_every_role_a_plan_makes_has_a_target_or_runs_its_own_image():
    from typing import get_args

    from testbed.node.roles import FOREIGN_ROLES, role_target
    from testbed.plan.cluster import Role

    for role in get_args(Role):
        for decentralized in (False, True):
            assert role_target(role, decentralized) or role in FOREIGN_ROLES, role
