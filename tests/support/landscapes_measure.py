"""Simulated sweeps that pay for trial time, with adaptive measurement and racing (tests and bench).

One trial at a time (max_in_flight=1, as on the CPU), so "trial seconds" is the sum of:
a start-up cost (process, model build, warm-up compile), the warm-up steps, and the
timed steps, each at the landscape's noisy step time. An OOM costs start-up plus one step.

Fixed measurement times `landscape.steps` steps. Adaptive measurement times steps until
core/measure.py's enough_measured says stop; racing stops a trial once cannot_win
says its interval lies below the finished leader's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from support.landscapes import Landscape
from sweep.core.measure import cannot_win, enough_measured, race_reason
from sweep.core.ranking import ranked_ok
from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.stats import throughput_summary
from sweep.core.strategies import Strategy


@dataclass(frozen=True)
class Measurement:
    adaptive: bool = False  # stop when the median is known to +-target_precision
    racing: bool = False  # stop a trial that cannot beat the leader
    target_precision: float = 0.02
    min_steps: int = 8  # trial.measure_steps
    max_steps: int = 32  # trial.max_measure_steps
    warmup_steps: int = 2
    startup_s: tuple[float, float] = (5.0, 30.0)  # uniform range of a trial's fixed cost


@dataclass
class SimSweep:
    results: dict[str, TrialResult]
    trial_s: float  # sum of every trial's simulated wall time
    stopped_early: int  # trials racing stopped
    skipped_on_prediction: dict[str, bool] = field(default_factory=dict)  # key -> truly OOM?


def run_measured_sweep(strategy: Strategy, land: Landscape, how: Measurement, seed: int = 0) -> SimSweep:
    rng = random.Random(seed)
    finished: dict[str, TrialResult] = {}
    by_key = {c.key: c for c in land.valid()}
    total, stopped = 0.0, 0
    skipped: dict[str, bool] = {}
    while True:
        for key in strategy.predicted_ooms(finished):
            skipped.setdefault(key, land.outcome(by_key[key])[0] == OOM)
        prop = strategy.propose(dict(finished), frozenset())
        if not prop.candidates:
            return SimSweep(finished, total, stopped, skipped)
        c = prop.candidates[0]
        res = land.trial(c, rng)  # outcome, peak; step times are drawn below
        wall = rng.uniform(*how.startup_s)
        if res.status != OK:
            total += wall + land.step_time_s(c)
            finished[c.key] = res
            continue
        leader = next(iter(ranked_ok(finished)), None)
        offset = math.exp(rng.gauss(0.0, land.trial_noise))
        times: list[float] = []
        wall += how.warmup_steps * land.step_time_s(c)
        limit = how.max_steps if how.adaptive else land.steps
        while len(times) < limit:
            t = land.step_time_s(c) * offset * math.exp(rng.gauss(0.0, land.step_noise))
            if rng.random() < land.outlier_rate:
                t *= rng.uniform(1.3, 2.0)
            times.append(t)
            wall += t
            if how.adaptive and enough_measured(
                times, target_precision=how.target_precision, min_steps=how.min_steps, max_steps=how.max_steps
            ):
                break
            if how.racing and leader is not None:
                _, low, high = throughput_summary(times, land.global_batch_size)
                lead = (leader.throughput_low or 0.0, leader.throughput_high or 0.0)
                if cannot_win((low, high), lead, candidate_steps=len(times), leader_steps=len(leader.step_times_s)):
                    res.stopped_early = race_reason((low, high), lead, leader.key)
                    stopped += 1
                    break
        res.step_times_s = times
        res.throughput, res.throughput_low, res.throughput_high = throughput_summary(times, land.global_batch_size)
        res.wall_s = wall
        total += wall
        finished[c.key] = res
