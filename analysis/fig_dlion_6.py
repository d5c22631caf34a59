#!/usr/bin/env python3
"""fig-dlion-6 from existing records: python analysis/fig_dlion_6.py [RUNS] [--scale ci|paper] [--out figures]
(see paper_figure.py)."""

import sys

from paper_figure import main

if __name__ == "__main__":
    sys.exit(main(name="fig-dlion-6"))
