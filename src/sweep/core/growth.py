"""May a pair that ran ok still run out of memory in real training? Its reserved peak still growing
at its end, or the CUDA allocator retrying in its timed steps (pure).

A caching allocator that is never emptied between steps (NeMo OOMptimizer's habit,
and ours) keeps what it reserved, so a trial's per-step reserved peaks form a
staircase: a new step with batches of another shape can need a block the cache
cannot carve out of what it holds, and the reserve rises. On an H100, two pairs ran
out of memory at steps 9 and 22, after the maximum-length first step had fitted. A
pair whose staircase still climbs near the end of its trial has not shown its real
training peak, so it is not recommended, like a tight pair, with the figure that
shows why.

The growth rule: the final third of the steps (at least the last 3) must itself rise: its highest
reserved peak above the highest before it by more than the tolerance (0.5% of the capacity, or of
the highest peak when the capacity is unknown; at least 1 MiB). Rises are not chained across the
final third's edge: measured from the last rise, an early rise plus a creep of 0.09 MiB in the final
third added up past a 1 MiB tolerance there, which could pass over the demo's answer; a creep too
small to count within the final third is the allocator's rounding. Fewer than 4 steps say nothing.

The retry rule: a step in which the allocator's retry count (`num_alloc_retries`: a cudaMalloc failed,
the cache was flushed and the allocation tried again) rose is a step that only just fitted, and
Composer shrinks its micro-batch on exactly that signal. A pair with a retry in a timed step is at
risk as a growing one is; retries in warm-up (a cold cache) are not counted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sweep.core.schema import OK, OOM, TrialResult

MIN_STEPS = 4  # fewer per-step peaks than this: no verdict
TOLERANCE_OF_CAPACITY = 0.005  # a rise smaller than this share of the capacity is the allocator's rounding
MIN_TOLERANCE_GIB = 1.0 / 1024
GROWTH_PREFIX = "reserved peak still growing"
RETRIES_PREFIX = "CUDA allocator retried in timed steps"
RISK_PREFIXES = (GROWTH_PREFIX, RETRIES_PREFIX)  # how an ok row's table note says why it is at risk
MAX_STEPS_NAMED = 5  # a retries note names at most this many steps


def final_third_start(steps: int) -> int:
    """The first step of the final third (at least the last 3 steps)."""
    return steps - max(3, steps // 3)


def late_rise(step_peaks_gib: Sequence[float], capacity_gib: float | None = None) -> tuple[int, float, int] | None:
    """(the step of the final third's highest peak, its height above the highest peak before the final
    third, the step of that one), or None: no rise beyond the tolerance there, or fewer than MIN_STEPS."""
    peaks = [float(p) for p in step_peaks_gib]
    if len(peaks) < MIN_STEPS:
        return None
    reference = capacity_gib if capacity_gib and capacity_gib > 0 else max(peaks)
    tolerance = max(TOLERANCE_OF_CAPACITY * reference, MIN_TOLERANCE_GIB)
    start = final_third_start(len(peaks))
    before, late = peaks[:start], peaks[start:]
    # The first step at each high: where the reserve got there, not where it stayed.
    high_step = start + late.index(max(late))
    base_step = before.index(max(before))
    height = peaks[high_step] - peaks[base_step]
    return (high_step, height, base_step) if height > tolerance else None


def still_growing(step_peaks_gib: Sequence[float], capacity_gib: float | None = None) -> str:
    """The figure that shows the reserve still climbing at the end, or "" (settled, or too few steps)."""
    peaks = [float(p) for p in step_peaks_gib]
    rise = late_rise(peaks, capacity_gib)
    if rise is None:
        return ""
    step, height, base = rise
    of_capacity = f" of {capacity_gib:.3g} GiB" if capacity_gib else ""
    return (
        f"{GROWTH_PREFIX}: {peaks[step]:.3g} GiB{of_capacity} at step {step} of {len(peaks)}, "
        f"up {height * 1024:.0f} MiB on the highest before the final third (step {base}: {peaks[base]:.3g} GiB): "
        "may OOM in real training"
    )


def growth_note(r: TrialResult) -> str:
    """still_growing for an ok trial's recorded per-step reserved peaks; "" for any other trial."""
    if r.status != OK or not r.step_peak_reserved_gib:
        return ""
    return still_growing(r.step_peak_reserved_gib, r.capacity_gib)


def timed_retries(step_retries: Sequence[int], warmup_steps: int) -> list[tuple[int, int]]:
    """(step, retries) for each timed step whose allocator retried.

    Step 0 never counts, even without a warm-up: the probe's first count runs from the process's start,
    so it holds start-up's retries and, in a warm worker, its earlier trials'."""
    first = max(int(warmup_steps), 1)
    return [(step, int(n)) for step, n in enumerate(step_retries) if step >= first and n > 0]


def retries_note(r: TrialResult) -> str:
    """For an ok trial whose allocator retried in a timed step: how often and where; "" for any other."""
    if r.status != OK or not r.step_alloc_retries:
        return ""
    late = timed_retries(r.step_alloc_retries, r.warmup_steps)
    if not late:
        return ""
    total = sum(n for _, n in late)
    named = ", ".join(str(step) for step, _ in late[:MAX_STEPS_NAMED]) + (", ..." if len(late) > MAX_STEPS_NAMED else "")
    return (
        f"{RETRIES_PREFIX}: {total} {'retry' if total == 1 else 'retries'} at step{'s' if len(late) > 1 else ''} "
        f"{named} of {len(r.step_alloc_retries)} (a cudaMalloc failed; the cache was flushed to fit): may OOM in real training"
    )


def risk_note(r: TrialResult) -> str:
    """Why an ok trial may OOM in real training beyond its headroom: growth first, else retries; "" if neither."""
    return growth_note(r) or retries_note(r)


def at_risk(r: TrialResult) -> bool:
    """Ran ok, but may OOM in real training: tight (headroom below the margin), still growing, or retrying."""
    return bool(r.tight) or bool(risk_note(r))


def probe_oom_step(probe_oom: str) -> int | None:
    """The step the probe saw an OOM in (0: the first, warm-up included), from the record's probe_oom line
    (workloads/command/probed.py writes "in MODULE during WHERE, step N, rank R: MESSAGE"); None: none seen."""
    found = re.search(r", step (\d+), rank -?\d+", probe_oom)
    return int(found.group(1)) if found else None


def late_oom_note(r: TrialResult) -> str:
    """For an OOM that came after timed steps had fit (a stress step, or growth): which step, and
    how many fitted before it; "" for any other trial. Where the probe saw the OOM, its step is the one named: a
    trainer that caught it and carried on timed steps after it, which fitted only at a smaller batch (issue 50)."""
    if r.status != OOM:
        return ""
    seen = probe_oom_step(r.probe_oom)
    if seen is not None:
        if seen <= r.warmup_steps:
            return ""  # in the warm-up: no timed step had fitted
        return f"out of memory at step {seen} (the probe's, from 0) after {seen} steps had fitted: a late OOM"
    if not r.step_times_s:
        return ""
    fitted = len(r.step_times_s)
    return f"out of memory at step {r.warmup_steps + fitted} after {r.warmup_steps + fitted} steps had fitted: a late OOM"
