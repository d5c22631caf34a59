"""A fleet's run (fleet.png): devices online over time (the availability events), who
took part in each round (rounds.csv), each round's time split into training, transfer and waiting
for stragglers, and accuracy over rounds and over time. Drawn for runs with client selection or
availability; nothing per device is drawn, so a thousand devices cost what ten do."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from testbed.records.reader import ROUND_SCHEMA, ROUNDS_FILE, RunRecords, read_csv_records

OFFLINE, ONLINE = "availability: offline", "availability: online"


def online_over_time(events: pd.DataFrame, workers: int) -> pd.DataFrame:
    """Devices online after each availability change (time, online), from `workers` all online at
    0: a device goes offline at its partition and comes back at its heal (run/timeline.py's
    availability_changes make both, with these details)."""
    detail = events["detail"].astype(str)
    off = events[(events["action"] == "partition") & detail.str.startswith(OFFLINE)]["time"]
    on = events[(events["action"] == "heal") & detail.str.startswith(ONLINE)]["time"]
    changes = pd.concat([pd.Series(-1, index=off.to_numpy()),
                         pd.Series(1, index=on.to_numpy())]).sort_index(kind="stable")
    times = np.concatenate([[0.0], changes.index.to_numpy(dtype=float)])
    online = workers + np.concatenate([[0], np.cumsum(changes.to_numpy())])
    return pd.DataFrame({"time": times, "online": online})


def round_split(rounds: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Each round's open time split (round, training, transfer, waiting), means over the clients
    that finished it: training is a client's compute on the round's model (steps.csv), transfer
    the rest of the time until its update reached the PS (the model down, the update up), and
    waiting the time from its report to the round's close (stragglers, the deadline). NaN where
    the round had no report or its row no report times (records made before them)."""
    compute = steps.groupby(["node", "model_version"])["compute_seconds"].sum().to_dict() if not steps.empty else {}
    out = []
    for row in rounds.itertuples(index=False):
        names, seconds = str(row.finished).split(), str(row.report_seconds).split()
        if not names or len(names) != len(seconds):
            out.append((row.round, np.nan, np.nan, np.nan))
            continue
        reported = np.array([float(s) for s in seconds])
        training = np.minimum([compute.get((n, row.round), 0.0) for n in names], reported)
        out.append((row.round, training.mean(), (reported - training).mean(), row.open_seconds - reported.mean()))
    return pd.DataFrame(out, columns=["round", "training", "transfer", "waiting"])


def fleet_figure(rec: RunRecords, style: object = None) -> Figure | None:
    rounds = read_csv_records(rec.run_dir / ROUNDS_FILE, ROUND_SCHEMA)
    detail = rec.events["detail"].astype(str) if not rec.events.empty else pd.Series(dtype=str)
    has_availability = bool(detail.str.startswith(OFFLINE).any())
    if rounds.empty and not has_availability:
        return None
    fig = Figure(figsize=(13, 9), layout="constrained")
    halves = fig.add_gridspec(1, 2)
    left, right = fig.add_subfigure(halves[0]), fig.add_subfigure(halves[1])
    ax_online, ax_acc_t = left.subplots(2, 1, sharex=True)
    ax_who, ax_split, ax_acc_r = right.subplots(3, 1, sharex=True)
    _online(ax_online, rec, rounds)
    _accuracy(ax_acc_t, rec.evals, "time", "wall time (s)")
    if not rounds.empty:
        _participants(ax_who, rounds)
        _split(ax_split, rounds, round_split(rounds, rec.steps))
    _accuracy(ax_acc_r, rec.evals, "step", "round (the PS's model version)")
    fig.suptitle(f"fleet: {rec.name}", fontsize=11)
    return fig


def _online(ax, rec: RunRecords, rounds: pd.DataFrame) -> None:
    workers = sum(1 for role in rec.node_roles.values() if role == "worker")
    series = online_over_time(rec.events, workers) if not rec.events.empty else pd.DataFrame(
        {"time": [0.0], "online": [workers]})
    ax.step(series["time"], series["online"], where="post", lw=1.2, label="online (availability)")
    if not rounds.empty:
        ax.plot(rounds["time"], rounds["n_online"], ".", ms=3, label="online as the PS saw it, at each round's close")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("devices")
    ax.set_title(f"devices online ({workers} in the fleet)", fontsize=10, loc="left")
    ax.legend(fontsize=8, loc="lower right")


def _participants(ax, rounds: pd.DataFrame) -> None:
    for column, label in (("n_selected", "selected"), ("n_finished", "finished in time"), ("n_dropped", "dropped")):
        ax.step(rounds["round"], rounds[column], where="mid", lw=1.1, label=label)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("devices")
    ax.set_title("participants per round", fontsize=10, loc="left")
    ax.legend(fontsize=8, loc="upper right")


def _split(ax, rounds: pd.DataFrame, split: pd.DataFrame) -> None:
    ax.set_ylabel("seconds")
    if split[["training", "transfer", "waiting"]].isna().all().all():
        ax.bar(rounds["round"], rounds["open_seconds"], width=1.0, color="0.6")
        ax.set_title("round time (these records have no report times to split it)", fontsize=10, loc="left")
        return
    bottom = np.zeros(len(split))
    for column, label in (("training", "training"), ("transfer", "transfer (model down, update up)"),
                          ("waiting", "waiting for stragglers")):
        values = split[column].fillna(0).clip(lower=0).to_numpy()
        ax.bar(split["round"], values, bottom=bottom, width=1.0, label=label)
        bottom += values
    ax.set_title("round time: mean over the clients that finished it", fontsize=10, loc="left")
    ax.legend(fontsize=8, loc="upper right")


def _accuracy(ax, evals: pd.DataFrame, x: str, label: str) -> None:
    if not evals.empty:
        ax.plot(evals[x], evals["accuracy"], lw=1.2)
    ax.set_xlabel(label)
    ax.set_ylabel("accuracy")
    ax.set_title(f"accuracy over {'time' if x == 'time' else 'rounds'}", fontsize=10, loc="left")
