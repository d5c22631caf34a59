"""ADSP (Hu, Wang, Wu, AAAI 2020: "Distributed Machine Learning through Heterogeneous Edge
Systems"): convergence time against the baselines (Fig. 4) and against the commit rate (Fig. 3a)."""

from __future__ import annotations

from pathlib import Path

from testbed.reproduce import Experiment, Series, register
from testbed.reproduce.common import fmt, time_to_accuracy_figure
from testbed.reproduce.verdict import Criterion

TARGETS = {"ci": [0.9], "paper": [0.7]}
# Fig. 3a: Fashion-MNIST's 0.85 at ci scale, read on the 3-evaluation moving
# average of 1-s evaluations (one lucky evaluation must not decide a 10% bar); the time to it spans
# 12+ check periods. The check-period count to the target is reported beside the verdict.
FIG3_TARGETS = {"ci": [0.85], "paper": [0.7]}
FIG3_WINDOW, FIG3_SEEDS = 3, 5


def time_or_lower_bound(entry: dict, key: str) -> tuple[float | None, bool]:
    """A series' time to the target, or, where it never got there, the last time it was evaluated
    (a lower bound on its time); the flag says which."""
    if entry.get(key) is not None:
        return entry[key], False
    return entry.get("seconds"), True


def _fig4(pairs, out: Path, scale: str) -> dict:
    targets = TARGETS[scale]
    res = time_to_accuracy_figure(pairs, out, title=f"ADSP Fig. 4 ({scale} scale): 3 workers, step times 1:1:3",
                                  targets=targets, baseline="BSP", subject="ADSP")
    by = {e["series"]: e for e in res["series"]}
    key = f"seconds_to_{targets[-1]}"
    adsp = by["ADSP"][key]
    faster, bounded = {}, []
    for name, e in by.items():
        if name != "ADSP":
            # the paper's "x% acceleration": 1 - t_ADSP / t_baseline; a baseline that never got there
            # counts with its run's length, so the cut is a lower bound (and is marked so)
            t, bound = time_or_lower_bound(e, key)
            faster[name] = None if adsp is None or not t else 1 - adsp / t
            if bound and faster[name] is not None:
                bounded.append(name)
    res["reduction_vs"] = faster
    res["reduction_lower_bound"] = bounded
    res["notes"] = [f"{name} did not reach {targets[-1]}: its cut counts its run's length (a lower bound)"
                    for name in bounded]
    res["lines"].append("ADSP's convergence time vs each: " + ", ".join(
        f"{k} {'>= ' if k in bounded else ''}{fmt(v * 100 if v is not None else None, '.0f')}%"
        for k, v in faster.items()) + " shorter")
    return res


BASELINE_NAMES = ("BSP", "SSP s=3", "ASGD", "Fixed ADACOMM tau=8")
# ADSP first to the target: a cut of at least 10% against each baseline (the paper: 33-80%); within
# 3% is a tie
FIG4_CRITERIA = tuple(Criterion(f"cut_vs_{n.split()[0].lower()}", f"ADSP's time to the target, cut against {n}'s",
                                "higher", 0.0, 0.10, 0.03) for n in BASELINE_NAMES)


def _fig4_metrics(result: dict, scale: str) -> dict:
    cut = result.get("reduction_vs", {})
    return {c.key: cut.get(n) for c, n in zip(FIG4_CRITERIA, BASELINE_NAMES)}


def _fig3(pairs, out: Path, scale: str) -> dict:
    targets = FIG3_TARGETS[scale]
    res = time_to_accuracy_figure(pairs, out, title=f"ADSP Fig. 3a ({scale} scale): convergence time vs commit rate",
                                  targets=targets, baseline=pairs[0][0].label, subject=pairs[-1][0].label,
                                  window=FIG3_WINDOW)
    key = f"seconds_to_{targets[-1]}"
    times = [time_or_lower_bound(e, key)[0] for e in res["series"]]
    known = [t for t in times if t is not None]
    best = times.index(min(known)) if known else None
    res["best_commit_rate"] = res["series"][best]["series"] if best is not None else None
    # the paper's shape: falls, then rises -- each end slower than the fastest intermediate rate
    middle = [t for t in times[1:-1] if t is not None]
    fastest_middle = min(middle) if middle else None
    res["falling_side"] = times[0] / fastest_middle if fastest_middle and times[0] else None
    res["rising_side"] = times[-1] / fastest_middle if fastest_middle and times[-1] else None
    period = ((pairs[0][1].scenario.get("algorithm") or {}).get("params") or {}).get("check_period")
    res["check_periods_to_target"] = [round(t / period, 1) if t and period else None for t in times]
    res["lines"].append(f"check periods to the target: {res['check_periods_to_target']}")
    res["lines"].append(f"fastest: {res['best_commit_rate']}; slowest end over the fastest middle rate: "
                        f"{fmt(res['falling_side'], '.2f')}x (fewest commits), "
                        f"{fmt(res['rising_side'], '.2f')}x (most)")
    return res


# the U: both ends at least 10% slower than the best intermediate rate; within 3% is a tie
FIG3_CRITERIA = (
    Criterion("falling_side", "time to the target, fewest commits / the fastest intermediate rate", "higher",
              1.0, 1.10, 0.03, ratio=True),
    Criterion("rising_side", "time to the target, most commits / the fastest intermediate rate", "higher",
              1.0, 1.10, 0.03, ratio=True),
)


def _fig3_metrics(result: dict, scale: str) -> dict:
    return {"falling_side": result.get("falling_side"), "rising_side": result.get("rising_side")}


# Alg. 1's online search of the commit rate, as the paper's ADSP runs. At ci scale a candidate is
# tried for two 5-s check periods (the paper: one 60-s period), from 1 commit a period; the paper
# scale's scenario has the paper's settings already.
CI_SEARCH = {"search": "increment", "commits_per_period": 1, "trial_seconds": 10, "epoch_seconds": 150}


def _fig4_series(scale: str) -> list[Series]:
    return [Series("ADSP", {"algorithm": {"params": CI_SEARCH}} if scale == "ci" else {}),
            Series("BSP", {"algorithm": {"name": "bsp"}}),
            Series("SSP s=3", {"algorithm": {"name": "ssp", "params": {"staleness": 3}}}),
            Series("ASGD", {"algorithm": {"name": "asgd"}}),
            Series("Fixed ADACOMM tau=8", {"algorithm": {"name": "local_sgd", "params": {"period": 8}}})]


register(Experiment(
    name="fig-adsp-4", paper="adsp", title="convergence time of ADSP vs BSP, SSP, ASGD, Fixed ADACOMM",
    claim="18 heterogeneous workers: ADSP converges 80% faster than BSP, 53% than SSP, 33% than Fixed ADACOMM",
    expect="ADSP reaches the target accuracy first, ahead of every baseline",
    scenario="scenarios/adsp/hetero.{scale}.yaml", series=_fig4_series, analyze=_fig4,
    criteria=FIG4_CRITERIA, metrics=_fig4_metrics))

register(Experiment(
    name="fig-adsp-3", paper="adsp", title="convergence time vs the commit rate (commits per check period)",
    claim="3 workers (1:1:3): convergence time first falls, then rises as the commit rate grows",
    expect="the fastest commit rate is an intermediate one",
    scenario="scenarios/adsp/commit-rate.{scale}.yaml",
    series=[Series(f"ADSP {k} commits/period", {"algorithm": {"params": {"commits_per_period": k}}})
            for k in (1, 2, 4, 8)],
    analyze=_fig3, criteria=FIG3_CRITERIA, metrics=_fig3_metrics, seeds=FIG3_SEEDS))
