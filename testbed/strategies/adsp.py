"""ADSP (Wang et al., adsp.txt): heterogeneous workers never wait, and commit equally often.

Time is cut into check periods of Gamma seconds. Worker i trains mini-batch after mini-batch
on its own copy (W_i <- W_i - eta' g, the local lr eta' = workload.lr) and accumulates
U_i = sum eta' g since its last commit. It commits U_i every Gamma / dC_i seconds, less the
time its last commit and pull took (O_i); the PS applies W <- W - eta U_i (eta = global_lr,
default 1/M for M workers, NOTES.md) and returns W, which the worker continues from (Sec. 4).

At each checkpoint the scheduler sets the target total commits C_target, and every worker's
commit rate for the next period is dC_i = C_target - c_i (c_i: its commits so far), so a
worker that fell short catches up and all commit about equally often over time, whatever
their speed.

The commit rate search (Alg. 1, Sec. 4.2) runs at the PS, online: each scheduler epoch
(`epoch_seconds`) it tries a candidate for `trial_seconds`, then the next one up, and keeps
going up while the reward improves; the last better one is kept for the rest of the epoch.
The reward of a trial: fit loss = 1/(a1^2 t + a2) + a3 to its (time, loss) samples (the
training losses the workers report with their commits) and take r = a1^2 / (1/(l* - a3) - a2),
the reciprocal of the time the curve needs to reach l* (`target_loss`; default: the lower of
the two compared trials' fitted final losses). Read literally (`reward: paper`) this favours
whichever trial came later, since it starts at a lower loss: measured in the unit test, the
search then climbs every minute. edgebed's default (`same_stretch`) times both fitted curves
over the same stretch of loss, from the higher of their starting losses down to l*
(a2 -> 1/(l_start - a3)), which compares their speed and not where they started.
Two readings of Alg. 1 (NOTES.md), by `search`:
  increment (default)  the candidate is k, the growth of C_target per checkpoint: C_target += k
                       at every checkpoint, so laggards catch up and all commit k times a period;
                       the search starts at `commits_per_period`.
  literal              the candidate is C_target itself, from max_i c_i + 1 at the epoch's start,
                       with dC_i = C_target - c_i (at least 1); as c_i grow past it the rates
                       fall to one commit a period, which is why it is not the default.
  off                  k = `commits_per_period`, fixed.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Callable, Literal, Optional

import torch
from pydantic import Field

from testbed.records.virtual import VIRTUAL_TIME
from testbed.strategies.base import ServerState, Strategy, StrategyParams, Tensors, WorkerContext


class ADSPParams(StrategyParams):
    check_period: Annotated[float, VIRTUAL_TIME] = Field(60.0, gt=0, description="Gamma: seconds between checkpoints")
    commits_per_period: int = Field(1, ge=1, description="k: C_target grows by k every checkpoint")
    global_lr: Optional[float] = Field(None, gt=0, description="eta at the PS (default 1/M for M workers)")
    search: Literal["increment", "literal", "off"] = Field("increment",
                                                           description="Alg. 1's online commit rate search")
    trial_seconds: Annotated[float, VIRTUAL_TIME] = Field(60.0, gt=0, description="how long each candidate is "
                                                          "evaluated online")
    epoch_seconds: Annotated[float, VIRTUAL_TIME] = Field(1200.0, gt=0, description="scheduler epoch: the search "
                                                          "restarts at each")
    target_loss: Optional[float] = Field(None, gt=0, description="l* of the reward (default: see above)")
    reward: Literal["same_stretch", "paper"] = Field("same_stretch", description="how trials are compared")


def fit_loss_curve(samples: list[tuple[float, float]], grid: int = 100) -> Optional[tuple[float, float, float]]:
    """(a1^2, a2, a3) of loss = 1/(a1^2 t + a2) + a3 fitted to (t, loss) samples (least squares in
    loss): for each a3 on a grid below the smallest loss, 1/(loss - a3) is linear in t; the grid
    is then refined around the best a3."""
    if len(samples) < 3:
        return None
    t = torch.tensor([s[0] for s in samples], dtype=torch.float64)
    loss = torch.tensor([s[1] for s in samples], dtype=torch.float64)
    if float(t.max() - t.min()) <= 0:
        return None
    design = torch.stack([t, torch.ones_like(t)], 1)

    def at(a3: float):
        z = 1.0 / (loss - a3)
        slope, a2 = torch.linalg.lstsq(design, z.unsqueeze(1)).solution.squeeze(1).tolist()
        denom = slope * t + a2
        if slope < 0 or bool((denom <= 0).any()):
            return None
        return float(((1.0 / denom + a3 - loss) ** 2).sum()), slope, a2, a3

    low = float(loss.min())
    top = low - 1e-9 * max(1.0, abs(low))
    lo, hi = (0.0 if low > 0 else low - 1.0), top  # a loss (cross-entropy) never falls below 0
    best = None
    for _ in range(3):  # coarse grid, then twice finer around the best
        step = (hi - lo) / grid
        for a3 in torch.linspace(lo, hi, grid + 1).tolist():
            r = at(a3)
            if r is not None and (best is None or r[0] < best[0]):
                best = r
        if best is None:
            return None
        lo, hi = max(lo, best[3] - step), min(top, best[3] + step)
    return best[1:]


def fitted_loss(fit: tuple[float, float, float], t: float) -> float:
    a1sq, a2, a3 = fit
    return 1.0 / (a1sq * t + a2) + a3


def reward(fit: Optional[tuple[float, float, float]], target: float, start: Optional[float] = None) -> float:
    """r = a1^2 / (1/(l* - a3) - a2): the reciprocal of the time the fitted curve needs to reach
    l* from its trial's start (0: never). With `start`, the time from loss `start` to l* on the
    curve instead (a2 -> 1/(start - a3)), so trials that began at different losses are judged
    over the same stretch."""
    if fit is None:
        return 0.0
    a1sq, a2, a3 = fit
    if a1sq <= 0 or target <= a3:
        return 0.0
    if start is not None:
        a2 = 1.0 / (start - a3) if start > a3 else 0.0
    denom = 1.0 / (target - a3) - a2
    return math.inf if denom <= 0 else a1sq / denom


class CommitRateSearch:
    """Alg. 1 at the scheduler: candidates tried online one after another, each for a trial."""

    def __init__(self, p: ADSPParams):
        self.p = p
        self.candidate = p.commits_per_period  # k (increment) or C_target (literal)
        self.epoch_start: Optional[float] = None
        self.trial_start: Optional[float] = None
        self.samples: list[tuple[float, float]] = []
        self.previous: Optional[tuple[int, tuple, float]] = None  # (candidate, fit, trial length)
        self.settled_until: Optional[float] = None
        self.log: list[dict] = []
        self.origin: Optional[float] = None  # log times count from the first epoch's start

    def start_epoch(self, now: float, first: int) -> None:
        if self.origin is None:
            self.origin = now
        self.epoch_start = now
        self.settled_until = None
        self.previous = None
        self.candidate = first
        self._start_trial(now)

    def _start_trial(self, now: float) -> None:
        self.trial_start = now
        self.samples = []

    def observe(self, now: float, loss: float) -> None:
        if self.trial_start is not None and self.settled_until is None and math.isfinite(loss):
            self.samples.append((now - self.trial_start, loss))

    def tick(self, now: float) -> bool:
        """Advance the search; True when the candidate changed."""
        if self.settled_until is not None or self.trial_start is None:
            return False
        if now - self.trial_start < self.p.trial_seconds:
            return False
        fit = fit_loss_curve(self.samples)
        length = now - self.trial_start
        if self.previous is None:
            self.previous = (self.candidate, fit, length)
            self.log.append({"time": now - self.origin, "candidate": self.candidate, "fit": fit,
                             "decision": "try next"})
            self.candidate += 1
            self._start_trial(now)
            return True
        cand_a, fit_a, len_a = self.previous
        fits = [(f, n) for f, n in ((fit_a, len_a), (fit, length)) if f is not None]
        target = self.p.target_loss or (min(fitted_loss(f, n) for f, n in fits) if fits else 0.0)
        start = max(fitted_loss(f, 0.0) for f, _ in fits) if fits and self.p.reward == "same_stretch" else None
        r_a, r_b = reward(fit_a, target, start), reward(fit, target, start)
        better = r_b > r_a
        self.log.append({"time": now - self.origin, "candidate": self.candidate, "fit": fit, "target_loss": target,
                         "reward_previous": r_a, "reward": r_b,
                         "decision": "try next" if better else f"keep {cand_a}"})
        if better:
            self.previous = (self.candidate, fit, length)
            self.candidate += 1
            self._start_trial(now)
        else:
            self.candidate = cand_a
            self.settled_until = (now if self.epoch_start is None else self.epoch_start) + self.p.epoch_seconds
        return True


class ADSP(Strategy):
    name = "adsp"
    summary = "no waiting: workers train locally and commit accumulated updates at rates that equalize commits"
    paper = "ADSP Sec. 4, Alg. 1 (online commit rate search) and Alg. 2"
    Params = ADSPParams

    def __init__(self, params=None, clock: Callable[[], float] = time.monotonic):
        super().__init__(params)
        self.clock = clock
        # worker side
        self._acc: Optional[Tensors] = None
        self._interval = self.params.check_period / self.params.commits_per_period
        self._last_commit: Optional[float] = None
        self._overhead = 0.0  # O_i: how long the last commit + pull took
        self._commit_started: Optional[float] = None
        # server side
        self._start: Optional[float] = None
        self.commits: dict[str, int] = {}
        self.search = CommitRateSearch(self.params)
        self._period = 0  # checkpoints passed
        self._c_target = self.params.commits_per_period  # increment: C_target of the current period

    # -- scheduler (at the PS) -----------------------------------------------------------
    def checkpoint(self) -> int:
        """Index of the current check period (0 until the first checkpoint); advances the
        search and C_target as time passes."""
        now = self.clock()
        if self._start is None:
            self._start = now
            if self.params.search != "off":
                self.search.start_epoch(now, self._epoch_first())
        mode = self.params.search
        if mode != "off":
            s = self.search
            if s.settled_until is not None and now >= s.settled_until:
                s.start_epoch(now, self._epoch_first())
            if s.tick(now) and mode == "literal":
                self._c_target = s.candidate
        idx = int((now - self._start) // self.params.check_period)
        while self._period < idx:
            self._period += 1
            if mode != "literal":
                self._c_target += self.k
        return idx

    def _epoch_first(self) -> int:
        if self.params.search == "literal":
            self._c_target = max(self.commits.values(), default=0) + 1  # Alg. 1 line 3
            return self._c_target
        return self.params.commits_per_period

    @property
    def k(self) -> int:
        """Commits per period that C_target grows by (increment reading)."""
        return self.search.candidate if self.params.search == "increment" else self.params.commits_per_period

    def c_target(self) -> int:
        """Total commits every worker should have made by the end of the current period."""
        self.checkpoint()
        return self._c_target

    def commit_rate(self, worker: str) -> int:
        """dC_i = C_target - c_i, at least one commit per period."""
        return max(1, self.c_target() - self.commits.get(worker, 0))

    def report(self) -> dict:
        return {"commits": dict(self.commits), "c_target": self._c_target, "search": self.params.search,
                "candidate": self.search.candidate, "search_log": self.search.log}

    def server_reply_meta(self, server: ServerState, worker: str) -> dict:
        period_left = self.params.check_period - ((self.clock() - self._start) % self.params.check_period) \
            if self._start is not None else self.params.check_period
        rate = self.commit_rate(worker)
        # the remaining commits of this period, spread over what is left of it
        return {"commit_interval": period_left / rate, "commit_rate": rate}

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        if server.push_meta.loss is not None:  # the reward's (time, loss) samples (null: not a number)
            self.search.observe(self.clock(), server.push_meta.loss)
        self.checkpoint()
        self.commits[worker] = self.commits.get(worker, 0) + 1
        eta = self.params.global_lr or 1.0 / max(1, server.n_workers)
        server.apply(payload, eta)
        server.log.append((worker, server.version - 1 - base_version, eta))
        return [worker]

    # -- worker --------------------------------------------------------------------------
    def worker_on_model(self, meta: dict) -> None:
        now = self.clock()
        if self._commit_started is not None:
            self._overhead = now - self._commit_started
            self._commit_started = None
        if "commit_interval" in meta:
            self._interval = float(meta["commit_interval"])
        self._last_commit = now

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if self._acc is None:
            self._acc = {n: torch.zeros_like(g, dtype=torch.float32) for n, g in grads.items()}
        for n, g in grads.items():
            self._acc[n].add_(g.detach().to(torch.float32), alpha=ctx.lr)  # U_i = sum eta' g
        now = self.clock()
        if self._last_commit is None:
            self._last_commit = now
        if now - self._last_commit < self._interval - self._overhead:
            return None  # keep training: the worker applies eta' g to its own copy
        out, self._acc = self._acc, None
        self._commit_started = now
        return out
