#!/usr/bin/env python3
"""REPRODUCTION.md's measured part, from figures/*.json and figures/SCALE/*.json only (what
`edgebed reproduce` wrote).

    python analysis/reproduction_report.py [FIGURES] [--update REPRODUCTION.md] [--rejudge]

Prints one section per experiment: the paper's claim, the effect ci scale must show, our
numbers (the analysis' lines: mean [min, max] over the seeds, each criterion and its verdict),
scale, machine, date, commit, command, and the verdict. With --update, replaces the text between
`<!-- measured:NAME -->` and `<!-- /measured:NAME -->` in the file (NAME@SCALE for a scale other
than ci), and the summary table between `<!-- summary -->` and `<!-- /summary -->`, leaving the
commentary around them alone; no number enters the file any other way. --rejudge first judges
each figure's JSON again by the criteria in the code now, from the per-seed numbers it holds
(testbed.reproduce.rejudge), and writes it back: for a change in how a criterion judges, not in
what a run measures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def verdict(report: dict) -> str:
    if "verdict" in report:
        return report["verdict"]
    return {True: "holds", False: "does not hold"}.get(report.get("holds"), "not judged")


def section(report: dict) -> str:
    seeds = report.get("seeds")
    where = ", ".join(x for x in (f"{report['scale']} scale", report["machine"], report["date"],
                                  f"commit {report['commit']}" if report.get("commit") else "",
                                  f"{len(seeds)} seeds {seeds}" if seeds else "") if x)
    out = [f"- Paper: {report['claim']}",
           f"- Expected at ci scale: {report.get('expect') or '-'}",
           f"- Ours ({where}, `{report['command']}`): **{verdict(report)}**.", "", "```"]
    out += report.get("lines", [])
    out += ["```"]
    return "\n".join(out)


def _spread(c: dict) -> str:
    if c.get("mean") is None:
        return f"{c['key']}: -"
    return f"{c['key']} {c['mean']:.3g} [{c['min']:.3g}, {c['max']:.3g}]"


def summary(reports: dict) -> str:
    """One row per target: verdict, each criterion's mean [min, max] over the seeds, seeds, minutes.
    A report from before seeds and criteria (one run, a pass/fail check) says so."""
    lines = ["| target | verdict | criteria: mean [min, max] over the seeds | seeds | minutes | date |",
             "|---|---|---|---|---|---|"]
    for name, r in reports.items():
        name = name.replace("@", "` at `")
        if "criteria" not in r:
            lines.append(f"| `{name}` | not rerun: {verdict(r)} by the old check, one run | - | 1 | - | {r['date']} |")
            continue
        crit = "; ".join(_spread(c) for c in r["criteria"]) or "-"
        lines.append(f"| `{name}` | **{verdict(r)}** | {crit} | {len(r.get('seeds') or [])} | "
                     f"{r.get('minutes', '-')} | {r['date']} |")
    return "\n".join(lines)


def criteria_block() -> str:
    """Every target's criteria as the code states them (testbed/reproduce/<paper>.py), so the
    document and the verdicts cannot drift apart."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from testbed.reproduce import all_experiments

    lines = []
    for exp in all_experiments():
        lines.append(f"- `{exp.name}`:")
        lines += [f"  - {c.rule()}" for c in exp.criteria] or ["  - (none)"]
    return "\n".join(lines)


def read_reports(figures: Path) -> dict[str, dict]:
    """figures/NAME.json (ci scale) as NAME, and figures/SCALE/NAME.json (another scale, e.g.
    paper-200) as NAME@SCALE: a marker names one scale's block, and scales never overwrite each other."""
    reports = {p.stem: json.loads(p.read_text()) for p in sorted(figures.glob("*.json"))}
    for p in sorted(figures.glob("*/*.json")):
        reports[f"{p.stem}@{p.parent.name}"] = json.loads(p.read_text())
    return reports


def rejudge_all(figures: Path) -> None:
    from testbed.reproduce import EXPERIMENTS, get_experiment, rejudge

    get_experiment("fig-adacomp-3")  # every paper's module registers its experiments
    for p in sorted(figures.glob("*.json")) + sorted(figures.glob("*/*.json")):
        report = json.loads(p.read_text())
        if report.get("experiment") not in EXPERIMENTS or "per_seed" not in report:
            continue  # e.g. fig-scadles-5's, written by its own script
        new = rejudge(report)
        if new is not report:
            p.write_text(json.dumps(new, indent=1, default=str))
            moved = ", ".join(f"{k} {v} -> {c}" for k, v, c in _moved(report, new))
            print(f"{p}: {report.get('verdict')} -> {new['verdict']} ({moved})")


def _moved(before: dict, after: dict) -> list[tuple]:
    was = {c["key"]: c["verdict"] for c in before.get("criteria", [])}
    return [(c["key"], was.get(c["key"]), c["verdict"]) for c in after["criteria"] if was.get(c["key"]) != c["verdict"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="?", type=Path, default=Path("figures"))
    ap.add_argument("--update", type=Path)
    ap.add_argument("--rejudge", action="store_true", help="judge each figure's JSON again by today's criteria")
    args = ap.parse_args(argv)
    if args.rejudge:
        rejudge_all(args.figures)
    reports = read_reports(args.figures)
    if not args.update:
        for name, r in reports.items():
            print(f"## {name}\n\n{section(r)}\n")
        return 0
    text = args.update.read_text()
    for marker, block in (("summary", summary(reports)), ("criteria", criteria_block())):
        text = re.sub(rf"(<!-- {marker} -->\n)(?:.*?\n)?(<!-- /{marker} -->)",
                      lambda m, block=block: m.group(1) + block + "\n" + m.group(2), text, flags=re.S)
    for name, r in reports.items():
        pat = re.compile(rf"(<!-- measured:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /measured:{re.escape(name)} -->)",
                         re.S)
        if pat.search(text):
            text = pat.sub(lambda m, r=r: m.group(1) + section(r) + "\n" + m.group(2), text)
        else:
            print(f"{args.update} has no markers for {name}: skipped", file=sys.stderr)
    args.update.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
