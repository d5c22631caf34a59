"""DLion (the 2019 HotCloud workshop paper, decentralized training in micro-clouds):
Fig. 6 (P-compute) and Fig. 7 (P-network) against Gaia and Ako."""

from __future__ import annotations

from pathlib import Path

from testbed.reproduce import Experiment, Series, register
from testbed.reproduce.common import fmt, ratio, time_to_accuracy_figure
from testbed.reproduce.verdict import Criterion

FIG6_TARGETS = {"ci": [0.7, 0.8], "paper": [0.6, 0.7]}
# Fig. 6's crossings on the 3-evaluation moving average, over 8 seeds: the 0.8 target falls on a
# plateau, where one evaluation alone would decide a seed.
FIG6_WINDOW, FIG6_SEEDS = 3, 8
FIG7_AT = {"ci": 300.0, "paper": 1800.0}  # s: the paper reads Fig. 7 after 30 min


def _fig6(pairs, out: Path, scale: str) -> dict:
    targets = FIG6_TARGETS[scale]
    res = time_to_accuracy_figure(pairs, out, title=f"DLion Fig. 6 ({scale} scale): P-compute, 1 high + 3 low workers",
                                  targets=targets, baseline="Gaia", subject="DLion", window=FIG6_WINDOW)
    by = {e["series"]: e for e in res["series"]}
    lo, hi = (f"seconds_to_{t}" for t in targets)
    d = by["DLion"]
    faster = {name: (None if d[lo] is None or by[name][lo] is None else 1 - d[lo] / by[name][lo])
              for name in ("Gaia", "Ako")}
    no_cab = by.get("DLion without capacity-aware batching", {})
    cab_cut = None if d[hi] is None or no_cab.get(hi) is None else 1 - d[hi] / no_cab[hi]
    res.update(reduction_to_first_target=faster, capacity_aware_reduction_to_second_target=cab_cut)
    res["lines"].append(f"DLion's time to {targets[0]}: {fmt((faster['Gaia'] or 0) * 100, '.0f')}% shorter than Gaia, "
                        f"{fmt((faster['Ako'] or 0) * 100, '.0f')}% than Ako; capacity-aware batching cuts the time to "
                        f"{targets[1]} by {fmt(cab_cut * 100 if cab_cut is not None else None, '.0f')}%")
    return res


# a time cut is 1 - t_DLion / t_other: 0 is no effect; 10% must be cleared, within 3% is a tie
FIG6_CRITERIA = (
    Criterion("cut_vs_gaia", "DLion's time to the first target, cut against Gaia's", "higher", 0.0, 0.10, 0.03),
    Criterion("cut_vs_ako", "DLion's time to the first target, cut against Ako's", "higher", 0.0, 0.10, 0.03),
    Criterion("cut_by_capacity_aware", "capacity-aware batching's cut of DLion's time to the second target",
              "higher", 0.0, 0.10, 0.03),
)


def _fig6_metrics(result: dict, scale: str) -> dict:
    cut = result.get("reduction_to_first_target", {})
    return {"cut_vs_gaia": cut.get("Gaia"), "cut_vs_ako": cut.get("Ako"),
            "cut_by_capacity_aware": result.get("capacity_aware_reduction_to_second_target")}


def _fig7(pairs, out: Path, scale: str) -> dict:
    at = FIG7_AT[scale]
    res = time_to_accuracy_figure(pairs, out, title=f"DLion Fig. 7 ({scale} scale): P-network, accuracy after {at:g} s",
                                  targets=[], baseline="Gaia", subject="DLion", at_seconds=at)
    by = {e["series"]: e[f"accuracy_at_{at:g}s"] for e in res["series"]}
    above = {name: (None if ratio(by["DLion"], by[name]) is None else ratio(by["DLion"], by[name]) - 1)
             for name in ("Gaia", "Ako")}
    res["accuracy_above"] = above
    res["lines"].append(f"DLion's accuracy at {at:g} s above Gaia's by {fmt((above['Gaia'] or 0) * 100, '.1f')}%, "
                        f"Ako's by {fmt((above['Ako'] or 0) * 100, '.1f')}%")
    return res


# relative accuracy at the fixed time, DLion / other - 1: 5% must be cleared, within 1% is a tie
FIG7_CRITERIA = (
    Criterion("above_gaia", "DLion's accuracy at the fixed time, relative to Gaia's", "higher", 0.0, 0.05, 0.01),
    Criterion("above_ako", "DLion's accuracy at the fixed time, relative to Ako's", "higher", 0.0, 0.05, 0.01),
)


def _fig7_metrics(result: dict, scale: str) -> dict:
    above = result.get("accuracy_above", {})
    return {"above_gaia": above.get("Gaia"), "above_ako": above.get("Ako")}


register(Experiment(
    name="fig-dlion-6", paper="dlion",
    title="P-compute: time to accuracy vs Gaia and Ako, with/without capacity-aware batching",
    claim="DLion reaches 60% accuracy 73%/74% faster than Gaia/Ako; capacity-aware batching cuts the time to 70% "
          "by 34% (CIFAR-10, 1 x 24 + 3 x 8 CPUs)",
    expect="DLion first to the accuracy targets; without capacity-aware batching slower",
    scenario="scenarios/dlion/p-compute.{scale}.yaml", criteria=FIG6_CRITERIA, metrics=_fig6_metrics, seeds=FIG6_SEEDS,
    series=[Series("DLion", {}),
            Series("DLion without capacity-aware batching", {"algorithm": {"params": {"capacity_aware": False}}}),
            Series("Gaia", {"algorithm": {"name": "gaia"}}),
            Series("Ako", {"algorithm": {"name": "ako"}})],
    analyze=_fig6))

register(Experiment(
    name="fig-dlion-7", paper="dlion", title="P-network: accuracy after a fixed time vs Gaia and Ako",
    claim="after 30 min DLion's accuracy is 42% above Gaia's and 25% above Ako's "
          "(CIFAR-10, 3+1 workers, 100 Mbit/s WAN)",
    expect="DLion's accuracy at the fixed time above Gaia's and Ako's",
    scenario="scenarios/dlion/p-network.{scale}.yaml", criteria=FIG7_CRITERIA, metrics=_fig7_metrics,
    series=[Series("DLion", {}), Series("Gaia", {"algorithm": {"name": "gaia"}}),
            Series("Ako", {"algorithm": {"name": "ako"}})],
    analyze=_fig7))
