"""Scenario and trace files written carelessly or with intent: every problem is one line naming
the field or the file, nothing is echoed at length, nothing runs out of memory."""
import pytest

from testbed.plan import load_scenario, parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.scenario.schema import ScenarioError
from testbed.scenario.traces import read_link_trace


def laughs(levels: int) -> bytes:
    """A YAML "billion laughs": each level 9 aliases of the one before."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    names = "abcdefghijklmnop"
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip(names, names[1:levels + 1])]
    return ("\n".join(lines) + "\n").encode()


def only_line(path_or_data) -> str:
    with pytest.raises(ScenarioError) as e:
        load_scenario(path_or_data) if not isinstance(path_or_data, dict) else parse_scenario(path_or_data)
    assert len(e.value.lines) == 1, e.value.lines
    return e.value.lines[0]


@pytest.mark.parametrize("content,needle", [
    (b"name: caf\xe9\n", "not UTF-8 text (byte 9)"),
    (b"\x00\x01\x02binary", "not valid YAML: a control character"),
    (b"[" * 200 + b"]" * 200, "nested deeper than 32 levels"),
    (b"name: a\nseed: 1\nname: b\n", "duplicate key 'name' (line 3, column 1)"),
    (laughs(12), "more than 100 aliases"),
    (b"x: " + b"y" * (2 << 20), "larger than 1 MiB"),
    (b"- a\n- b\n", "(top level): a scenario must be a mapping of fields"),
])
def test_bad_files_give_one_line(tmp_path, content, needle):
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    line = only_line(path)
    assert needle in line and len(line) < 300, line


def test_aliases_that_expand_too_far_are_refused_without_expanding(tmp_path):
    (tmp_path / "s.yaml").write_bytes(laughs(5))  # 45 aliases, 9^6 = 531,441 values
    assert "more than 100000 values once its aliases are expanded" in only_line(tmp_path / "s.yaml")


def test_a_few_aliases_still_work(tmp_path):
    (tmp_path / "s.yaml").write_text("profiles:\n  edge: &edge {cpus: 0.5, bandwidth: 10mbit}\n  edge2: *edge\n")
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.profiles["edge2"].bandwidth == 10e6


def test_a_long_bad_value_is_not_echoed():
    line = only_line({"profiles": {"p": {"bandwidth": "x" * 100_000}}})
    assert line.startswith("profiles.p.bandwidth:") and len(line) < 300, line[:400]


@pytest.mark.parametrize("data,field,needle", [
    ({"profiles": {"p": {"bandwidth": "1e30mbit"}}}, "profiles.p.bandwidth", "above the most edgebed takes"),
    ({"profiles": {"p": {"latency": "1e9s"}}}, "profiles.p.latency", "(60s)"),
    ({"profiles": {"p": {"memory": "1e20b"}}}, "profiles.p.memory", "above the most"),
    ({"stop": {"seconds": "1e30s"}}, "stop.seconds", "above the most"),
    ({"network": {"subnet": "224.1.0.0/16"}}, "network.subnet", "multicast"),
    ({"network": {"subnet": "127.0.0.0/8"}}, "network.subnet", "loopback"),
    ({"network": {"subnet": "169.254.0.0/16"}}, "network.subnet", "link-local"),
    ({"seed": -1}, "seed", "greater than or equal to 0"),
    ({"seed": 10 ** 29}, "seed", "less than or equal to 2147483647"),
    ({"workers": [{"count": 10_000, "name": f"g{chr(97 + i // 26)}{chr(97 + i % 26)}"} for i in range(6)]}, "workers",
     "60000 workers in all; a run takes at most 10000"),
    # (1,023 workers on one bridge: runtime docker's and swarm's refusal, tests/kernel/test_bridges.py)
    ({"workload": {"dataset": "synthetic_cifar:1000000000000"}}, "workload.dataset", "at most 1,000,000"),
    ({"network": {"subnet": "10.9.0.0/29"}, "workers": [{"count": 3}], "streaming": {"broker": {"kind": "tansu"}}},
     "network.subnet", "too few addresses for 6 nodes"),  # ps, eval, 3 workers and the broker
])
def test_values_beyond_their_bounds_are_refused_naming_the_field(data, field, needle):
    line = only_line({"runtime": "netns", **data})
    assert line.startswith(field) and needle in line, line


def test_as_many_nodes_as_a_bridge_holds_pass():
    sc = parse_scenario({"runtime": "netns", "workers": [{"count": 1020}]})  # 1,022 nodes and the runner
    assert len(sc.node_names()) == 1022


def test_a_slash_29_still_fits_what_it_can():
    sc = parse_scenario({"runtime": "netns", "network": {"subnet": "10.9.0.0/29"}, "workers": [{"count": 3}]})
    build_cluster(sc, "abcdef")  # 5 nodes and the gateway: every address of the /29


def test_trace_errors_never_quote_the_file(tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("root:x:0:0:secret-password:/root:/bin/bash\n0,notarate\n")
    with pytest.raises(ValueError) as e:
        read_link_trace(secret)
    assert "secret-password" not in str(e.value) and "notarate" not in str(e.value) and "line 2" in str(e.value)


def test_trace_files_that_never_end_or_explode_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        read_link_trace("/dev/zero")
    huge = tmp_path / "huge.up"
    huge.write_text("99999999999999\n")  # 14 bytes that would be 10^11 seconds of counts
    with pytest.raises(ValueError, match="line 1: the time is not within 0 and 604800 s"):
        read_link_trace(huge)
    big = tmp_path / "big.csv"
    big.write_bytes(b"0,1mbit\n" * (3 << 20))
    with pytest.raises(ValueError, match="larger than 16 MiB"):
        read_link_trace(big)


def test_an_unsorted_mahimahi_trace_is_counted_per_second(tmp_path):
    t = tmp_path / "lte.up"
    t.write_text("2500\n10\n1200\n20\n")
    assert read_link_trace(t) == [(0.0, 24000.0, None), (1.0, 12000.0, None), (2.0, 12000.0, None)]


def _scenario_with_traces(folder, link_trace: str, rate_trace: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s.yaml"
    path.write_text(f"name: s\nruntime: netns\nworkers: [{{count: 1}}]\n"
                    f"streaming: {{rates: [{{trace: {rate_trace}}}]}}\n"
                    f"events:\n  - {{at: 1, target: w0, action: link, trace: {link_trace}}}\n")
    return path


def test_traces_are_read_from_the_scenarios_folder_only(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "link.csv").write_text("0,1mbit\n")
    (tmp_path / "mine" / "traces").mkdir(parents=True)
    (tmp_path / "mine" / "traces" / "rate.csv").write_text("time,rate\n0,10\n")
    (tmp_path / "mine" / "link-alias.csv").symlink_to(tmp_path / "elsewhere" / "link.csv")
    for link in ("../elsewhere/link.csv", str(tmp_path / "elsewhere" / "link.csv"), "link-alias.csv", "/etc/passwd"):
        line = only_line(_scenario_with_traces(tmp_path / "mine", link, "traces/rate.csv"))
        assert line.startswith("events[0].trace: ") and "is outside the scenario's folder" in line, line
        assert "--trace-dir" in line and "root:" not in line
    line = only_line(_scenario_with_traces(tmp_path / "mine", "traces/rate.csv", "/etc/hostname"))
    assert line.startswith("streaming.rates[0].trace: ") and "outside" in line


def test_a_trace_dir_lets_a_scenario_read_traces_from_another_folder(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "link.csv").write_text("0,1mbit\n5,2mbit\n")
    (tmp_path / "shared" / "rate.csv").write_text("time,rate\n0,10\n")
    path = _scenario_with_traces(tmp_path / "mine", "../shared/link.csv", str(tmp_path / "shared" / "rate.csv"))
    sc = load_scenario(path, trace_dirs=[tmp_path / "shared"])
    assert sc.events[0].trace == str((tmp_path / "shared" / "link.csv").resolve())
    assert sc.streaming.rates[0] == {"trace": str(tmp_path / "shared" / "rate.csv")}


def test_validate_names_the_trace_field_and_takes_a_trace_dir(tmp_path):
    from typer.testing import CliRunner

    from testbed.cli import app

    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "link.csv").write_text("0,1mbit\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "rate.csv").write_text("time,rate\n0,10\n")
    path = _scenario_with_traces(tmp_path / "mine", "../shared/link.csv", "rate.csv")
    refused = CliRunner().invoke(app, ["validate", str(path)])
    assert refused.exit_code == 2 and "error: events[0].trace: " in refused.output and "outside" in refused.output
    ok = CliRunner().invoke(app, ["validate", str(path), "--trace-dir", str(tmp_path / "shared")])
    assert ok.exit_code == 0 and ok.output.startswith("ok: s: 1 workers"), ok.output
