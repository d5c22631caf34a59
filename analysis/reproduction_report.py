#!/usr/bin/env python3
"""REPRODUCTION.md's measured part, from figures/*.json only (what `edgebed reproduce` wrote).

    python analysis/reproduction_report.py [FIGURES] [--update REPRODUCTION.md]

Prints one section per experiment: the paper's claim, the effect ci scale must show, our
numbers (the analysis' lines), scale, machine, date, command, and whether the effect held.
With --update, replaces the text between `<!-- measured:NAME -->` and `<!-- /measured:NAME -->`
in the file, leaving the commentary around it alone; no number enters the file any other way.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def section(report: dict) -> str:
    held = {True: "**holds**", False: "**does not hold**"}.get(report.get("holds"), "not judged")
    out = [f"- Paper: {report['claim']}",
           f"- Expected at ci scale: {report.get('expect') or '-'}",
           f"- Ours ({report['scale']} scale, {report['machine']}, {report['date']}, `{report['command']}`): "
           f"the effect {held}.", "", "```"]
    out += report.get("lines", [])
    out += ["```"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="?", type=Path, default=Path("figures"))
    ap.add_argument("--update", type=Path)
    args = ap.parse_args(argv)
    reports = {p.stem: json.loads(p.read_text()) for p in sorted(args.figures.glob("*.json"))}
    if not args.update:
        for name, r in reports.items():
            print(f"## {name}\n\n{section(r)}\n")
        return 0
    text = args.update.read_text()
    for name, r in reports.items():
        pat = re.compile(rf"(<!-- measured:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /measured:{re.escape(name)} -->)",
                         re.S)
        if pat.search(text):
            text = pat.sub(lambda m: m.group(1) + section(r) + "\n" + m.group(2), text)
        else:
            print(f"{args.update} has no markers for {name}: skipped", file=sys.stderr)
    args.update.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
