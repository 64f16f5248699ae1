"""The recorded H100 sweeps (tests/data/h100/*.json) as landscapes, with the pairs they lack filled in.

A recorded sweep ran only the pairs its search chose (6-8 of 35). A replay must answer for every
pair, so each recording becomes a landscape:

* recorded pairs keep what the card did: status, OOM phase, the timed step at which a late OOM
  struck, peaks, tightness, and step times drawn from that pair's own recorded steps;
* step time of an unrecorded pair: fitted on the recorded ok pairs' median step times by
  non-negative least squares, t = fixed + per_micro_batch * accum + per_joint_chunk * accum * split
  (landscapes.py's step model: at a fixed per-device total, accum micro-batches each pay a fixed
  cost, and accum * split joint chunks each pay theirs), so throughput follows the per-device and
  joint batch;
* memory of an unrecorded pair: what the recorded pairs imply (core/implications: an OOM implies
  OOM at bigger split and joint batch, an ok pair implies fit at smaller), else the memory model
  (core/memory_model.py) fitted on every recorded peak, its mean prediction against the capacity;
  tight where that peak leaves less than 5% of the capacity (the cuda default margin);
* per-step spread: each step is the pair's time times a residual drawn from the recorded steps
  (every recorded step over its own pair's median; a recorded pair draws its own), times one
  run-to-run offset per trial (sd 0.3%, the field notes' fresh-process agreement at this scale);
* start-up: a fresh trial process pays one of the recorded start-ups (an ok trial's wall minus its
  warm-up and timed steps: 11.8-16.3 s).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from sweep.core.implications import fit_implied, oom_implied
from sweep.core.memory_model import fit_from_results, predict_peak
from sweep.core.schema import OK, OOM, PHASE_JOINT, TrialResult
from sweep.core.space import Candidate, enumerate_candidates

DATA = Path(__file__).resolve().parents[1] / "data" / "h100"
RUN_TO_RUN = 0.003  # relative sd of one pair between fresh processes (field notes: within 0.3%)
TIGHT_MARGIN = 0.05  # MEMORY_MARGIN["cuda"]


@dataclass
class Recorded:
    """What the card did for one pair."""

    status: str
    oom_phase: str | None
    oom_at_step: int | None  # timed steps that ran before a late OOM; 0: at the first step or warm-up
    step_times_s: list[float]
    peak_mem_gib: float | None
    peak_reserved_gib: float | None
    tight: bool


@dataclass
class RecordedLandscape:
    name: str
    global_batch_size: int
    capacity_gib: float
    recorded: dict[str, Recorded]
    startups_s: list[float]
    residuals: list[float]  # every recorded step time over its pair's median
    coefficients: tuple[float, float, float]  # fixed, per micro-batch, per joint chunk (s)
    pairs: dict[str, Candidate] = field(default_factory=dict)
    model_peaks: dict[str, float] = field(default_factory=dict)  # unrecorded pairs: predicted reserved peak

    def valid(self) -> list[Candidate]:
        return list(self.pairs.values())

    def source(self, c: Candidate) -> str:
        return "recorded" if c.key in self.recorded else "model"

    def step_time_s(self, c: Candidate) -> float:
        rec = self.recorded.get(c.key)
        if rec is not None and rec.step_times_s and rec.status == OK:
            return statistics.median(rec.step_times_s)
        fixed, micro, chunk = self.coefficients
        return fixed + micro * c.accum + chunk * c.accum * c.split

    def outcome(self, c: Candidate) -> tuple[str, str | None, int | None]:
        """(status, OOM phase, timed steps before a late OOM) as the full trial would end."""
        rec = self.recorded.get(c.key)
        if rec is not None:
            return rec.status, rec.oom_phase, rec.oom_at_step
        peak = self.model_peaks[c.key]
        return (OOM, PHASE_JOINT, 0) if peak > self.capacity_gib else (OK, None, None)

    def peaks(self, c: Candidate) -> tuple[float | None, float | None]:
        rec = self.recorded.get(c.key)
        if rec is not None:
            return rec.peak_mem_gib, rec.peak_reserved_gib
        return None, self.model_peaks[c.key]

    def tight(self, c: Candidate) -> bool:
        rec = self.recorded.get(c.key)
        if rec is not None:
            return rec.tight
        return self.model_peaks[c.key] > self.capacity_gib * (1 - TIGHT_MARGIN)

    def draw_steps(self, c: Candidate, rng: random.Random, n: int) -> list[float]:
        rec = self.recorded.get(c.key)
        base = self.step_time_s(c)
        own = [t / base for t in rec.step_times_s] if rec is not None and rec.status == OK and rec.step_times_s else self.residuals
        offset = math.exp(rng.gauss(0.0, RUN_TO_RUN))
        return [base * offset * rng.choice(own) for _ in range(n)]

    def startup_s(self, rng: random.Random) -> float:
        return rng.choice(self.startups_s)


def load(name: str) -> RecordedLandscape:
    data = json.loads((DATA / f"{name}.json").read_text())
    trials = data["trials"]
    gbs = 128
    capacity = float(trials[0]["capacity_gib"])
    recorded: dict[str, Recorded] = {}
    results: list[TrialResult] = []
    startups, residuals = [], []
    rows, times = [], []
    for t in trials:
        c = Candidate(t["accum"], t["split"], t["per_device_batch"], t["joint_batch"], True)
        steps = [float(x) for x in t["step_times_s"]]
        late = len(steps) if t["status"] == OOM else None
        recorded[c.key] = Recorded(t["status"], t["oom_phase"], late, steps, t["peak_mem_gib"], t["peak_reserved_gib"], bool(t["tight"]))
        results.append(
            TrialResult(**c.numbers(gbs, 1), status=t["status"], oom_phase=t["oom_phase"], peak_mem_gib=t["peak_mem_gib"],
                        peak_reserved_gib=t["peak_reserved_gib"])
        )
        if t["status"] == OK:
            med = statistics.median(steps)
            residuals += [x / med for x in steps]
            startups.append(t["wall_s"] - sum(steps) - t["warmup_steps"] * med)
            rows.append((1.0, c.accum, c.accum * c.split))
            times.append(med)
    coef, _ = nnls(np.array(rows, dtype=float), np.array(times))
    land = RecordedLandscape(name, gbs, capacity, recorded, startups, residuals, (float(coef[0]), float(coef[1]), float(coef[2])))
    fit = fit_from_results(results, capacity)
    for c in enumerate_candidates(gbs, 1, None, None):
        if not c.valid:
            continue
        land.pairs[c.key] = c
        if c.key in recorded:
            continue
        if oom_implied(c, results):
            land.model_peaks[c.key] = math.inf
            continue
        pred = predict_peak(fit, c)
        peak = pred.peak_gib if pred is not None else math.inf  # unknown: treated as not fitting
        if fit_implied(c, results):  # an ok pair needing at least as much bounds it
            peak = min(peak, min(float(r.peak_reserved_gib or 0.0) for r in results
                                 if r.status == OK and c.split <= r.split and c.joint_batch <= r.joint_batch))
        land.model_peaks[c.key] = peak
    return land


RECORDINGS = ("base80", "large80", "base24")
