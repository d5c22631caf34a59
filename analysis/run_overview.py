#!/usr/bin/env python3
"""Figures for one or more edgebed runs, from their records only.

    python analysis/run_overview.py RUN [RUN...] [--out DIR]

Writes RUN/plots/*.png for each run and, given several runs, compare_accuracy.png and
compare_progress.png (each worker's local steps over time, one panel per run: BSP's
lock-step against asynchronous algorithms' fast workers) into --out DIR (default: the
first run's parent directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Lets the script run from a plain checkout, without edgebed installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.records.plotting import COMPARE_FILE, PROGRESS_FILE, plot_compare, plot_progress_compare, plot_run
from testbed.records.reader import RunNotFound


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directory")
    parser.add_argument("--out", type=Path, help=f"where {COMPARE_FILE} goes (default: first run's parent)")
    args = parser.parse_args(argv)

    status = 0
    good: list[Path] = []
    for run in args.runs:
        try:
            written = plot_run(run)
        except RunNotFound as e:
            print(f"skipped: {e}", file=sys.stderr)
            status = 1
            continue
        good.append(run)
        print(f"{run}: {', '.join(p.name for p in written) or 'no data to plot yet'}")

    if len(good) > 1:
        out_dir = args.out if args.out is not None else good[0].resolve().parent
        path = plot_compare(good, out_dir / COMPARE_FILE)
        print(path if path is not None else "no run has eval rows; nothing to compare")
        path = plot_progress_compare(good, out_dir / PROGRESS_FILE)
        print(path if path is not None else "no run has step rows; no progress comparison")
    return status


if __name__ == "__main__":
    sys.exit(main())
