#!/usr/bin/env python3
"""A paper's figure or table from existing run records (what `edgebed reproduce` draws after running).

    python analysis/paper_figure.py NAME [RUNS] [--scale ci|paper] [--out figures]

RUNS is the folder `edgebed reproduce` filled (default runs/reproduce): NAME/SCALE/seed-S/<series>/ under it.
The figure logic lives in testbed/reproduce/<paper>.py, shared with `edgebed plot --figure`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.reproduce import analyze, get_experiment, runs_of


def main(argv: list[str] | None = None, name: str | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if name is None:
        parser.add_argument("name", help="fig-adacomp-3, fig-adsp-4, ... (edgebed reproduce lists them)")
    parser.add_argument("runs", nargs="?", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--scale", default="ci", choices=["ci", "paper"])
    parser.add_argument("--out", type=Path, default=Path("figures"))
    args = parser.parse_args(argv)
    name = name or args.name
    runs = runs_of(name, args.runs, args.scale)
    if not runs:
        print(f"no runs of {name} under {args.runs}", file=sys.stderr)
        return 1
    analyze(get_experiment(name), runs, args.out, args.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
