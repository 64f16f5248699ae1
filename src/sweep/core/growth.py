"""Is a trial's reserved memory still growing when it ends? (pure)

A caching allocator that is never emptied between steps (NeMo OOMptimizer's habit,
and ours) keeps what it reserved, so a trial's per-step reserved peaks form a
staircase: a new step with batches of another shape can need a block the cache
cannot carve out of what it holds, and the reserve rises. On an H100, two pairs ran
out of memory at steps 9 and 22, after the maximum-length first step had fitted. A
pair whose staircase still climbs near the end of its trial has not shown its real
training peak, so it is not recommended, like a tight pair, with the figure that
shows why.

The rule: a step "rises" when its reserved peak is above the last rise's (at first,
step 0's) by more than the tolerance (0.5% of the capacity, or of the highest peak
when the capacity is unknown; at least 1 MiB), so a slow creep counts too. The pair is still growing when its last rise came in
the final third of its steps (at least the last 3). Step 0 (the first, and the worst
batch) always sets the first high; fewer than 4 steps say nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sweep.core.schema import OK, OOM, TrialResult

MIN_STEPS = 4  # fewer per-step peaks than this: no verdict
TOLERANCE_OF_CAPACITY = 0.005  # a rise smaller than this share of the capacity is the allocator's rounding
MIN_TOLERANCE_GIB = 1.0 / 1024
GROWTH_PREFIX = "reserved peak still growing"


def last_rise(step_peaks_gib: Sequence[float], capacity_gib: float | None = None) -> tuple[int, float] | None:
    """(the step of the last rise, its height above the rise before it), or None when no step after
    the first rose beyond the tolerance."""
    peaks = [float(p) for p in step_peaks_gib]
    if not peaks:
        return None
    reference = capacity_gib if capacity_gib and capacity_gib > 0 else max(peaks)
    tolerance = max(TOLERANCE_OF_CAPACITY * reference, MIN_TOLERANCE_GIB)
    # Measured from the last counted rise, so a slow creep counts once it adds up to the tolerance.
    anchor, rise = peaks[0], None
    for step, peak in enumerate(peaks[1:], start=1):
        if peak > anchor + tolerance:
            rise, anchor = (step, peak - anchor), peak
    return rise


def still_growing(step_peaks_gib: Sequence[float], capacity_gib: float | None = None) -> str:
    """The figure that shows the reserve still climbing at the end, or "" (settled, or too few steps)."""
    peaks = [float(p) for p in step_peaks_gib]
    if len(peaks) < MIN_STEPS:
        return ""
    rise = last_rise(peaks, capacity_gib)
    if rise is None:
        return ""
    step, height = rise
    final_third = len(peaks) - max(3, len(peaks) // 3)
    if step < final_third:
        return ""
    of_capacity = f" of {capacity_gib:.3g} GiB" if capacity_gib else ""
    return (
        f"{GROWTH_PREFIX}: {peaks[step]:.3g} GiB{of_capacity} at step {step} of {len(peaks)}, "
        f"up {height * 1024:.0f} MiB on the rise before (step 0: {peaks[0]:.3g} GiB): may OOM in real training"
    )


def growth_note(r: TrialResult) -> str:
    """still_growing for an ok trial's recorded per-step reserved peaks; "" for any other trial."""
    if r.status != OK or not r.step_peak_reserved_gib:
        return ""
    return still_growing(r.step_peak_reserved_gib, r.capacity_gib)


def at_risk(r: TrialResult) -> bool:
    """Ran ok, but may OOM in real training: tight (headroom below the margin) or still growing."""
    return bool(r.tight) or bool(growth_note(r))


def late_oom_note(r: TrialResult) -> str:
    """For an OOM that came after timed steps had fit (a stress step, or growth): which step, and
    how many fitted before it; "" for any other trial."""
    if r.status != OOM or not r.step_times_s:
        return ""
    fitted = len(r.step_times_s)
    return f"out of memory at step {r.warmup_steps + fitted} after {r.warmup_steps + fitted} steps had fitted: a late OOM"
