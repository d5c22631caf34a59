"""Three-valued verdicts over seeds, decided before the run.

A target states its criteria in code (`Criterion`: which per-seed number, which way is better, the
no-effect value, the size the mean must clear, and the band around no effect that counts as a tie).
`judge` turns one criterion's per-seed values into a verdict; `combine` gives a target's verdict as
the worst of its criteria's. The rules (REPRODUCTION.md, "How a verdict is decided"):

- tie: the mean is within `tie` of the no-effect value (never, for a limit with no tie band);
  a ratio's mean (`ratio=True`) is the geometric mean of its seeds;
- does not hold: the mean is on the wrong side of it (or on it);
- holds: every seed is on the right side (beyond the tie band), and the mean clears `bar`;
- weak: otherwise (the mean's direction is right, but a seed's is not, a seed has no value, or
  the mean falls short of the bar).

A seed whose value could not be measured (None: e.g. the subject never reached the target) counts
as a seed on the wrong side; the mean is taken over the seeds that have one. A seed whose
comparison the criterion says nothing about (`EXCLUDED`: e.g. the baseline never reached the
target, so no speed-up is claimed) is left out; a criterion with every seed left out is "not
judged", and a target with a criterion not judged is at best weak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

VERDICTS = ("holds", "weak", "tie", "does not hold")  # best first
NOT_JUDGED = "not judged"
EXCLUDED = "excluded"  # a per-seed value the criterion leaves out (see above)


@dataclass(frozen=True)
class Criterion:
    key: str  # the per-seed metric's name (an experiment's `metrics` returns it)
    text: str  # what it says, for the report
    better: str = "higher"  # or "lower"
    neutral: float = 1.0  # the no-effect value: 1 for a ratio, 0 for a difference, a limit for a constraint
    bar: float = 1.0  # the mean must reach this (in the better direction) to hold
    tie: float = 0.0  # |mean - neutral| <= tie is a tie (0: no tie band)
    ratio: bool = False  # a ratio of two positive numbers: its mean over the seeds is the geometric one

    def __post_init__(self):
        if self.better not in ("higher", "lower"):
            raise ValueError(f"Criterion {self.key}: better must be 'higher' or 'lower'")
        if self._sign * (self.bar - self.neutral) < 0:
            raise ValueError(f"Criterion {self.key}: the bar is on the no-effect side")

    @property
    def _sign(self) -> int:
        return 1 if self.better == "higher" else -1

    def rule(self) -> str:
        op = ">=" if self.better == "higher" else "<="
        tie = f", tie within {self.tie:g} of {self.neutral:g}" if self.tie else ""
        mean = "the geometric mean" if self.ratio else "the mean"
        return f"{self.text}: holds if every seed {'>' if self.better == 'higher' else '<'} {self.neutral:g} " \
               f"and {mean} {op} {self.bar:g}{tie}"


@dataclass(frozen=True)
class Judgement:
    key: str
    verdict: str
    values: tuple  # per seed, None where not measured
    mean: Optional[float]
    low: Optional[float]
    high: Optional[float]
    why: str

    def as_dict(self) -> dict:
        return {"key": self.key, "verdict": self.verdict, "values": list(self.values), "mean": self.mean,
                "min": self.low, "max": self.high, "why": self.why}


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _mean(known: list[float], geometric: bool) -> float:
    """Ratios average geometrically: 2x and 0.5x are no effect, not 1.25x."""
    if geometric:
        return math.exp(sum(math.log(v) for v in known) / len(known))
    return sum(known) / len(known)


def judge(criterion: Criterion, values: Sequence) -> Judgement:
    left_out = sum(1 for v in values if v == EXCLUDED)
    vals = tuple(float(v) if _finite(v) and (not criterion.ratio or float(v) > 0) else None
                 for v in values if v != EXCLUDED)  # a ratio that is not positive measured nothing
    known = [v for v in vals if v is not None]
    if not vals:
        return Judgement(criterion.key, NOT_JUDGED, vals, None, None, None,
                         f"every seed left out ({left_out})")
    if not known:
        return Judgement(criterion.key, "does not hold", vals, None, None, None, "no seed measured it")
    mean, low, high = _mean(known, criterion.ratio), min(known), max(known)
    s, mean_is = criterion._sign, "geometric mean" if criterion.ratio else "mean"
    if criterion.tie > 0 and abs(mean - criterion.neutral) <= criterion.tie:
        verdict, why = "tie", f"{mean_is} {mean:.4g} within {criterion.tie:g} of {criterion.neutral:g}"
    elif s * (mean - criterion.neutral) <= 0:
        verdict, why = "does not hold", f"{mean_is} {mean:.4g} not beyond {criterion.neutral:g}"
    else:
        wrong = [v for v in vals if v is None or s * (v - criterion.neutral) <= criterion.tie]
        short = s * (mean - criterion.bar) < 0
        if not wrong and not short:
            verdict, why = "holds", (f"every seed beyond {criterion.neutral:g}, "
                                     f"the {mean_is} {mean:.4g} clears {criterion.bar:g}")
        else:
            edge = f"{criterion.neutral:g}" + (f" +- {criterion.tie:g}" if criterion.tie else "")
            parts = ([f"{len(wrong)} of {len(vals)} seeds not beyond {edge}"] if wrong else []) + \
                    ([f"{mean_is} {mean:.4g} short of {criterion.bar:g}"] if short else [])
            verdict, why = "weak", "; ".join(parts)
    if left_out:
        why += f"; {left_out} seed{'s' if left_out > 1 else ''} left out"
    return Judgement(criterion.key, verdict, vals, mean, low, high, why)


def combine(verdicts: Sequence[str]) -> str:
    """A target's verdict: the worst of its judged criteria's (all must hold for it to hold); a
    criterion not judged caps it at weak."""
    judged = [v for v in verdicts if v != NOT_JUDGED]
    if not judged:
        return NOT_JUDGED
    worst = max(judged, key=VERDICTS.index)
    return "weak" if worst == "holds" and len(judged) < len(verdicts) else worst
