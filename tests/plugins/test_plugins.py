"""Plugins (testbed.plugins): strategies, models and datasets by entry point name or import path,
edgebed's own through the same groups; bad plugin input is one line naming the field, before
anything starts; examples/plugin installed with pip and run on the netns runtime."""

import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from testbed import plugins
from testbed.plan import parse_scenario
from testbed.runtimes.preflight import plugin_problems
from testbed.scenario.schema import ScenarioError

from helpers import REPO, _client, edgebed_cmd, needs_root, run_up, write_scenario

EXAMPLE = REPO / "examples" / "plugin"


def _scenario(**workload_and_algorithm) -> dict:
    algorithm = workload_and_algorithm.pop("algorithm", {"name": "asgd"})
    return {"workload": {"model": "mlp", "dataset": "digits", **workload_and_algorithm}, "algorithm": algorithm,
            "workers": [{"count": 2}]}


def _lines(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    return e.value.lines


def test_edgebeds_own_register_through_the_entry_point_groups():
    assert {"bsp", "asgd", "adacomp", "scadles", "selsync", "adsp", "dlion", "gaia", "ako"} <= \
        set(plugins.registered("algorithm"))
    assert {"adacomp_cnn", "mlp", "resnet_small", "dlion_cnn"} <= set(plugins.registered("model"))
    assert {"mnist5k", "digits", "mnist", "fashion_mnist", "idx", "cifar10", "synthetic_cifar"} <= \
        set(plugins.registered("dataset"))
    assert all(ep.value.startswith("testbed.") for ep in plugins.registered("model").values()
               if ep.name in ("mlp", "adacomp_cnn"))


def test_the_forkserver_reads_the_registries_once_and_loads_edgebeds_own_plugins_only(monkeypatch):
    """data/plugin_preload.py, as the forkserver imports it: every group read (a fork finds the
    cache filled), the run's algorithm, model and dataset loaded when they are edgebed's, and a
    user's package's plugin not imported there (its code runs in the nodes only)."""
    import importlib

    from testbed.data import plugin_preload

    loaded = []

    class Entry:
        def __init__(self, name, module):
            self.name, self.module = name, module

        def load(self):
            loaded.append(self.name)

    fake = {"algorithm": {"fedavg": Entry("fedavg", "testbed.strategies.fedavg"),
                          "theirs": Entry("theirs", "theirpkg.algo")},
            "model": {"adacomp_cnn": Entry("adacomp_cnn", "testbed.data.models")}, "dataset": {}}
    read = []
    monkeypatch.setattr(plugins, "registered", lambda kind: read.append(kind) or fake[kind])
    monkeypatch.setenv(plugin_preload.ENV, "")  # unset again after the test (request() sets it)
    plugin_preload.request({"algorithm": "fedavg", "model": "adacomp_cnn", "dataset": "mnist5k"})
    importlib.reload(plugin_preload)
    assert set(read) == set(plugins.GROUPS) and loaded == ["fedavg", "adacomp_cnn"]
    loaded.clear()
    plugin_preload.request({"algorithm": "theirs"})
    importlib.reload(plugin_preload)
    assert loaded == []
    plugin_preload.request({"algorithm": ["not", "a", "name"]})  # never raises in the forkserver
    importlib.reload(plugin_preload)


def test_a_plugin_named_by_import_path_is_validated_like_a_builtin(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sc = parse_scenario(_scenario(model="edgebed_example.models:tiny_cnn", dataset="edgebed_example.data:stripes",
                                  algorithm={"name": "edgebed_example.signsgd:SignSGD", "params": {"lr_scale": 0.5}}))
    assert sc.algorithm.name == "edgebed_example.signsgd:SignSGD"
    assert plugin_problems(sc) == []  # the dataset loads, the model gives (2, 4) logits for it
    assert _lines(_scenario(algorithm={"name": "edgebed_example.signsgd:SignSGD", "params": {"lr_scale": -1}})) == \
        ["algorithm.params.lr_scale: Input should be greater than 0"]


@pytest.mark.parametrize("field, value, line", [
    ("algorithm", "no_such_module:Thing",
     "algorithm.name: cannot import module 'no_such_module' (ModuleNotFoundError: No module named 'no_such_module'); "
     "install its package (pip install -e DIR) or put its folder on PYTHONPATH"),
    ("algorithm", "testbed.data.models:mlp",
     "algorithm.name: 'testbed.data.models:mlp' is not a strategy (a subclass of testbed.strategies.Strategy)"),
    ("algorithm", "testbed.strategies.bsp:Nope", "algorithm.name: module 'testbed.strategies.bsp' has no 'Nope'"),
    ("algorithm", "sgd", "algorithm.name: unknown algorithm 'sgd' (known: "),
    ("model", "no_such_module:net", "workload.model: cannot import module 'no_such_module'"),
    ("model", "vgg", "workload.model: unknown model 'vgg' (known: "),
    ("dataset", "no_such_module:load", "workload.dataset: cannot import module 'no_such_module'"),
])
def test_a_bad_name_is_one_line_naming_the_field(field, value, line):
    data = _scenario(algorithm={"name": value}) if field == "algorithm" else _scenario(**{field: value})
    lines = _lines(data)
    assert len(lines) == 1 and lines[0].startswith(line), lines


BAD = textwrap.dedent("""
    import numpy as np
    from torch import nn

    def data(arg=None, *, seed=0, test_size=None):
        x = np.zeros((8, 1, 12, 12), np.float32)
        y = np.arange(8) % 4
        return x, y, x, y

    def wrong_shape(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(144, 3))

    def batchnorm(input_shape, num_classes):
        return nn.Sequential(nn.BatchNorm2d(1), nn.Flatten(), nn.Linear(144, num_classes))

    def not_a_module(input_shape, num_classes):
        return "a model"

    def garbage(arg=None, *, seed=0, test_size=None):
        return "not data"
""")


@pytest.mark.parametrize("model, dataset, line", [
    ("bad_plugin:wrong_shape", "bad_plugin:data",
     "workload.model: 'bad_plugin:wrong_shape' returns shape (2, 3) for 2 samples of 1x12x12, expected (2, 4)"),
    ("bad_plugin:batchnorm", "bad_plugin:data", "workload.model: 'bad_plugin:batchnorm' has buffers (0.running_mean"),
    ("bad_plugin:not_a_module", "bad_plugin:data",
     "workload.model: 'bad_plugin:not_a_module' returned a str, not a torch.nn.Module"),
    ("mlp", "bad_plugin:garbage", "workload.dataset: dataset 'bad_plugin:garbage' returned a str: expected a Dataset"),
])
def test_a_plugin_that_gives_the_wrong_thing_is_refused_before_anything_starts(tmp_path, monkeypatch, model,
                                                                                dataset, line):
    (tmp_path / "bad_plugin.py").write_text(BAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = plugin_problems(parse_scenario(_scenario(model=model, dataset=dataset)))
    assert len(problems) == 1 and problems[0].startswith(line), problems


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """examples/plugin installed with pip (into a folder of its own, put on PYTHONPATH: the test
    environment stays as it was); an environment for edgebed commands that see it."""
    import shutil

    target, source = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))  # pip builds in place
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "setuptools" in r.stderr:
        pytest.skip(f"pip cannot build the example without setuptools: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def test_the_listings_show_an_installed_plugin(installed):
    out = {}
    for what in ("algorithms", "models", "datasets"):
        r = subprocess.run(edgebed_cmd() + [what], capture_output=True, text=True, env=installed, timeout=120)
        assert r.returncode == 0, r.stderr
        out[what] = r.stdout
    assert "signsgd    signSGD with majority vote" in out["algorithms"] and "lr_scale = 1.0" in out["algorithms"]
    assert "tiny_cnn" in out["models"] and "stripes" in out["datasets"]


@needs_root
def test_the_example_plugin_trains_on_the_netns_runtime(installed, tmp_path, clean_host):
    """signSGD (int8 signs on the wire), the tiny CNN and the stripes dataset, all from the
    installed package by their entry point names."""
    run_dir = tmp_path / "run"
    run_up(EXAMPLE / "scenario.yaml", run_dir, "--runtime", "netns", "-q", env=installed, timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["best_accuracy"] > 0.6  # 4 classes: chance is 0.25
    rounds = pd.read_csv(run_dir / "server.csv").payload_bytes.dropna()  # a BSP round's pushes, all 4 workers'
    assert len(rounds) > 10 and rounds.max() <= 4 * 116  # tiny_cnn's 116 parameters, a sign byte each (float32: 4x)


def test_a_plugin_on_the_docker_or_swarm_runtime_is_refused_naming_the_field(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sc = parse_scenario({**_scenario(algorithm={"name": "edgebed_example.signsgd:SignSGD"}), "runtime": "docker"})
    assert plugin_problems(sc) == ["algorithm.name: 'edgebed_example.signsgd:SignSGD' is a plugin, and runtime "
                                   "docker's nodes run edgebed's image: name the package that holds it in "
                                   "`packages:` (it is installed into the image)"]


def test_packages_must_be_packages_and_docker_needs_them_for_a_plugin(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    data = {**_scenario(algorithm={"name": "edgebed_example.signsgd:SignSGD"}), "runtime": "docker"}
    assert plugin_problems(parse_scenario({**data, "packages": [str(tmp_path)]})) == [
        f"packages.0: {tmp_path} is neither a folder with a pyproject.toml or setup.py nor a wheel"]
    assert plugin_problems(parse_scenario({**data, "packages": [str(EXAMPLE)]})) == []
    assert plugin_problems(parse_scenario({**data, "runtime": "swarm", "packages": [str(EXAMPLE)]}))[0].startswith(
        "algorithm.name: 'edgebed_example.signsgd:SignSGD' is a plugin, and runtime swarm's nodes")


@needs_root
def test_the_example_plugin_trains_on_the_docker_runtime_from_its_package(installed, tmp_path, clean_host):
    """`packages: [examples/plugin]`: installed into a layer over the node image, used by every
    container (the runner, too, needs it: the same package installed here)."""
    import yaml
    _client()  # skips without an engine

    data = yaml.safe_load((EXAMPLE / "scenario.yaml").read_text())
    data.update(runtime="docker", packages=[str(EXAMPLE)], stop={"seconds": 15})
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", env=installed, timeout=600)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["runtime"] == "docker" and meta["nodes"]["w0"]["image"].startswith("edgebed/node:u-")
    rounds = pd.read_csv(run_dir / "server.csv").payload_bytes.dropna()
    assert len(rounds) > 5 and rounds.max() <= 4 * 116
