"""Throughput statistics from per-step times (pure).

A trial reports the median samples/s over its measured (post warm-up) steps
and a distribution-free 95% interval for that median: the order-statistic
interval, which needs no normality assumption and stays honest for the
handful of steps a short trial can afford. The binomial tail it rests on is
scipy.special's bdtr: scipy.stats' binom is the same function behind a 0.5 s
import that every trial process would pay before it starts. scipy.special itself
(0.25 s of CPU) is imported on first use, through special(): a command line that is
refused, or plans without scoring, never needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import median
from typing import Any

import numpy as np

# median is re-exported: the one median (it raises StatisticsError, a ValueError, on no data).
__all__ = ["Z95", "interval_se", "median", "median_interval_coverage", "median_interval_ranks", "throughput_summary"]

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


def throughput_summary(step_times_s: Sequence[float], samples_per_step: int) -> tuple[float, float, float]:
    """(median, low, high) samples/s for the measured steps."""
    times = sorted(t for t in step_times_s if t > 0)
    if not times:
        raise ValueError("no positive step times")
    lo_rank, hi_rank = median_interval_ranks(len(times))
    # samples/s is decreasing in step time: the slowest bound gives the low throughput.
    return (
        samples_per_step / median(times),
        samples_per_step / times[hi_rank],
        samples_per_step / times[lo_rank],
    )
