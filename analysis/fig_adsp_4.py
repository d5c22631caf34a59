#!/usr/bin/env python3
"""fig-adsp-4 from existing records: python analysis/fig_adsp_4.py [RUNS] [--scale ci|paper] [--out figures]
(see paper_figure.py)."""

import sys

from paper_figure import main

if __name__ == "__main__":
    sys.exit(main(name="fig-adsp-4"))
