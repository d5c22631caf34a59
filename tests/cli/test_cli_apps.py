"""The command line as a package of apps (testbed/cli/): every command still there, in its
order, the runtimes its help offers taken from the registry, one exit rule for benchmarks, and
`python -m testbed.cli` the same command as `edgebed`."""

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from testbed.cli import app
from testbed.cli.common import exit_unless_ok
from testbed.runtimes import runtime_names

runner = CliRunner()

TOP = ["validate", "up", "build", "plot", "reproduce", "hosts", "place", "status", "down", "algorithms",
       "tensorboard", "models", "datasets", "devices", "kernel", "link", "cpu", "stress", "kill", "restart", "pause",
       "partition", "heal", "resume", "bench", "lab"]
BENCH = ["link", "loss", "delay", "startup", "fleet", "ddp", "flower-app", "stream", "topology", "cpu", "update",
         "overhead", "mininet", "flower", "stress", "wire", "all", "soak", "trace", "device"]


def _commands(group) -> list[str]:
    from typer import _click as click

    return list(group.list_commands(click.Context(group)))


def test_every_command_is_there_in_its_order():
    root = typer.main.get_command(app)
    assert _commands(root) == TOP
    assert _commands(root.get_command(None, "bench")) == BENCH
    assert _commands(root.get_command(None, "lab")) == ["up", "down"]


def _help(*args: str) -> str:
    res = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("args", [("up",), ("bench", "link"), ("bench", "startup")])
def test_runtime_help_names_every_registered_runtime(args):
    text = _help(*args)
    names = runtime_names()
    assert len(names) >= 3
    line = next(line for line in text.splitlines() if "--runtime" in line)
    assert all(n in line for n in names), line


def test_runtime_option_keeps_its_defaults():
    assert "[default: netns]" in next(line for line in _help("bench", "loss").splitlines() if "--runtime" in line)
    assert f"({', '.join(['auto', *runtime_names()])})" in next(line for line in _help("up").splitlines()
                                                                 if "--runtime" in line)


def test_exit_unless_ok_exits_1_on_any_result_out_of_bounds():
    exit_unless_ok({"ok": True}, {"ok": True})
    exit_unless_ok()
    with pytest.raises(typer.Exit) as e:
        exit_unless_ok({"ok": True}, {"ok": False})
    assert e.value.exit_code == 1


def test_a_benchmark_out_of_bounds_exits_1_and_a_refusal_2(monkeypatch):
    import testbed.bench.suite as suite
    from testbed.errors import HostCannot, RunFailed

    monkeypatch.setattr(suite, "mininet_benchmark", lambda *a, **k: {"ok": False})
    assert runner.invoke(app, ["bench", "mininet"]).exit_code == 1

    def refuse(*a, **k):
        raise HostCannot("no mininet here")

    monkeypatch.setattr(suite, "mininet_benchmark", refuse)
    res = runner.invoke(app, ["bench", "mininet"])
    assert res.exit_code == 2 and "error: no mininet here" in res.output

    def fail_midway(*a, **k):
        raise RunFailed("the probe ended\nwith two lines")

    monkeypatch.setattr(suite, "mininet_benchmark", fail_midway)
    res = runner.invoke(app, ["bench", "mininet"])
    assert res.exit_code == 1 and "error: the probe ended\nerror: with two lines" in res.output


def test_python_dash_m_is_the_edgebed_command():
    out = subprocess.run([sys.executable, "-m", "testbed.cli", "--help"], capture_output=True, text=True,
                         env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(f" {c} " in out.stdout for c in ("validate", "link", "resume", "bench", "lab"))


class _Result:
    def __init__(self, summary):
        self.summary = summary


@pytest.mark.parametrize("status, reason, code", [("completed", "steps", 0), ("failed", "a node died", 1),
                                                  ("stopped", "worker_loss", 3), ("stopped", "interrupted", 130)])
def test_up_runs_the_overridden_scenario_and_exits_by_its_outcome(monkeypatch, tmp_path, status, reason, code):
    from testbed.run import api

    seen = {}

    def fake_run(sc, run_dir, **kw):
        seen.update(sc=sc, run_dir=run_dir, **kw)
        return _Result({"status": status, "reason": reason, "final_accuracy": 0.5, "steps": 7, "wall_seconds": 2.0,
                        "ps_ingress_bytes": 3e6, "run_dir": str(run_dir)})

    monkeypatch.setattr(api, "run", fake_run)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nruntime: auto\nalgorithm: {name: ssp}\n")
    res = runner.invoke(app, ["up", str(scenario), "--out", str(tmp_path / "run"), "-q", "--runtime", "netns",
                              "--param", "staleness=2"])
    assert res.exit_code == code, res.output
    sc = seen["sc"]
    assert sc.runtime == "netns" and sc.algorithm.name == "ssp" and sc.algorithm.params == {"staleness": 2}
    assert seen["run_dir"] == tmp_path / "run" and seen["scenario_path"] == str(scenario)
    assert f"{status} ({reason}): final evaluation 0.5000, 7 steps, 2.0 s, PS ingress 3.00 MB" in res.output
