"""Run-to-run noise: how far one pair's throughput moves between trial processes on one machine (pure).

A sweep measures each pair once, so it cannot see this noise; sweeps that measured the same pairs
again can. In log throughput, the repeats of one pair scatter by

    var(between repeats) = noise**2 + mean(within-trial se**2)

where a repeat's within-trial se comes from its 95% interval, (log high - log low) / (2 * 1.96).
noise**2 is that difference pooled over pairs, each weighted by its degrees of freedom
(repeats - 1), and floored at 0. A repeat without an interval counts as having no error of its
own, which errs toward more noise, the side on which the confidence score claims less.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sweep.core.stats import interval_se


@dataclass(frozen=True)
class Repeat:
    throughput: float  # the trial's median
    low: float | None = None  # its 95% interval, when it has one
    high: float | None = None


@dataclass(frozen=True)
class RunToRun:
    noise: float  # relative sd between trial processes, beyond each trial's own error
    spread: float  # relative sd between repeats as measured, own errors included
    pairs: int  # pairs measured at least twice
    repeats: int  # trials of those pairs
    dof: int  # sum over those pairs of (repeats - 1): how much the estimate rests on


def within_se(repeat: Repeat) -> float:
    """The log-throughput standard error a trial's own interval states (0 without one)."""
    return interval_se(repeat.low, repeat.high) or 0.0


def estimate_run_to_run(repeats_by_pair: Mapping[Hashable, Sequence[Repeat]]) -> RunToRun | None:
    """The pooled estimate over every pair with two or more repeats; None when no pair has two."""
    between = own = 0.0
    pairs = repeats = dof = 0
    for group in repeats_by_pair.values():
        logs = [math.log(r.throughput) for r in group if r.throughput > 0]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        n_minus_1 = len(logs) - 1
        between += sum((x - mean) ** 2 for x in logs)  # = n_minus_1 * sample variance
        own += n_minus_1 * sum(within_se(r) ** 2 for r in group if r.throughput > 0) / len(logs)
        pairs, repeats, dof = pairs + 1, repeats + len(logs), dof + n_minus_1
    if not dof:
        return None
    spread_sq = between / dof
    return RunToRun(math.sqrt(max(0.0, spread_sq - own / dof)), math.sqrt(spread_sq), pairs, repeats, dof)


# The most run-to-run noise a host has shown here (docs/search.md: 0.243 between processes on the busy 2-core box).
BUSY_HOST_NOISE = 0.25
# Runnable tasks per CPU (orchestration/host_load.py: /proc/loadavg's running count, over the CPUs the sweep may use),
# as a median over the sweep's polls while trials ran, above which a CPU host was oversubscribed: its trials took
# turns with other work, and their figures moved by up to BUSY_HOST_NOISE between processes. On this 2-core box the
# default sweep's polls had a median of 0.5 a CPU when quiet (its trial), 1.5 beside two busy loops.
BUSY_LOAD_PER_CPU = 1.25


def busy_load(loads: Sequence[float], cpus: int) -> float | None:
    """The median load per CPU while trials ran, where it says the host was oversubscribed (above
    BUSY_LOAD_PER_CPU); None where it was not, or where nothing was sampled."""
    if not loads or cpus < 1:
        return None
    per_cpu = float(np.median(loads)) / cpus
    return per_cpu if per_cpu > BUSY_LOAD_PER_CPU else None
