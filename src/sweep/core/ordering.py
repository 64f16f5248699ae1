"""The throughput ordering's rule itself, and what the table says where measurements contradict it (pure).

core/implications.py applies the ordering to the search and the score (as a prior: issue 50); core/ranking.py
names, in a pair's row, where it failed. Both read it from here, which imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweep.core.growth import timed_retries
from sweep.core.measure import MIN_INTERVAL_STEPS, cannot_win
from sweep.core.schema import OK, TrialResult
from sweep.core.space import Candidate


def no_faster_than(c: Candidate | TrialResult, other: Candidate | TrialResult) -> bool:
    """Throughput heuristic: c has no bigger micro-batches or joint chunks, and no split saving."""
    return (
        c.per_device_batch <= other.per_device_batch
        and c.joint_batch <= other.joint_batch
        and (c.split > 1 or other.split == 1)
    )


def measured_in_full(r: TrialResult) -> bool:
    """An ok figure with a real 95% interval: MIN_INTERVAL_STEPS timed steps (or log figures) or more."""
    steps = max(len(r.step_times_s), r.steps_measured or 0)
    return r.status == OK and bool(r.throughput_low and r.throughput_high) and steps >= MIN_INTERVAL_STEPS


def beats(x: TrialResult, y: TrialResult) -> bool:
    """x is faster than y beyond both 95% intervals (racing's rule, core/measure.cannot_win: y cannot win against x)."""
    return cannot_win(
        (float(y.throughput_low or 0.0), float(y.throughput_high or 0.0)),
        (float(x.throughput_low or 0.0), float(x.throughput_high or 0.0)),
        candidate_steps=max(len(y.step_times_s), y.steps_measured or 0),
        leader_steps=max(len(x.step_times_s), x.steps_measured or 0),
    )


# What the table says of a pair the ordering got wrong, and, where its allocator retried in timed steps (CUDA:
# core/growth.py), the known cause.
ORDERING_NOTE = "the throughput ordering does not hold here"
RETRY_SLOWDOWN = "allocator retries near the memory limit can make the largest micro-batch that fits slower than the next one down"


def ordering_note(r: TrialResult, results: Mapping[str, TrialResult]) -> str:
    """For an ok pair measured slower, beyond both intervals, than a pair the ordering ranks no faster than it: which
    one, that the ordering does not hold there (core/confidence.py no longer applies it), and, where the pair's CUDA
    allocator retried in its timed steps, that retries near the limit are the known cause; "" for any other pair."""
    if not measured_in_full(r):
        return ""
    faster = [x for x in results.values() if x.key != r.key and measured_in_full(x) and no_faster_than(x, r) and beats(x, r)]
    if not faster:
        return ""
    best = max(faster, key=lambda x: float(x.throughput or 0.0))
    note = f"slower than {best.key}, which has no bigger micro-batch or joint chunk: {ORDERING_NOTE}"
    if timed_retries(r.step_alloc_retries, r.warmup_steps):
        note += f" ({RETRY_SLOWDOWN})"
    return note
