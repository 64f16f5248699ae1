"""When to stop measuring a trial: adaptive measurement and racing (pure).

Adaptive measurement: a trial times steps until the 95% interval of its
wall-time throughput (samples over the wall time of its timed steps, stalls
included: core/stats.py's throughput_summary) lies within +-target_precision of
it, after at least min_steps and at most max_steps timed steps. A slow step
widens that interval, so a trial with a hiccup measures longer, which dilutes it.

Racing: a running trial whose interval's upper bound has fallen below the
leader's lower bound cannot win and is stopped; its partial measurement is kept
(status ok, `stopped_early` says why). Two guards against stopping on noise:
both intervals must rest on at least MIN_INTERVAL_STEPS steps (two periods of a
stall every third step; fewer make a t-interval of a few degrees of freedom that
a slow first step can swing), and the gap
must exceed RACE_MARGIN, the between-trial drift a trial's own step scatter does
not show (core/confidence.py's TRIAL_FLOOR).

A running trial's progress.json and the orchestrator's stop.json are read and written in
sweep/records.py; here is only what they hold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from sweep.core.config import TrialConfig
from sweep.core.stats import throughput_summary

# Fewer timed steps give no interval racing, the decision or the score count as a measurement: a stall every third
# step shows twice in 6, and a t-interval on 5 degrees of freedom is already 2.6 standard errors wide.
MIN_INTERVAL_STEPS = 6
RACE_MARGIN = 0.01  # relative gap required between the two intervals

Interval = tuple[float, float]  # (low, high) samples/s

# The racing protocol's files in a trial dir. The trial alone writes PROGRESS_FILE (its timed
# steps so far); the orchestrator alone writes STOP_FILE ({"reason": ...}) to stop a trial that
# cannot win. A trial polls for STOP_FILE between steps and keeps its partial measurement.
PROGRESS_FILE = "progress.json"
STOP_FILE = "stop.json"


def relative_half_widths(step_times_s: Sequence[float]) -> tuple[float, float]:
    """How far below and above the wall-time throughput its 95% interval reaches, as fractions of it."""
    mid, low, high = throughput_summary(step_times_s, 1)
    return (mid - low) / mid, (high - mid) / mid


def enough_measured(
    step_times_s: Sequence[float], *, target_precision: float, min_steps: int, max_steps: int, timed_steps: int | None = None
) -> bool:
    """True when timing may stop: the cap is reached, or the wall-time figure is known to +-target_precision.

    timed_steps: every step timed so far, where step_times_s leaves out a warm-up that outlasted trial.warmup_steps
    (core/steady.py): the cap counts those too, so a run that never settles still ends at the cap."""
    n = sum(1 for t in step_times_s if t > 0)
    if max(n, timed_steps or 0) >= max_steps:
        return True
    if n < max(min_steps, MIN_INTERVAL_STEPS):
        return False
    below, above = relative_half_widths(step_times_s)
    return max(below, above) <= target_precision


def measured_enough_for(step_times_s: Sequence[float], trial: TrialConfig, timed_steps: int | None = None) -> bool:
    """enough_measured under a trial's own settings (target_precision, measure_steps, max_measure_steps)."""
    return enough_measured(
        step_times_s, target_precision=float(trial.target_precision), min_steps=int(trial.measure_steps), max_steps=int(trial.max_measure_steps),
        timed_steps=timed_steps,
    )


def cannot_win(
    candidate: Interval,
    leader: Interval,
    *,
    candidate_steps: int,
    leader_steps: int = MIN_INTERVAL_STEPS,
    margin: float = RACE_MARGIN,
) -> bool:
    """True when the running candidate's throughput interval lies wholly below the leader's.

    candidate_steps/leader_steps: timed steps behind each interval; fewer than
    MIN_INTERVAL_STEPS on either side and nothing is decided.
    """
    if min(candidate_steps, leader_steps) < MIN_INTERVAL_STEPS:
        return False
    c_low, c_high = candidate
    l_low, l_high = leader
    if not all(math.isfinite(v) and v > 0 for v in (c_low, c_high, l_low, l_high)):
        return False
    return c_high * (1.0 + margin) < l_low


def race_reason(candidate: Interval, leader: Interval, leader_key: str) -> str:
    """The one line a stopped trial's log and `stopped_early` carry.

    It names no step count: the trial finishes the step under way when it reads the request, so the
    count racing decided on is one short of the trial's own `steps_measured`, which the table shows.
    """
    return (
        f"cannot beat the leader {leader_key} "
        f"(95% upper bound {candidate[1]:.4g} samples/s < its lower bound {leader[0]:.4g})"
    )


def progress_record(step_times_s: Sequence[float], **extra: Any) -> str:
    """PROGRESS_FILE's text: the timed step times so far (what racing builds the running interval from)."""
    return json.dumps({**extra, "step_times_s": [round(float(t), 6) for t in step_times_s]}) + "\n"


