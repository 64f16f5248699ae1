"""Throughput statistics from per-step times (pure).

A trial reports the median samples/s over its measured (post warm-up) steps
and a distribution-free 95% interval for that median: the order-statistic
interval, which needs no normality assumption and stays honest for the
handful of steps a short trial can afford.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median

# median is re-exported: the one median (it raises StatisticsError, a ValueError, on no data).
__all__ = ["Z95", "interval_se", "median", "median_interval_ranks", "throughput_summary"]

Z95 = 1.96  # a 95% interval's half-width in standard errors, as every figure here has rounded it


def interval_se(low: float | None, high: float | None) -> float | None:
    """The log-throughput standard error a 95% interval [low, high] states; None without a usable one."""
    if low is None or high is None or not 0 < low < high:
        return None
    return (math.log(high) - math.log(low)) / (2 * Z95)


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n


def median_interval_ranks(n: int, level: float = 0.95) -> tuple[int, int]:
    """0-based order-statistic ranks (lo, hi) bracketing the median at `level`.

    [x_(k), x_(n-1-k)] covers the true median with probability 1 - 2 P(X <= k) for
    X ~ Binomial(n, 1/2); take the largest k that keeps that >= level. Below 6 samples
    even the extremes fall short of 95%, and they are what is returned.
    """
    if n <= 0:
        raise ValueError("no samples")
    alpha = 1.0 - level
    k = 0
    while k + 1 < n - k - 2 and _binom_cdf(k + 1, n) <= alpha / 2:
        k += 1
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
