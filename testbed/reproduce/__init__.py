"""The papers' headline figures and tables, one command each (`edgebed reproduce NAME`, `make NAME`).

An experiment is a base scenario per scale (`scenarios/<paper>/<experiment>.<scale>.yaml`, each a
scenario `edgebed up` runs as it is) and a list of series, each a set of changes to it (the
algorithm, a parameter, a rate set). `run_experiment` runs every series that has no finished
records yet, then the experiment's analysis reads the records only -- never a live run -- and
writes figures/<name>.png, .csv and .json (the paper's claim beside ours). `edgebed plot --figure`
and analysis/<name>.py call the same analysis on records that exist.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

REPO = Path(__file__).resolve().parents[2]
SCALES = ("ci", "paper")
PAPERS = ("adacomp", "adsp", "dlion", "scadles", "selsync")


@dataclass(frozen=True)
class Series:
    """One line of a figure (one run): a label and the changes to the base scenario (merged key by
    key; an `algorithm` with a `name` replaces the base's algorithm and its parameters whole)."""

    label: str
    overrides: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9.]+", "-", self.label.lower().replace("'", "-prime")).strip("-")


@dataclass
class Experiment:
    name: str  # the make target and CLI name, e.g. fig-adacomp-3
    paper: str
    title: str
    claim: str  # the paper's number and its conditions
    scenario: str  # path with {scale}, relative to the repository
    series: "list[Series] | Callable[[str], list[Series]]"  # or per scale
    analyze: Callable[["list[tuple[Series, Any]]", Path, str], dict]  # (series, records), out, scale -> headline
    expect: str = ""  # the effect ci scale must show (the wording)

    def scenario_path(self, scale: str) -> Path:
        return REPO / self.scenario.format(scale=scale)

    def series_at(self, scale: str) -> list[Series]:
        return self.series(scale) if callable(self.series) else self.series


EXPERIMENTS: dict[str, Experiment] = {}


def register(exp: Experiment) -> Experiment:
    EXPERIMENTS[exp.name] = exp
    return exp


def _load_all() -> None:
    import importlib

    for paper in PAPERS:  # each module registers its experiments
        importlib.import_module(f"{__name__}.{paper}")


def get_experiment(name: str) -> Experiment:
    _load_all()
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown figure '{name}' (known: {', '.join(sorted(EXPERIMENTS))})")
    return EXPERIMENTS[name]


def all_experiments() -> list[Experiment]:
    _load_all()
    return [EXPERIMENTS[k] for k in sorted(EXPERIMENTS)]


def deep_merge(base: dict, changes: dict) -> dict:
    """`changes` over `base`, dicts merged key by key (lists and scalars replaced)."""
    out = copy.deepcopy(base)
    for k, v in changes.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def series_scenarios(exp: Experiment, scale: str) -> list[tuple[Series, dict]]:
    """Each series' scenario, all validated before anything runs (bad input starts nothing)."""
    from ..scenario import ScenarioError, _resolve_event_traces, _resolve_trace_paths, parse_scenario

    if scale not in SCALES:
        raise ValueError(f"--scale: '{scale}' is not one of {', '.join(SCALES)}")
    path = exp.scenario_path(scale)
    if not path.exists():
        raise FileNotFoundError(f"{exp.name}: no {scale}-scale scenario ({path.relative_to(REPO)})")
    # relative trace files are the base scenario's, wherever the series' copy is written
    base = _resolve_event_traces(_resolve_trace_paths(yaml.safe_load(path.read_text()), path.parent), path.parent)
    out = []
    for s in exp.series_at(scale):
        data = deep_merge(base, s.overrides)
        if "name" in s.overrides.get("algorithm", {}):  # another algorithm: none of the base's parameters
            data["algorithm"] = copy.deepcopy(s.overrides["algorithm"])
        data["name"] = f"{base.get('name', exp.name)}-{s.slug}"
        try:
            parse_scenario(data)
        except ScenarioError as e:
            raise ScenarioError([f"{exp.name} series '{s.label}': {line}" for line in e.lines]) from None
        out.append((s, data))
    return out


def _digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _finished(run_dir: Path, digest: str) -> bool:
    try:
        mark = json.loads((run_dir / "reproduce.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return mark.get("digest") == digest and summary.get("status") in ("completed", "stopped")


def run_series(exp: Experiment, scale: str, runs_dir: Path, *, reuse: bool = True,
               say: Callable[[str], None] = print, runtime: Optional[str] = None) -> list[tuple[Series, Path]]:
    """Run each series that has no finished records of the same scenario under runs_dir."""
    import shutil

    todo = series_scenarios(exp, scale)
    out = []
    for s, data in todo:
        if runtime:
            data["runtime"] = runtime
        run_dir = (runs_dir / exp.name / scale / s.slug).resolve()
        digest = _digest(data)
        out.append((s, run_dir))
        if reuse and _finished(run_dir, digest):
            say(f"{exp.name} [{s.label}]: records of this scenario exist ({run_dir}), not run again")
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        scenario_file = run_dir.parent / f"{s.slug}.yaml"
        scenario_file.write_text(yaml.safe_dump(data, sort_keys=False))
        say(f"{exp.name} [{s.label}]: edgebed up {scenario_file.relative_to(REPO) if scenario_file.is_relative_to(REPO) else scenario_file}")
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "up", str(scenario_file), "--out", str(run_dir), "-q"],
                           cwd=REPO, capture_output=True, text=True)
        if r.returncode != 0 or not (run_dir / "summary.json").exists():
            raise RuntimeError(f"{exp.name} [{s.label}]: edgebed up failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout)[-1500:]}")
        (run_dir / "reproduce.json").write_text(json.dumps({"experiment": exp.name, "series": s.label, "scale": scale,
                                                            "digest": digest}))
        summary = json.loads((run_dir / "summary.json").read_text())
        say(f"{exp.name} [{s.label}]: {summary.get('status')} ({summary.get('reason')}) in {time.time() - t0:.0f} s, "
            f"best accuracy {summary.get('best_accuracy')}")
    return out


def analyze(exp: Experiment, runs: list[tuple[Series, Path]], out_dir: Path, scale: str,
            say: Callable[[str], None] = print) -> dict:
    """The experiment's figure/table from records only; writes out_dir/<name>.{png,csv,json}."""
    from ..records import load_run

    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = [(s, load_run(d)) for s, d in runs]
    result = exp.analyze(pairs, out_dir / exp.name, scale)
    meta = pairs[0][1].meta if pairs else {}
    report = {
        "experiment": exp.name, "paper": exp.paper, "title": exp.title, "claim": exp.claim, "expect": exp.expect,
        "scale": scale, "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {meta.get('host', {}).get('cpus', '?')} CPUs, runtime {meta.get('runtime')}",
        "command": f"make {exp.name} SCALE={scale}",
        "runs": {s.label: str(d) for s, d in runs},
        **result,
    }
    (out_dir / f"{exp.name}.json").write_text(json.dumps(report, indent=1, default=str))
    say(f"{exp.name}: wrote {out_dir / exp.name}.png/.csv/.json")
    for line in result.get("lines", []):
        say(f"  {line}")
    return report


def reproduce(name: str, *, scale: str = "ci", out_dir: Path = Path("figures"), runs_dir: Path = Path("runs/reproduce"),
              reuse: bool = True, runtime: Optional[str] = None, say: Callable[[str], None] = print) -> dict:
    exp = get_experiment(name)
    runs = run_series(exp, scale, Path(runs_dir), reuse=reuse, say=say, runtime=runtime)
    return analyze(exp, runs, Path(out_dir) / scale if scale != "ci" else Path(out_dir), scale, say=say)


def runs_of(name: str, root: Path, scale: str = "ci") -> list[tuple[Series, Path]]:
    """The series' run directories under an experiment's folder (for `edgebed plot --figure`)."""
    exp = get_experiment(name)
    base = Path(root)
    if (base / exp.name / scale).is_dir():
        base = base / exp.name / scale
    return [(s, base / s.slug) for s in exp.series_at(scale) if (base / s.slug).is_dir()]
