"""Throughput statistics from per-step times (pure).

A trial's figure is the speed a user will train at: samples over wall time across its measured (post
warm-up) steps, samples_per_step * n / sum(step_times), every slow step included. A trainer that stalls
every third step (a starved data loader, an allocator flush, a periodic sync) trains at that rate, not at
its median step's: the median hid the stalls and ranked such a pair first (issue 50). A host's one-off
hiccup is met by measuring longer (core/measure.py stops on this figure's interval), not by dropping steps.

Its 95% interval is for the mean step time, on the log scale (the figure's own scale: never negative), and
honest for steps that are not independent (wall_time_half_width): stalled steps and typical steps are counted
apart, stalls at a fixed period as the near-certain count they are and stalls at random as a binomial one, and
the typical steps' scatter is the wider of their t-interval and a batch-means one over consecutive blocks
(slow spells). A t quantile at n - 1 (or blocks - 1) degrees of freedom keeps a short trial's interval honest.
The t quantile is scipy.special's stdtrit: scipy.stats' t is the same function behind a 0.5 s import that
every trial process would pay before it starts. scipy.special itself (0.25 s of CPU) is imported on first
use, through special(): a command line that is refused, or plans without scoring, never needs it.

The order-statistic interval for a median (median_interval_ranks) stays for the log parsers, whose lines are
averages over windows of steps (parsers/throughput.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import median
from typing import Any

import numpy as np

# median is re-exported: the one median (it raises StatisticsError, a ValueError, on no data).
__all__ = [
    "Z95", "interval_se", "median", "median_interval_coverage", "median_interval_ranks", "stall_note", "throughput_summary",
    "wall_time_half_width", "wall_time_se",
]

Z95 = 1.96  # a 95% interval's half-width in standard errors, as every figure here has rounded it


def special() -> Any:
    """scipy.special, imported on first use. A process that caps its address space (a CPU trial:
    workloads/rnnt/runner.py) calls this before the cap: imported under it, scipy failed to map its openblas."""
    import scipy.special

    return scipy.special


def normal_pdf(x: np.ndarray | float) -> np.ndarray:
    """The standard normal density, scipy.stats.norm.pdf's formula (scipy.special has no pdf of its own)."""
    return np.exp(-(np.asarray(x, dtype=float) ** 2) / 2.0) / math.sqrt(2.0 * math.pi)


def interval_se(low: float | None, high: float | None) -> float | None:
    """The log-throughput standard error a 95% interval [low, high] states; None without a usable one."""
    if low is None or high is None or not 0 < low < high:
        return None
    return (math.log(high) - math.log(low)) / (2 * Z95)


def median_interval_coverage(n: int, lo_rank: int) -> float:
    """P(the true median lies in [x_(lo), x_(n-1-lo)]) = 1 - 2 P(X <= lo) for X ~ Binomial(n, 1/2)."""
    return float(1.0 - 2.0 * special().bdtr(lo_rank, n, 0.5))


@lru_cache(maxsize=1024)  # a pure function of two numbers, asked for on every trial
def median_interval_ranks(n: int, level: float = 0.95) -> tuple[int, int]:
    """0-based order-statistic ranks (lo, hi) bracketing the median at `level`.

    [x_(k), x_(n-1-k)] covers the true median with probability 1 - 2 P(X <= k) for
    X ~ Binomial(n, 1/2); take the largest k < n-1-k that keeps that >= level. Below 6 samples
    even the extremes fall short of 95%, and they are what is returned.
    """
    if n <= 0:
        raise ValueError("no samples")
    ks = np.arange(1, n)
    # Both conditions hold on a prefix of ks (the tail grows with k), so the largest k that meets them is the answer.
    usable = ks[(ks < n - 1 - ks) & (special().bdtr(ks, n, 0.5) <= (1.0 - level) / 2)]
    k = int(usable.max()) if usable.size else 0
    return k, n - 1 - k


BATCH_MEANS_FROM = 16  # steps before the batch-means interval joins (4 blocks of 4); below, the steps' own t-interval


@lru_cache(maxsize=256)  # one per degrees of freedom, asked for on every step of every trial
def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with dof degrees of freedom."""
    return float(special().stdtrit(dof, 0.975))


def wall_time_half_width(step_times_s: Sequence[float]) -> float:
    """The 95% half-width of the log wall-time figure; inf under 2 steps (wall_time_se, times its t quantile)."""
    se, dof = wall_time_se(step_times_s)
    return t95(dof) * se if dof else math.inf


def wall_time_se(step_times_s: Sequence[float]) -> tuple[float, int]:
    """(standard error of the log wall-time figure, its degrees of freedom): the relative error of the mean step
    time, (inf, 0) under 2 steps.

    The mean step time is the typical steps' and the stalled steps' (over STRATUM_SLOWER x the median step), weighted by
    how many of each the window held. Its error has three parts: the typical steps' own scatter, the stalled steps'
    own, and how far the window's count of stalls may be from the trainer's rate. Stalls that came at random are a
    binomial count (the steps' own t-interval, as if independent); stalls at a fixed period (every k-th step: a
    periodic sync, a loader that refills every k batches) are n / k a window, give or take the one stall the window's
    phase decides (none where k divides n), which the independent view would overstate many times over. The typical steps' part is the wider of their own t-interval
    and a batch-means one (sqrt(n) blocks of consecutive steps, from 16), right where they come in slow spells (the
    machine's load changing). O(n log n) in plain Python (numpy's per-call cost is 20x that on the few dozen steps a
    trial has): it runs after every step."""
    times = [float(t) for t in step_times_s if t > 0]
    n = len(times)
    if n < 2:
        return math.inf, 0
    mean = sum(times) / n
    line = STRATUM_SLOWER * median(times)
    stalled = [t > line for t in times]
    typical = [t for t in times if t <= line]
    slow = [t for t in times if t > line]
    share = len(typical) / n  # the typical steps' weight in the mean
    typical_var = _var(typical) / len(typical) if len(typical) > 1 else 0.0
    other_var = 0.0  # the stalled steps' own scatter and their count's, in the mean
    if slow:
        gap = sum(slow) / len(slow) - (sum(typical) / len(typical) if typical else 0.0)
        rate = len(slow) / n
        period = _period(stalled)
        if period:  # the window held n / period stalls, give or take the one its phase decides: a Bernoulli count
            odd = n / period - math.floor(n / period)
            count_var = odd * (1 - odd) * gap * gap / n**2
        else:
            count_var = rate * (1 - rate) * gap * gap / n
        other_var = (_var(slow) * len(slow) / n**2 if len(slow) > 1 else 0.0) + count_var
    se, dof = math.sqrt(share * share * typical_var + other_var) / mean, n - 1
    if len(typical) >= BATCH_MEANS_FROM:
        blocks = math.isqrt(len(typical))
        size = len(typical) // blocks
        first = len(typical) - blocks * size  # the latest blocks: a remainder at the start is the steps nearest the warm-up
        means = [sum(typical[first + i * size : first + (i + 1) * size]) / size for i in range(blocks)]
        spell_se = math.sqrt(share * share * _var(means) / blocks + other_var) / mean
        if t95(blocks - 1) * spell_se > t95(dof) * se:  # the wider interval, with its own degrees of freedom
            se, dof = spell_se, blocks - 1
    return se, dof


def _var(xs: Sequence[float]) -> float:
    """The sample variance (n - 1), of two values or more."""
    m = sum(xs) / len(xs)
    return sum([(x - m) * (x - m) for x in xs]) / (len(xs) - 1)


def _period(stalled: Sequence[bool]) -> float:
    """The stalls' period in steps where they are what a fixed period would give this window, else 0: two or more
    stalls, starting steps apart by one gap give or take a step, and no room before the first or after the last for
    one more at that gap."""
    starts = [i for i, s in enumerate(stalled) if s and (i == 0 or not stalled[i - 1])]  # each run's first step
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    if not gaps or max(gaps) - min(gaps) > 1 or starts[0] >= min(gaps) or starts[-1] + min(gaps) <= len(stalled) - 1:
        return 0.0
    return (starts[-1] - starts[0]) / len(gaps)


def throughput_summary(step_times_s: Sequence[float], samples_per_step: int) -> tuple[float, float, float]:
    """(samples over wall time, low, high) samples/s for the measured steps: the figure and its 95% interval.

    One step gives its own figure as all three (no interval: interval_se says None)."""
    times = [float(t) for t in step_times_s if t > 0]
    if not times:
        raise ValueError("no positive step times")
    figure = samples_per_step * len(times) / math.fsum(times)
    half = wall_time_half_width(times)
    if not math.isfinite(half):
        return figure, figure, figure
    return figure, figure * math.exp(-half), figure * math.exp(half)


# Steps over this many times the median step are counted apart in the figure's standard error (wall_time_se): lower
# than STALL_SLOWER, so that a periodic stall a little slower than the typical step is seen at every period (noise
# leaves one at 1.5x under a 1.5x line half the time, and the count then looks random); the table's mark keeps 1.5x.
STRATUM_SLOWER = 1.25

# When the table says a pair stalls: its steps are bimodal or periodic, and the wall-time figure shows it.
STALL_SLOWER = 1.5  # a step this many times the median step is a stalled step
STALL_GAP = 0.05  # the wall-time figure at least this far below the median step's speed
STALL_PREFIX = "stalls: "  # how a stall note starts (core/table.py heads the notes by it)
STALL_EPISODES = 2  # separate runs of stalled steps at least: one hiccup (one slow step or one slow spell) is not a pattern


def stall_note(step_times_s: Sequence[float]) -> str:
    """One line when the measured steps stall (STALL_* above), "" otherwise.

    Names how often and how long: "1 step in 3 ran 4.2x the typical step (the median step); the figure counts
    them: 31% below the median step's speed"."""
    times = [float(t) for t in step_times_s if t > 0]
    if len(times) < 2 * STALL_EPISODES:
        return ""
    typical = median(times)
    gap = 1.0 - typical * len(times) / math.fsum(times)  # how far the wall-time figure lies below the median step's
    stalled = [t > STALL_SLOWER * typical for t in times]
    episodes = sum(1 for i, s in enumerate(stalled) if s and (i == 0 or not stalled[i - 1]))
    if gap < STALL_GAP or episodes < STALL_EPISODES:
        return ""
    slow = [t for t, s in zip(times, stalled) if s]
    return (
        f"{STALL_PREFIX}1 step in {len(times) / len(slow):.0f} ran {median(slow) / typical:.1f}x the typical step (the median step); "
        f"the figure counts them: {gap:.0%} below the median step's speed"
    )
