"""Which timed steps measured the steady state (pure): warm-up that outlasts trial.warmup_steps is left out.

trial.warmup_steps is a guess at how long a trial takes to warm up. A cold page cache, a cold kernel or
compile cache, a `torch.compile` recompile or a host hiccup can outlast it: the first timed steps then run
slower than the rest, and a figure that counts them measures the warm-up, not the pair. Two rules:

1. transient_steps: leading timed steps that stand out above the level the later steps settle at are
   warm-up. The level and its spread are the median and the normal-scaled MAD of the later half's log
   step times; a leading step counts as warm-up while it lies above that level by more than
   TRANSIENT_SDS spreads and TRANSIENT_MIN_SLOWER at least (so run-to-run jitter never trims). Only a run of
   slow steps at the start is trimmed: a slow step in the middle is a stall or a hiccup, which the
   wall-time figure counts (core/stats.py), and where such steps recur later (a trainer that stalls
   every few steps), a leading step is warm-up only if it is slower than every one of them: a stall that
   happens to come first is the trainer's, not warm-up. At least MIN_KEPT steps are kept, and fewer than
   MIN_TO_JUDGE timed steps say nothing (one step cannot show it is slow).
2. still_warming: the steps kept must show no falling trend beyond the noise (Kendall's tau against the
   step index, one-sided, p < TREND_P, and the first third's median slower than the last third's by more
   than TREND_MIN_SLOWER, and the middle third's by more than half that: still falling at the end, where a
   machine that got quieter part-way steps down once and stays flat). A warm-up that fades gradually (a real framework's first steps on a CPU) is
   trimmed the same way, from the front, while what is left still falls and more than 2 * MIN_KEPT steps
   remain; a trial still speeding up at its last steps never reached its steady state, so its figure is
   no measurement of the pair (core/validity.py); judged on runs of up to MAX_POINTS steps, since a warm-up lasts
   a handful of steps and a trend over hundreds is the machine's load changing. A rising trend (the machine got busier) is not checked
   here: the run-to-run noise in the confidence score covers it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from sweep.core.stats import STALL_EPISODES, special

MIN_TO_JUDGE = 4  # timed steps before the first can be called slow
MIN_KEPT = 3  # steps always left for the figure
TRANSIENT_SDS = 4.0  # how far above the later steps' level (in robust spreads) a leading step must be
TRANSIENT_MIN_SLOWER = 0.15  # and at least this much slower than that level: jitter is not warm-up
TREND_P = 0.01  # one-sided p-value of Kendall's tau below which a falling trend is real
TREND_MIN_SLOWER = 0.10  # the first third must also be this much slower than the last third
_NORMAL_MAD_SCALE = 0.6744897501960817  # as core/confidence.py: MAD / this estimates a normal sd


MAX_POINTS = 48  # longer runs are judged on the medians of MAX_POINTS runs of consecutive steps


def _binned(times: list[float]) -> tuple[list[float], int]:
    """At most MAX_POINTS medians of consecutive steps, and how many steps each holds: a run of thousands of
    steps (trial.max_measure_steps is the user's) is judged at a bounded cost, and rechecked every step."""
    if len(times) <= MAX_POINTS:
        return times, 1
    size = -(-len(times) // MAX_POINTS)
    return [float(np.median(times[i : i + size])) for i in range(0, len(times), size)], size


def transient_steps(step_times_s: Sequence[float]) -> int:
    """How many leading timed steps are still warm-up (rules 1 and 2); 0 when none stand out, or too few to judge."""
    times = [float(t) for t in step_times_s]
    if len(times) < MIN_TO_JUDGE or not all(t > 0 and math.isfinite(t) for t in times):
        return 0
    if len(times) > MAX_POINTS:
        points, size = _binned(times)
        return min(len(times) - MIN_KEPT, transient_steps(points) * size)
    k = _slow_leaders(times)
    while len(times) - k > 2 * MIN_KEPT and still_warming(times[k:]):
        k += 1  # a warm-up that fades gradually: drop from the front until what is left has settled
    return k


def _slow_leaders(times: list[float]) -> int:
    """Rule 1: the leading steps that stand out above the later half's level."""
    n = len(times)
    logs = np.log(times)
    later = logs[n // 2 :]
    level = float(np.median(later))
    spread = float(np.median(np.abs(later - level))) / _NORMAL_MAD_SCALE
    bound = level + max(TRANSIENT_SDS * spread, math.log1p(TRANSIENT_MIN_SLOWER))
    k = 0
    while k < n - MIN_KEPT and logs[k] > bound:
        k += 1
    later_slow = logs[k:] > bound
    if k and int(np.sum(later_slow[1:] & ~later_slow[:-1])) + int(later_slow[0]) >= STALL_EPISODES:
        # The slow steps recur after the leading run: the trainer stalls. Only what outlasts its worst stall is warm-up.
        worst_stall = float(logs[k:][later_slow].max())
        k = 0
        while k < n - MIN_KEPT and logs[k] > worst_stall:
            k += 1
    return k


def steady_steps(step_times_s: Sequence[float]) -> list[float]:
    """The timed steps that measured the steady state: all but the leading warm-up (rule 1)."""
    times = [float(t) for t in step_times_s if t > 0]
    return times[transient_steps(times) :]


def falling_trend_p(step_times_s: Sequence[float]) -> float:
    """One-sided p-value that step times fall with the step index (Kendall's tau, normal approximation
    with the tie correction); 1.0 for fewer than MIN_TO_JUDGE steps."""
    times = np.asarray([float(t) for t in step_times_s], dtype=float)
    n = times.size
    if n < MIN_TO_JUDGE:
        return 1.0
    i, j = np.triu_indices(n, k=1)
    s = float(np.sign(times[j] - times[i]).sum())  # negative: later steps faster
    _, counts = np.unique(times, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18.0
    if var <= 0:
        return 1.0
    z = (s + 1.0) / math.sqrt(var)  # continuity correction towards "no trend"
    return float(special().ndtr(z))


def still_warming(step_times_s: Sequence[float]) -> str:
    """Why the kept steps never settled (rule 2), one line, or "" when they show no falling trend."""
    steps = [float(t) for t in step_times_s if t > 0]
    if len(steps) > MAX_POINTS:
        # A warm-up lasts a handful of steps (a compile, a cold cache); a trend over hundreds is the machine's load
        # changing (the full suite's made a 1200-step trial "66% slower in its first third"), which the run-to-run
        # noise covers. Such a run is trimmed of its slow start (transient_steps), not judged on its trend.
        return ""
    times = steps
    n = len(times)
    if n < 2 * MIN_KEPT:
        return ""
    third = max(2, n // 3)
    first, last = float(np.median(times[:third])), float(np.median(times[-third:]))
    middle = float(np.median(times[third:-third])) if n - 2 * third >= 2 else first
    slower = first / last - 1.0
    # Still falling into the last third, not only from the first: a machine that got quieter part-way (another job
    # ended) is a step down that then stays flat, which the run-to-run noise covers; a warm-up that never settled is not.
    if slower <= TREND_MIN_SLOWER or middle / last - 1.0 <= TREND_MIN_SLOWER / 2:
        return ""
    p = falling_trend_p(times)
    if p >= TREND_P:
        return ""
    return (
        f"still speeding up at its last step: the first third of its {len(steps)} timed steps ran {slower:.0%} slower than the "
        f"last third (falling trend, p={p:.2g}), so it never reached a steady state; raise trial.warmup_steps"
    )


REGIME_FACTOR = 2.0  # one pace, then another this many times slower or faster: two regimes, not one's noise
# Steps on each side of the change. A busy box's neighbour starting or ending moves a few steps at once (a 2x run of
# three was seen under two busy loops): a phase of the trainer's own lasts longer than that.
MIN_REGIME_STEPS = 5
REGIME_BINS = 64


def changed_pace(step_times_s: Sequence[float]) -> str:
    """The change of pace below (_changed_pace), cached on the steps: the table and the score ask it of every ok
    record each time one lands."""
    return _changed_pace(tuple(float(t) for t in step_times_s))


@lru_cache(maxsize=4096)
def _changed_pace(step_times_s: tuple[float, ...]) -> str:
    """One line where the timed steps are two regimes (steps at one pace, then at another REGIME_FACTOR or more apart
    for the rest), or "". Not a rejection: a busy box's neighbour starting or ending does this to a right figure (a
    real Lightning and HF trial at 3x under a loaded test run), and the figure, samples over the whole window's wall
    time, is what that window trained at. It is no steady state either, so the score holds such a pair below 80 while
    it could be the answer (core/confidence.py unsteady), and the table says why (its `stalls` column). The two
    sides must not overlap (the slower side's fastest step slower than the faster side's slowest): a stall every few
    steps is one regime's, whose figure counts it. A slow start core/steady.py trims never reaches
    here; a busy box's drift (a neighbour's job ending: 1.6x) stays under the factor."""
    steps = [float(t) for t in step_times_s if t > 0]
    if len(steps) < 2 * MIN_REGIME_STEPS:
        return ""
    # A long run (a warm worker's 1200 steps) is judged on the medians of REGIME_BINS runs of steps: a bounded cost.
    times = steps if len(steps) <= REGIME_BINS else [float(np.median(b)) for b in np.array_split(np.asarray(steps), REGIME_BINS)]
    per_bin = len(steps) / len(times)
    logs = np.log(np.asarray(times))
    # The change point: where the two sides' spread about their own medians is least (of log step times).
    k = min(range(MIN_REGIME_STEPS, len(times) - MIN_REGIME_STEPS + 1),
            key=lambda k: float(np.abs(logs[:k] - np.median(logs[:k])).sum() + np.abs(logs[k:] - np.median(logs[k:])).sum()))
    before, after = np.asarray(times[:k]), np.asarray(times[k:])
    slow, fast = (after, before) if np.median(after) > np.median(before) else (before, after)
    ratio = float(np.median(slow) / np.median(fast))
    if ratio < REGIME_FACTOR or slow.min() <= fast.max():
        return ""
    first, rest, at = float(np.median(times[:k])), float(np.median(times[k:])), round(k * per_bin)
    return (
        f"the steps changed pace mid-trial: {at} at {first * 1e3:.4g} ms, then {len(steps) - at} at {rest * 1e3:.4g} ms "
        f"({ratio:.3g}x): not one steady regime (the host's load changed, or a phase before or after the training loop)"
    )
