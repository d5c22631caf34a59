"""One error root (testbed/errors.py): every error class of edgebed is in a family and keeps its
builtin base, no bare RuntimeError is raised, and the command line maps a family to its exit code."""
import ast
import importlib
from pathlib import Path

import pytest

from testbed import errors
from testbed.errors import BadInput, EdgebedError, HostCannot, MessageRefused, RunFailed

PACKAGE = Path(__file__).resolve().parents[2] / "testbed"
NOT_ERRORS = {"testbed.run.interrupts.Interrupted"}  # a signal that the run was torn down, not an error


def _exception_classes() -> dict[str, type]:
    """Every class of testbed/ that derives from BaseException, by its dotted name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                 and any(isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Refused", "Unavailable",
                                                                      "Failed", "Cannot", "Input", "NotFound"))
                                                       or b.id in ("BaseException",)) for b in n.bases)]
        if not names:
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        mod = importlib.import_module(module)
        for name in names:
            cls = getattr(mod, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found[f"{module}.{name}"] = cls
    return found


def test_every_error_class_is_in_one_family():
    classes = _exception_classes()
    assert len(classes) >= 28
    families = (BadInput, HostCannot, RunFailed, MessageRefused)
    outside = sorted(n for n, c in classes.items() if n not in NOT_ERRORS and c not in (EdgebedError, *families)
                     and not issubclass(c, families))
    assert outside == []


@pytest.mark.parametrize("name, builtin", [
    ("testbed.scenario.checks.ScenarioError", ValueError), ("testbed.scenario.units.UnitError", ValueError),
    ("testbed.kernel.cgroups.CgroupError", RuntimeError), ("testbed.kernel.bpf.BpfError", OSError),
    ("testbed.records.reader.RunNotFound", FileNotFoundError), ("testbed.run.live.ControlError", RuntimeError),
    ("testbed.node.untrusted.Refused", ValueError), ("testbed.runtimes.errors.RuntimeUnavailable", RuntimeError),
    ("testbed.node.wire.WireError", ValueError), ("testbed.plugins.PluginError", ValueError)])
def test_a_re_based_class_keeps_the_builtin_base_its_callers_catch(name, builtin):
    module, cls = name.rsplit(".", 1)
    c = getattr(importlib.import_module(module), cls)
    assert issubclass(c, builtin) and issubclass(c, EdgebedError)


def test_a_bpf_error_still_carries_its_errno():
    from testbed.kernel.bpf import BpfError

    e = BpfError(1, "BPF_PROG_LOAD: Operation not permitted")
    assert e.errno == 1 and isinstance(e, HostCannot)


def test_no_bare_runtime_error_is_raised():
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name) \
                    and node.exc.func.id == "RuntimeError":
                bare.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert bare == []


def test_each_family_has_its_exit_code_and_its_lines():
    assert [errors.exit_code(e) for e in (BadInput("x"), HostCannot("x"), RunFailed("x"), MessageRefused("x"))] \
        == [errors.EXIT_REFUSED, errors.EXIT_REFUSED, errors.EXIT_FAILED, errors.EXIT_FAILED] == [2, 2, 1, 1]
    assert (errors.EXIT_OK, errors.EXIT_STOPPED, errors.EXIT_INTERRUPTED) == (0, 3, 130)
    from testbed.scenario.checks import ScenarioError

    assert errors.error_lines(ScenarioError(["workers[0].count: must be positive", "stop: give one"])) == \
        ["workers[0].count: must be positive", "stop: give one"]
    assert errors.error_lines(RunFailed("a\nb")) == ["a", "b"]


def test_every_command_catches_the_root_once(monkeypatch):
    """A command of any app that raises an edgebed error prints its lines and exits with its code."""
    from typer.testing import CliRunner

    from testbed import cli
    from testbed.run import live as run_live

    def refuse(*a, **k):
        raise run_live.ControlError("no edgebed run is up on this machine")

    monkeypatch.setattr(run_live, "request", refuse)
    res = CliRunner().invoke(cli.app, ["kill", "w1"])
    assert res.exit_code == 2 and res.output.strip().endswith("error: no edgebed run is up on this machine")
    commands = [*cli.app.registered_commands, *cli.bench.bench_app.registered_commands,
                *cli.lab.lab_app.registered_commands]
    assert commands and all(getattr(c.callback, "__wrapped__", None) for c in commands)
