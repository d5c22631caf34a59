"""SelSync (Tyagi & Swany, "Accelerating Distributed ML Training via Selective
Synchronization", arXiv 2301.08897): Table I against BSP, FedAvg and SSP."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.reproduce import Experiment, Series, register
from testbed.reproduce.common import accuracy_curve, table_markdown, time_to_accuracy_figure
from testbed.reproduce.verdict import EXCLUDED, Criterion

TARGET = {"ci": 0.9, "paper": 0.9}


def lssr(steps: pd.DataFrame) -> float | None:
    """Eq. 4: local steps / all steps. A step synchronized if it sent at least half the largest
    push of the run (local steps send nothing, or SelSync's few-byte flag)."""
    sent = pd.to_numeric(steps.bytes_sent, errors="coerce").dropna()
    if sent.empty or sent.max() <= 0:
        return None
    return float((sent < 0.5 * sent.max()).mean())


def _table1(pairs, out: Path, scale: str) -> dict:
    # the paper times each method to BSP's accuracy: the target, or 95% of BSP's best if it fell short
    bsp_curve = next((accuracy_curve(rec) for s, rec in pairs if s.label == "BSP"), None)
    target = TARGET[scale]
    if bsp_curve is not None and len(bsp_curve) and bsp_curve.accuracy.max() < target:
        target = round(0.95 * float(bsp_curve.accuracy.max()), 2)
    res = time_to_accuracy_figure(pairs, out, title=f"SelSync Table I ({scale} scale): 4 workers, 10 Mbit/s links",
                                  targets=[target], baseline="BSP", subject="SelSync delta=0.3")
    key = f"seconds_to_{target}"
    by = {e["series"]: e for e in res["series"]}
    bsp = by["BSP"]
    rows = []
    for s, rec in pairs:
        e = by[s.label]
        r = None if s.label.startswith("SSP") else lssr(rec.steps)
        rows.append({"method": s.label, "iterations": int(rec.steps.groupby("node").step.max().mean())
                     if len(rec.steps) else 0, "LSSR": r, "best accuracy": e["best_accuracy"],
                     "diff vs BSP": None if e["best_accuracy"] is None else e["best_accuracy"] - bsp["best_accuracy"],
                     f"reached {target}": e[key] is not None,
                     "seconds": e[key], "speedup": None if e[key] is None or bsp[key] is None else bsp[key] / e[key]})
    table = pd.DataFrame(rows)
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    res["table"] = rows
    res["target_accuracy"] = target
    res["bsp_reached"] = bsp[key] is not None
    res["lines"] = table_markdown(table).splitlines()
    return res


# the paper's smallest speed-up over BSP is 1.67x (Table I); within 5% of BSP's time is a tie.
# "Reaches BSP's accuracy": its best at most 1 point below BSP's.
TABLE1_CRITERIA = tuple(
    c for d in ("0.3", "0.5") for c in (
        Criterion(f"speedup_delta_{d}", f"SelSync delta={d}: BSP's time to its accuracy / SelSync's", "higher",
                  1.0, 1.67, 0.05, ratio=True),
        Criterion(f"accuracy_delta_{d}", f"SelSync delta={d}: best accuracy minus BSP's (at most 1 point below)",
                  "higher", -0.01, -0.01)))


# The paper's other claim (Table I): FedAvg with C = 0.5 misses BSP's accuracy. Judged on the
# better of the two C = 0.5 settings: BSP's best accuracy minus theirs, at least 1 point; within
# half a point a tie. (Every series stops at the scenario's target or its cap, so
# a FedAvg run that stops at the target while BSP is still below it counts against the claim.)
FEDAVG_HALF = ("FedAvg C=0.5 E=0.25", "FedAvg C=0.5 E=0.125")
TABLE1_CRITERIA += (Criterion("fedavg_c0.5_misses", "BSP's best accuracy minus FedAvg C=0.5's (the better E; the "
                                                    "paper: C=0.5 misses BSP's accuracy)", "higher", 0.0, 0.01, 0.005),)


def _table1_metrics(result: dict, scale: str) -> dict:
    by = {r["method"]: r for r in result.get("table", [])}
    diffs = [by[m].get("diff vs BSP") for m in FEDAVG_HALF if m in by]
    out = {"fedavg_c0.5_misses": -max(diffs) if diffs and None not in diffs else None}
    for d in ("0.3", "0.5"):
        row = by.get(f"SelSync delta={d}", {})
        # BSP never reached the target: no speed-up is claimed for this seed
        out[f"speedup_delta_{d}"] = row.get("speedup") if result.get("bsp_reached", True) else EXCLUDED
        out[f"accuracy_delta_{d}"] = row.get("diff vs BSP")
    return out


register(Experiment(
    name="table-selsync-1", paper="selsync",
    title="SelSync vs BSP, FedAvg and SSP: iterations, LSSR, accuracy, speed-up",
    claim="16 workers: SelSync reaches BSP's accuracy on every model with LSSR 0.72-0.97, 1.67x-13.75x faster than BSP "
          "(e.g. AlexNet delta=0.3: +1.57% accuracy, 4.62x); FedAvg with C=0.5 misses it on all four models, SSP on "
          "two (ResNet101, VGG11)",
    expect="SelSync reaches the target accuracy faster than BSP, where synchronization dominates a step",
    scenario="scenarios/selsync/table1.{scale}.yaml",
    series=[Series("BSP", {"algorithm": {"name": "bsp"}}),
            # FedAvg (C=1, E): average every E epochs of a worker's shard (1,000 samples / 32 = 31 steps)
            Series("FedAvg C=1 E=0.25", {"algorithm": {"name": "local_sgd", "params": {"period": 8}}}),
            Series("FedAvg C=1 E=0.125", {"algorithm": {"name": "local_sgd", "params": {"period": 4}}}),
            # C = 0.5: half the workers, drawn anew each round, take part (the paper's other FedAvg setting)
            Series("FedAvg C=0.5 E=0.25",
                   {"algorithm": {"name": "local_sgd", "params": {"period": 8, "fraction": 0.5}}}),
            Series("FedAvg C=0.5 E=0.125",
                   {"algorithm": {"name": "local_sgd", "params": {"period": 4, "fraction": 0.5}}}),
            Series("SSP s=100", {"algorithm": {"name": "ssp", "params": {"staleness": 100}}}),
            Series("SelSync delta=0.3", {}),
            Series("SelSync delta=0.5", {"algorithm": {"params": {"delta": 0.5}}})],
    analyze=_table1, criteria=TABLE1_CRITERIA, metrics=_table1_metrics))
