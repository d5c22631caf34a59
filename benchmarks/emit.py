"""A benchmark script's result: printed, and written to --out when given (benchmarks/results/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def emit(result: dict, out: Optional[Path]) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")
