"""Tests for testbed.scenario.schema (schema, defaults, error lines) and `edgebed validate`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from testbed.cli import app
from testbed.plan import load_scenario, parse_scenario
from testbed.scenario.schema import Profile, Scenario, ScenarioError, scenario_to_yaml

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "scenarios" / "smoke.yaml"


def errors(data) -> list[str]:
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(data)
    lines = ei.value.lines
    assert lines, "ScenarioError without lines"
    assert str(ei.value) == "\n".join(lines)
    return lines


def only_line(data) -> str:
    lines = errors(data)
    assert len(lines) == 1, lines
    return lines[0]


# --------------------------------------------------------------------------- good files


def test_smoke_scenario_resolves():
    sc = load_scenario(SMOKE)
    assert isinstance(sc, Scenario)
    assert sc.name == "smoke" and sc.seed == 1
    assert sc.n_workers == 4
    assert sc.worker_names() == [("w0", 0), ("w1", 0), ("w2", 1), ("w3", 1)]
    assert sc.algorithm.name == "bsp"
    assert sc.workload.model == "adacomp_cnn" and sc.workload.lr == 0.1 and sc.workload.eval_interval == 10
    assert (sc.stop.steps, sc.stop.seconds, sc.stop.target_accuracy) == (400, 150.0, 0.92)

    slow = sc.profile_of(sc.workers[1].profile)
    assert slow is sc.profiles["edge-slow"]
    assert slow.cpus == 0.2
    up = slow.resolved_direction("uplink")
    down = slow.resolved_direction("downlink")
    assert up.rate == 20e6 and up.latency == pytest.approx(0.02)
    assert down.rate == 50e6 and down.latency == pytest.approx(0.02)
    assert up.jitter is None and up.loss is None

    fast = sc.profile_of(sc.workers[0].profile)
    assert fast.resolved_direction("uplink").rate == 50e6
    assert fast.resolved_direction("downlink").rate == 100e6
    assert fast.resolved_direction("uplink").latency == pytest.approx(0.005)

    dc = sc.profile_of(sc.ps.profile)
    assert dc is sc.profile_of(sc.evaluator.profile) is sc.profiles["datacenter"]
    # profile-wide bandwidth applies to both directions
    assert dc.resolved_direction("uplink").rate == 1e9
    assert dc.resolved_direction("downlink").rate == 1e9
    assert dc.resolved_direction("uplink").latency is None


def test_empty_mapping_gets_defaults():
    for data in ({}, None):
        sc = parse_scenario(data)
        assert sc.n_workers == 2
        assert [n for n, _ in sc.worker_names()] == ["w0", "w1"]
        assert sc.algorithm.name == "bsp" and sc.algorithm.params == {}
        assert sc.stop.steps == 200 and sc.stop.seconds is None and sc.stop.target_accuracy is None
        assert sc.runtime == "auto"
        assert sc.workload.model == "adacomp_cnn" and sc.workload.dataset == "mnist5k"
        assert sc.workload.partition == "iid"
        assert sc.profile_of(sc.ps.profile) == Profile()


def test_stop_with_only_seconds_gets_no_step_default():
    sc = parse_scenario({"stop": {"seconds": "90s"}})
    assert sc.stop.seconds == 90.0 and sc.stop.steps is None


def test_direction_shorthand_and_override():
    sc = parse_scenario({
        "profiles": {"p": {"bandwidth": "10mbit", "latency": "10ms", "jitter": "1ms", "loss": "1%",
                           "uplink": "2mbit", "downlink": {"latency": "30ms"}}},
        "workers": [{"count": 3, "profile": "p"}],
    })
    p = sc.profiles["p"]
    up, down = p.resolved_direction("uplink"), p.resolved_direction("downlink")
    assert (up.rate, up.latency, up.jitter, up.loss) == (2e6, pytest.approx(0.01), pytest.approx(0.001), 0.01)
    assert (down.rate, down.latency) == (1e7, pytest.approx(0.03))


def test_inline_profile_and_group_names():
    sc = parse_scenario({"workers": [{"count": 2, "name": "phone", "profile": {"cpus": 0.5, "memory": "512m"}},
                                     {"count": 1}]})
    assert [n for n, _ in sc.worker_names()] == ["phone0", "phone1", "w0"]
    prof = sc.profile_of(sc.workers[0].profile)
    assert prof.cpus == 0.5 and prof.memory == 512 * 1024**2


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_scenario_to_yaml_round_trips(path):
    sc = load_scenario(path)
    text = scenario_to_yaml(sc)
    again = parse_scenario(yaml.safe_load(text))
    assert again == sc
    assert scenario_to_yaml(again) == text


def test_scenario_to_yaml_round_trips_inline_profiles():
    sc = parse_scenario({"workers": [{"count": 2, "profile": {"uplink": {"rate": "5mbit", "latency": "40ms",
                                                                           "jitter": "5ms"}}}],
                         "stop": {"target_accuracy": 0.5}})
    again = parse_scenario(yaml.safe_load(scenario_to_yaml(sc)))
    assert again == sc
    assert again.profile_of(again.workers[0].profile).resolved_direction("uplink").rate == 5e6


# --------------------------------------------------------------------------- bad input: one line each


def test_bad_inline_bandwidth_names_the_field():
    line = only_line({"workers": [{"count": 1}, {"count": 1, "profile": {"bandwidth": "-5mbit"}}]})
    assert line.startswith("workers[1].profile.bandwidth: '-5mbit' is not a rate")


def test_bad_named_profile_rate():
    line = only_line({"profiles": {"edge": {"uplink": {"rate": "fast"}}}, "workers": [{"profile": "edge"}]})
    assert line.startswith("profiles.edge.uplink.rate: 'fast' is not a rate")


def test_bad_direction_shorthand_reports_rate():
    line = only_line({"workers": [{"profile": {"downlink": "10 furlongs"}}]})
    assert line.startswith("workers[0].profile.downlink.rate: '10 furlongs' is not a rate")


def test_ps_inline_profile_error():
    line = only_line({"ps": {"profile": {"latency": "-5ms"}}})
    assert line.startswith("ps.profile.latency: '-5ms' is not a duration")


@pytest.mark.parametrize(
    "data, prefix",
    [
        ({"profiles": {"p": {"loss": "150%"}}}, "profiles.p.loss: '150%' is not a fraction"),
        ({"profiles": {"p": {"memory": "lots"}}}, "profiles.p.memory: 'lots' is not a size"),
        ({"profiles": {"p": {"bandwidth": float("nan")}}}, "profiles.p.bandwidth: nan is not a rate"),
        ({"profiles": {"p": {"memory": float("inf")}}}, "profiles.p.memory: inf is not a size"),
        ({"profiles": {"p": {"latency": float("nan")}}}, "profiles.p.latency: nan is not a duration"),
        ({"profiles": {"p": {"cpuset": "a-b"}}}, "profiles.p.cpuset: 'a-b' is not a cpuset"),
        ({"profiles": {"p": {"gpus": -1}}}, "profiles.p.gpus: -1 is not a GPU count"),
        ({"stop": {"seconds": 0}}, "stop.seconds: '0' is not a duration"),
        ({"runtime": "vm"}, "runtime: unknown runtime 'vm' (known: auto, docker, netns, swarm)"),
        ({"network": {"subnet": "10.0.0.0/30"}}, "network.subnet: '10.0.0.0/30' is too small"),
        ({"network": {"subnet": "300.0.0.0/8"}}, "network.subnet: '300.0.0.0/8' is not an IPv4 subnet"),
        ({"name": "bad name!"}, "name: 'bad name!' is not a scenario name"),
        ({"workers": [{"name": "Phone"}]}, "workers[0].name: 'Phone' is not a group name"),
        ({"workload": {"batch_size": 0}}, "workload.batch_size:"),
        ({"workload": {"lr": -1}}, "workload.lr:"),
    ],
)
def test_field_errors(data, prefix):
    assert only_line(data).startswith(prefix)


def test_unknown_algorithm():
    line = only_line({"algorithm": {"name": "nope"}})
    assert line.startswith("algorithm.name:")
    assert "unknown algorithm 'nope'" in line and "asgd" in line and "bsp" in line


def test_unknown_model():
    line = only_line({"workload": {"model": "gpt5"}})
    assert line.startswith("workload.model:") and "unknown model 'gpt5'" in line and "adacomp_cnn" in line


def test_unknown_profile_name():
    line = only_line({"profiles": {"edge": {"cpus": 1}}, "workers": [{"profile": "egde"}]})
    assert line.startswith("workers[0].profile: unknown profile 'egde'")
    assert "edge" in line.split("unknown profile 'egde'")[1]


def test_unknown_profile_of_ps_and_evaluator():
    lines = errors({"ps": {"profile": "x"}, "evaluator": {"profile": "y"}})
    assert len(lines) == 2
    assert lines[0].startswith("ps.profile: unknown profile 'x'")
    assert lines[1].startswith("evaluator.profile: unknown profile 'y'")


def test_zero_workers():
    assert only_line({"workers": [{"count": 0}]}).startswith("workers[0].count:")
    assert only_line({"workers": []}).startswith("workers:")
    assert only_line({"workers": [{"count": 2}, {"count": -1}]}).startswith("workers[1].count:")


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"bogus": 1}, "bogus: unknown field"),
        ({"workload": {"modle": "mlp"}}, "workload.modle: unknown field"),
        ({"profiles": {"p": {"bandwith": "1mbit"}}}, "profiles.p.bandwith: unknown field"),
        ({"workers": [{"count": 1}, {"cnt": 2}]}, "workers[1].cnt: unknown field"),
        ({"workers": [{"profile": {"uplink": {"speed": "1mbit"}}}]}, "workers[0].profile.uplink.speed: unknown field"),
        ({"stop": {"epochs": 3}}, "stop.epochs: unknown field"),
    ],
)
def test_unknown_field(data, expected):
    assert only_line(data) == expected


def test_several_problems_give_several_lines():
    lines = errors({"bogus": 1, "workload": {"model": "nope"}, "workers": [{"count": 0}]})
    assert len(lines) == 3
    assert sorted(line.split(":")[0] for line in lines) == ["bogus", "workers[0].count", "workload.model"]


def test_bad_algorithm_params():
    assert only_line({"algorithm": {"name": "bsp", "params": {"foo": 1}}}) == "algorithm.params.foo: unknown field"
    assert only_line({"algorithm": {"name": "asgd", "params": {"bar": 2}}}) == "algorithm.params.bar: unknown field"


@pytest.mark.parametrize(
    "partition, needle",
    [("zipf", "unknown partition 'zipf'"), ("labels:x", "K must be an integer >= 1"),
     ("labels:0", "K must be an integer >= 1"), ("iid:3", "'iid' takes no argument")],
)
def test_bad_partition(partition, needle):
    line = only_line({"workload": {"partition": partition}})
    assert line.startswith("workload.partition:") and needle in line


def test_good_partitions():
    for spec in ("iid", "labels:2", "dirichlet:0.5"):
        assert parse_scenario({"workload": {"partition": spec}}).workload.partition == spec


@pytest.mark.parametrize(
    "dataset, needle",
    [("imagenet", "unknown dataset 'imagenet'"), ("mnist5k:3", "takes no argument"),
     ("idx", "needs a directory"), ("synthetic_cifar:abc", "must be an integer"),
     ("synthetic_cifar:5", "must be >= 10"), ("", "empty dataset spec")],
)
def test_bad_dataset(dataset, needle):
    line = only_line({"workload": {"dataset": dataset}})
    assert line.startswith("workload.dataset:") and needle in line


def test_test_size_with_fixed_split_dataset():
    line = only_line({"workload": {"dataset": "mnist", "test_size": 100}})
    assert line.startswith("workload.test_size:")


@pytest.mark.parametrize("value", [0, -1, "x", 4000])
def test_bad_eval_seconds_names_the_field(value):
    assert only_line({"workload": {"eval_seconds": value}}).startswith("workload.eval_seconds:")


def test_eval_seconds():
    assert parse_scenario({}).workload.eval_seconds is None  # by default: every eval_interval versions
    assert parse_scenario({"workload": {"eval_seconds": 5}}).workload.eval_seconds == 5.0
    assert parse_scenario({"workload": {"eval_seconds": "500ms"}}).workload.eval_seconds == 0.5


def test_jitter_without_latency_named_profile():
    lines = errors({"profiles": {"p": {"jitter": "5ms"}}})
    assert lines == ["profiles.p.uplink: jitter without latency", "profiles.p.downlink: jitter without latency"]
    # one direction only
    assert only_line({"profiles": {"p": {"uplink": {"jitter": "5ms"}}}}) == "profiles.p.uplink: jitter without latency"
    # latency inherited from the profile makes it fine
    parse_scenario({"profiles": {"p": {"latency": "10ms", "uplink": {"jitter": "5ms"}}}})


def test_jitter_without_latency_inline_profile():
    line = only_line({"workers": [{"count": 1}, {"profile": {"downlink": {"jitter": "2ms"}}}]})
    assert line == "workers[1].profile.downlink: jitter without latency"
    parse_scenario({"workers": [{"profile": {"latency": "5ms", "jitter": "2ms"}}]})


def test_cpu_period_sets_the_quotas_period():
    sc = parse_scenario({"profiles": {"p": {"cpus": 0.2, "cpu_period": "10ms"}}, "workers": [{"profile": "p"}]})
    assert sc.profiles["p"].cpu_period == pytest.approx(0.010)
    # 0.005 cores is under the kernel's 1 ms quota at 100 ms, and fine over a 1 s period
    parse_scenario({"profiles": {"p": {"cpus": 0.005, "cpu_period": "1s"}}})


@pytest.mark.parametrize("profile, line", [
    ({"cpu_period": "10ms"}, "profiles.p: cpu_period: a CFS period needs a quota (cpus)"),
    ({"cpus": 1, "cpu_period": "500us"}, "profiles.p: cpu_period: 0.5ms is outside the kernel's 1ms-1s"),
    ({"cpus": 1, "cpu_period": "2s"}, "profiles.p: cpu_period: 2000ms is outside the kernel's 1ms-1s"),
    ({"cpus": 0.005}, "profiles.p: cpus: 0.005 cores over a 100ms CFS period is a quota under the kernel's 1ms; "
                      "the least is 0.01 cores (a longer cpu_period allows less)"),
    ({"cpus": 0.05, "cpu_period": "10ms"}, "profiles.p: cpus: 0.05 cores over a 10ms CFS period"),
])
def test_cpu_period_errors_name_the_field(profile, line):
    assert only_line({"profiles": {"p": profile}}).startswith(line)


def test_cpu_event_quota_checked_against_the_nodes_period():
    data = {"profiles": {"p": {"cpus": 0.5, "cpu_period": "10ms"}}, "workers": [{"count": 2, "profile": "p"}],
            "events": [{"at": "5s", "target": "w1", "action": "cpu", "cpus": 0.05}]}
    assert only_line(data).startswith("events[0].cpus: 0.05 cores over a 10ms CFS period")
    data["events"][0]["cpus"] = 0.1
    parse_scenario(data)


def test_top_level_must_be_mapping():
    assert only_line([1, 2]) == "(top level): a scenario must be a mapping of fields"
    assert only_line("name: x").startswith("(top level):")


# --------------------------------------------------------------------------- files


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as ei:
        load_scenario(missing)
    assert len(ei.value.lines) == 1 and str(missing) in ei.value.lines[0]
    assert "no such scenario file" in ei.value.lines[0]


def test_directory_is_not_a_scenario_file(tmp_path):
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load_scenario(tmp_path)


def test_invalid_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nworkers: [\n  {count: 2\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(f)
    assert len(ei.value.lines) == 1
    line = ei.value.lines[0]
    assert line.startswith(f"{f}: not valid YAML")
    assert "line" in line


def test_load_scenario_reports_field_errors_from_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("workers:\n  - {count: 1}\n  - {count: 1, profile: {bandwidth: -5mbit}}\n")
    with pytest.raises(ScenarioError) as ei:
        load_scenario(str(f))
    assert ei.value.lines[0].startswith("workers[1].profile.bandwidth: '-5mbit' is not a rate")


def test_empty_file_gets_defaults(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing\n")
    sc = load_scenario(f)
    assert sc.n_workers == 2 and sc.stop.steps == 200


def test_yaml_float_spelling_of_rate(tmp_path):
    # YAML 1.1 reads `1e7` as a string; it still means 1e7 bit/s.
    f = tmp_path / "s.yaml"
    f.write_text("profiles:\n  p: {bandwidth: 1e7}\nworkers: [{profile: p}]\n")
    assert load_scenario(f).profiles["p"].bandwidth == 1e7


# --------------------------------------------------------------------------- CLI


runner = CliRunner()


def test_cli_validate_ok():
    res = runner.invoke(app, ["validate", str(SMOKE)])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("ok: smoke: 4 workers, algorithm bsp")


def test_cli_validate_bad_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("workers:\n  - {count: 1}\n  - {count: 1, profile: {bandwidth: -5mbit}}\n")
    res = runner.invoke(app, ["validate", str(f)])
    assert res.exit_code == 2
    assert "error: workers[1].profile.bandwidth: '-5mbit' is not a rate" in res.stderr
    assert "ok" not in res.stdout
    assert "Traceback" not in res.output


def test_cli_validate_missing_file(tmp_path):
    res = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2
    assert "no such scenario file" in res.stderr


def test_cli_algorithms():
    res = runner.invoke(app, ["algorithms"])
    assert res.exit_code == 0
    names = [line.split()[0] for line in res.stdout.splitlines() if line and not line.startswith(" ")]
    from testbed.strategies import strategies

    assert names == sorted(strategies()) and {"bsp", "asgd", "adacomp", "selsync"} <= set(names)
    assert "    c = 0.01" in res.stdout  # parameters with their defaults


def test_up_overrides_algorithm_and_params_with_field_errors(tmp_path: Path) -> None:
    """`up --algorithm/--param` swap the algorithm; bad values fail validation before anything starts."""
    runner = CliRunner()
    scen = str(REPO / "scenarios" / "dlion-p-compute.yaml")
    r = runner.invoke(app, ["up", scen, "--algorithm", "nope", "--out", str(tmp_path / "a")])
    assert r.exit_code != 0 and "algorithm.name: unknown algorithm 'nope'" in r.output
    r = runner.invoke(app, ["up", scen, "--param", "total_batch=-3", "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "algorithm.params.total_batch" in r.output
    r = runner.invoke(app, ["up", scen, "--algorithm", "gaia", "--param", "total_batch=64",
                            "--out", str(tmp_path / "c")])
    assert r.exit_code != 0 and "algorithm.params" in r.output  # gaia has no total_batch
    r = runner.invoke(app, ["up", scen, "--param", "oops", "--out", str(tmp_path / "d")])
    assert r.exit_code != 0 and "NAME=VALUE" in r.output
    assert not any((tmp_path / d).exists() for d in "abcd")  # nothing half-started
