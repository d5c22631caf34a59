"""The papers' headline figures and tables, one command each (`edgebed reproduce NAME`, `make NAME`).

An experiment is a base scenario per scale (`scenarios/<paper>/<experiment>.<scale>.yaml`, each a
scenario `edgebed up` runs as it is) and a list of series, each a set of changes to it (the
algorithm, a parameter, a rate set). Every series runs once per seed (`--seeds N`: the base
scenario's seed and the N-1 after it; the seed sets data order, partition, stream rates and crash
draws). `run_series` runs each one that has no finished records yet; then the experiment's
analysis reads the records only -- never a live run -- once per seed, and `analyze` gathers the
seeds: figures/<name>.png (mean curve, min-max band, each criterion's per-seed values), .csv and
.json (every seed's numbers, the claim beside ours, and the verdict of the criteria the experiment
declared before it ran). `edgebed plot --figure` and analysis/<name>.py call the same analysis on
records that exist.
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
from typing import Any, Callable, Optional, Union

import yaml

from testbed.errors import RunFailed
from testbed.reproduce.provenance import changed_files, code_digest
from testbed.reproduce.seeds import Panel
from testbed.reproduce.verdict import NOT_JUDGED, Criterion, combine, judge

REPO = Path(__file__).resolve().parents[2]
SCALES = ("ci", "paper", "paper-200")  # paper-200: AdaComp Fig. 3 with the paper's 200 workers on this machine
DEFAULT_SEEDS = 3  # the published numbers: every series with 3 seeds
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
    # one seed: (series, records), out, scale -> headline
    analyze: Callable[["list[tuple[Series, Any]]", Path, str], dict]
    expect: str = ""  # the effect ci scale must show, in words
    # decided before the run: what each seed's headline is judged by (verdict.py), and how to read it
    criteria: "tuple[Criterion, ...]" = ()
    metrics: Callable[[dict, str], dict] = lambda result, scale: {}  # one seed's headline -> {criterion key: value}
    # the band figure (or per scale); default accuracy vs seconds
    panels: "tuple[Panel, ...] | Callable[[str], tuple]" = ()
    seeds: int = DEFAULT_SEEDS  # how many seeds its verdict is decided over, where --seeds does not say

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
    from testbed.plan import parse_scenario
    from testbed.scenario.schema import ScenarioError, read_scenario_file

    if scale not in SCALES:
        raise ValueError(f"--scale: '{scale}' is not one of {', '.join(SCALES)}")
    path = exp.scenario_path(scale)
    if not path.exists():
        raise FileNotFoundError(f"{exp.name}: no {scale}-scale scenario ({path.relative_to(REPO)})")
    # relative trace files are the base scenario's, wherever the series' copy is written
    base = read_scenario_file(path)
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


def _mark(run_dir: Path) -> dict:
    """What a run's reproduce.json says of it ({} where it has none, or not a mapping)."""
    try:
        mark = json.loads((Path(run_dir) / "reproduce.json").read_text())
    except (OSError, ValueError):
        return {}
    return mark if isinstance(mark, dict) else {}


def _finished(run_dir: Path, digest: str, code: dict) -> Optional[str]:
    """"same code", "other code" (finished records of this scenario that other code made), or None."""
    mark = _mark(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if mark.get("digest") != digest or summary.get("status") not in ("completed", "stopped"):
        return None
    return "same code" if mark.get("code") == code["code"] else "other code"


def seeds_for(exp: Experiment, scale: str, n: int) -> list[int]:
    """n seeds: the base scenario's and the n-1 after it (seed 0 when the scenario names none)."""
    if n < 1:
        raise ValueError(f"--seeds: {n} is not a positive count")
    base = yaml.safe_load(exp.scenario_path(scale).read_text()).get("seed", 0)
    return [int(base) + k for k in range(n)]


def _run_one(exp: Experiment, s: Series, data: dict, run_dir: Path, scale: str, seed: int,
             say: Callable[[str], None], code: dict) -> None:
    import shutil

    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    scenario_file = run_dir.parent / f"{s.slug}.yaml"
    scenario_file.write_text(yaml.safe_dump(data, sort_keys=False))
    say(f"{exp.name} [{s.label}, seed {seed}]: edgebed up {_rel(scenario_file)}")
    t0 = time.time()
    from testbed.errors import EXIT_STOPPED

    # the series' copy names the base scenario's traces, in the base's folder
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "up", str(scenario_file), "--out", str(run_dir), "-q",
                        "--trace-dir", str(exp.scenario_path(scale).parent)], cwd=REPO, capture_output=True, text=True)
    if r.returncode not in (0, EXIT_STOPPED) or not (run_dir / "summary.json").exists():  # a stopped run is data
        raise RunFailed(f"{exp.name} [{s.label}, seed {seed}]: edgebed up failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout)[-1500:]}")
    seconds = time.time() - t0
    (run_dir / "reproduce.json").write_text(json.dumps({"experiment": exp.name, "series": s.label, "scale": scale,
                                                        "seed": seed, "digest": _digest(data), "seconds": seconds,
                                                        "commit": _commit(), "code": code["code"],
                                                        "code_files": code["files"]}))
    summary = json.loads((run_dir / "summary.json").read_text())
    say(f"{exp.name} [{s.label}, seed {seed}]: {summary.get('status')} ({summary.get('reason')}) in {seconds:.0f} s, "
        f"best accuracy {summary.get('best_accuracy')}")


def run_series(exp: Experiment, scale: str, runs_dir: Path, *, seeds: Optional[list[int]] = None, reuse: bool = True,
               say: Callable[[str], None] = print, runtime: Optional[str] = None,
               keep_other_code: bool = False) -> dict[int, list[tuple[Series, Path]]]:
    """Run each series at each seed that has no finished records of the same scenario and the same
    code (provenance.py) under runs_dir/NAME/SCALE/seed-S/<series>; every scenario is validated
    before the first runs. `keep_other_code` (--reuse) keeps records that other code made."""
    seeds = seeds if seeds is not None else seeds_for(exp, scale, exp.seeds)
    todo = series_scenarios(exp, scale)
    codes = {s.label: code_digest(base, exp.analyze.__module__) for s, base in todo}  # the same at every seed
    out: dict[int, list[tuple[Series, Path]]] = {}
    for seed in seeds:
        for s, base in todo:
            data = {**copy.deepcopy(base), "seed": seed}
            if runtime:
                data["runtime"] = runtime
            run_dir = (runs_dir / exp.name / scale / f"seed-{seed}" / s.slug).resolve()
            out.setdefault(seed, []).append((s, run_dir))
            code = codes[s.label]
            found = _finished(run_dir, _digest(data), code) if reuse else None
            if found == "same code" or (found == "other code" and keep_other_code):
                say(f"{exp.name} [{s.label}, seed {seed}]: records of this scenario exist ({_rel(run_dir)}), "
                    f"not run again" + (f"; made by other code, kept (--reuse): {_changed(run_dir, code)}"
                                        if found == "other code" else ""))
                continue
            if found == "other code":
                say(f"{exp.name} [{s.label}, seed {seed}]: its records were made by other code "
                    f"({_changed(run_dir, code)}): run again")
            _run_one(exp, s, data, run_dir, scale, seed, say, code)
    return out


def _changed(run_dir: Path, code: dict) -> str:
    files = changed_files({"files": _mark(run_dir).get("code_files")}, code)
    return ", ".join(files) if files else "no record of its code"


def _rel(path: Path) -> str:
    """A path as the repository names it (absolute only when it lies outside)."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def _runs_commit(runs: dict[int, list[tuple[Series, Path]]]) -> str:
    """The commit(s) the runs ran on (as each recorded it), else the one analysing them now."""
    seen = set()
    for pairs in runs.values():
        for _, d in pairs:
            try:
                seen.add(json.loads((Path(d) / "reproduce.json").read_text()).get("commit") or "")
            except (OSError, ValueError):
                seen.add("")
    if not seen or "" in seen:
        return f"{_commit()} (at analysis: not every run recorded its own)"
    return ", ".join(sorted(seen))


def _run_seconds(runs: dict[int, list[tuple[Series, Path]]]) -> float:
    total = 0.0
    for pairs in runs.values():
        for _, d in pairs:
            try:
                total += float(json.loads((Path(d) / "reproduce.json").read_text()).get("seconds") or 0)
            except (OSError, ValueError):
                pass
    return total


def judge_seeds(exp: Experiment, results: list[dict], scale: str):
    """The experiment's verdict over its seeds' headlines, and each criterion's judgement."""
    judgements = [judge(c, [exp.metrics(r, scale).get(c.key) for r in results]) for c in exp.criteria]
    return (combine([j.verdict for j in judgements]) if judgements else NOT_JUDGED), judgements


RunsBySeed = Union[dict, list]  # {seed: [(series, run dir)]}, or one seed's list


def _criteria_lines(exp: Experiment, judgements) -> list[str]:
    from testbed.reproduce.common import fmt

    return [f"{c.rule()}\n  -> {j.verdict}: per seed {', '.join(fmt(v, '.4g') for v in j.values)}; mean "
            f"{fmt(j.mean, '.4g')} [{fmt(j.low, '.4g')}, {fmt(j.high, '.4g')}] ({j.why})"
            for c, j in zip(exp.criteria, judgements)]


def rejudge(report: dict) -> dict:
    """A figure's JSON judged again by today's criteria, from the per-seed numbers it holds (no
    run, no records): for a change in how a criterion judges (REPRODUCTION.md's change log says
    when), not in what is measured. The JSON keeps the verdict it had under `rejudged`."""
    exp = get_experiment(report["experiment"])
    verdict, judgements = judge_seeds(exp, [report["per_seed"][str(s)] for s in report["seeds"]], report["scale"])
    old_rules = [c["rule"] for c in report.get("criteria", [])]
    lines = list(report.get("lines", []))
    start = next((i for i, line in enumerate(lines) if any(line.startswith(r) for r in old_rules)),
                 next((i for i, line in enumerate(lines) if line.startswith("verdict: ")), len(lines)))
    end = next((i + 1 for i, line in enumerate(lines) if line.startswith("verdict: ")), start)
    criteria = [{"rule": c.rule(), **j.as_dict()} for c, j in zip(exp.criteria, judgements)]
    if criteria == report.get("criteria") and verdict == report.get("verdict"):
        return report
    out = {**report, "criteria": criteria, "verdict": verdict, "holds": verdict == "holds",
           "lines": lines[:start] + _criteria_lines(exp, judgements) + [f"verdict: {verdict}"] + lines[end:]}
    out["rejudged"] = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(),
                       "verdict_before": report.get("verdict"),
                       "criteria_before": {c["key"]: c["verdict"] for c in report.get("criteria", [])}}
    return out


def _other_code(exp: Experiment, by_seed: dict, scale: str) -> list[dict]:
    """The runs whose records code other than this checkout's made (provenance.py), each with what changed."""
    try:
        now = {s.label: code_digest(data, exp.analyze.__module__) for s, data in series_scenarios(exp, scale)}
    except (ValueError, OSError):  # a scenario no longer valid: nothing to compare with
        return []
    out = []
    for seed, pairs in by_seed.items():
        for s, d in pairs:
            mark, code = _mark(d), now.get(s.label)
            if code is not None and mark.get("code") != code["code"]:
                out.append({"seed": seed, "series": s.label, "commit": mark.get("commit"), "code": mark.get("code"),
                            "changed": changed_files({"files": mark.get("code_files")}, code)
                            if mark.get("code_files") else ["no record of its code"]})
    return out


def analyze(exp: Experiment, runs: RunsBySeed, out_dir: Path, scale: str,
            say: Callable[[str], None] = print, other_code: str = "read as found (edgebed plot --figure)") -> dict:
    """The experiment over its seeds, from records only: each seed's analysis (beside its runs),
    then out_dir/<name>.png (mean and min-max band), .csv, -table.csv (mean and range) and .json
    (every seed's numbers and the verdict; `records_code` lists the runs that other code made,
    and `other_code` says how they came to be used)."""
    from testbed.records.reader import load_run
    from testbed.reproduce.seeds import aggregate_rows, band_figure, band_table_lines

    by_seed = runs if isinstance(runs, dict) else {None: runs}
    out_dir.mkdir(parents=True, exist_ok=True)
    per_seed, meta = {}, {}
    for seed, pairs in by_seed.items():
        loaded = [(s, load_run(d)) for s, d in pairs]
        meta = meta or (loaded[0][1].meta if loaded else {})
        seed_out = (Path(pairs[0][1]).parent / "analysis") if pairs else out_dir
        seed_out.mkdir(parents=True, exist_ok=True)
        per_seed[seed] = {"result": exp.analyze(loaded, seed_out / exp.name, scale), "curves": seed_out / exp.name}
    verdict, judgements = judge_seeds(exp, [v["result"] for v in per_seed.values()], scale)
    table = aggregate_rows([v["result"] for v in per_seed.values()])
    band_figure(exp, per_seed, judgements, out_dir / exp.name, scale)
    table.to_csv(out_dir / f"{exp.name}-table.csv", index=False)
    notes = [f"seed {seed}: {note}" for seed, v in per_seed.items() for note in v["result"].get("notes", [])]
    lines = band_table_lines(table, len(per_seed)) + notes + _criteria_lines(exp, judgements) + [f"verdict: {verdict}"]
    stale = _other_code(exp, by_seed, scale)
    if stale:
        lines.append(f"records made by other code, {other_code}: " + "; ".join(
            f"seed {r['seed']} {r['series']} ({r['commit']}: {', '.join(r['changed'])})" for r in stale))
    report = {
        "experiment": exp.name, "paper": exp.paper, "title": exp.title, "claim": exp.claim, "expect": exp.expect,
        "scale": scale, "date": time.strftime("%Y-%m-%d"), "commit": _runs_commit(by_seed),
        "machine": f"{platform.machine()}, {meta.get('host', {}).get('cpus', '?')} CPUs, runtime {meta.get('runtime')}",
        "command": f"make {exp.name} SCALE={scale} SEEDS={len(per_seed)}",
        "seeds": [k for k in per_seed], "minutes": round(_run_seconds(by_seed) / 60, 1),
        "criteria": [{"rule": c.rule(), **j.as_dict()} for c, j in zip(exp.criteria, judgements)],
        "verdict": verdict, "holds": verdict == "holds",
        "runs": {str(seed): {s.label: _rel(d) for s, d in pairs} for seed, pairs in by_seed.items()},
        "per_seed": {str(seed): {k: v for k, v in r["result"].items() if k != "lines"} for seed, r in per_seed.items()},
        "lines": lines,
        "records_code": {"other_code": stale, "how": other_code if stale else None},
    }
    (out_dir / f"{exp.name}.json").write_text(json.dumps(report, indent=1, default=str))
    say(f"{exp.name}: wrote {_rel(out_dir / exp.name)}.png/.csv/.json")
    for line in lines:
        say(f"  {line}")
    return report


def reproduce(name: str, *, scale: str = "ci", seeds: Optional[int] = None, out_dir: Path = Path("figures"),
              runs_dir: Path = Path("runs/reproduce"), reuse: bool = True, runtime: Optional[str] = None,
              say: Callable[[str], None] = print, keep_other_code: bool = False) -> dict:
    exp = get_experiment(name)
    runs = run_series(exp, scale, Path(runs_dir), seeds=seeds_for(exp, scale, seeds or exp.seeds), reuse=reuse, say=say,
                      runtime=runtime, keep_other_code=keep_other_code)
    return analyze(exp, runs, figure_dir(out_dir, scale), scale, say=say,
                   other_code="kept on purpose (--reuse)" if keep_other_code else "none expected")


def figure_dir(out_dir: Path, scale: str) -> Path:
    """Where a scale's figures go: OUT for ci, OUT/SCALE for the others (they never overwrite ci's)."""
    return Path(out_dir) if scale == "ci" else Path(out_dir) / scale


def runs_of(name: str, root: Path, scale: str = "ci") -> dict[int, list[tuple[Series, Path]]]:
    """The series' run directories per seed under an experiment's folder (for `edgebed plot
    --figure`): NAME/SCALE/seed-S/<series>."""
    exp = get_experiment(name)
    base = Path(root)
    if (base / exp.name / scale).is_dir():
        base = base / exp.name / scale
    out = {}
    for seed_dir in sorted(base.glob("seed-*"), key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1):
        if seed_dir.name[5:].isdigit():
            pairs = [(s, seed_dir / s.slug) for s in exp.series_at(scale) if (seed_dir / s.slug).is_dir()]
            if pairs:
                out[int(seed_dir.name[5:])] = pairs
    return out
