"""The tuning playbook's scaling check (pure): does throughput keep pace as the per-device batch grows?"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sweep.core.schema import OK, TrialResult

# Doubling the per-device batch should nearly double throughput until the device
# saturates (tuning playbook); below 1.5x per doubling we flag it. For a batch
# ratio r the bar is r ** log2(1.5), so one 4x jump is held to 2.25x.
SCALING_FLAG_RATIO = 1.5


def scaling_report(results: Mapping[str, TrialResult] | Iterable[TrialResult]) -> list[dict[str, Any]]:
    """For each step up in per-device batch among ok results: does throughput keep pace?

    Uses the fastest ok pair at each per-device batch. `flag` is True when the
    throughput ratio is below SCALING_FLAG_RATIO per doubling: either the device
    is saturated (expected at the large end) or, if it happens at small batches,
    an input-pipeline or synchronisation bottleneck worth fixing first.
    """
    items = results.values() if isinstance(results, Mapping) else results
    best: dict[int, TrialResult] = {}
    for r in items:
        if r.status == OK and r.throughput:
            cur = best.get(r.per_device_batch)
            if cur is None or r.throughput > (cur.throughput or 0):
                best[r.per_device_batch] = r
    batches = sorted(best)
    report: list[dict[str, Any]] = []
    for small, big in zip(batches, batches[1:]):
        a, b = best[small], best[big]
        batch_ratio = big / small
        ratio = (b.throughput or 0) / (a.throughput or 1)
        bar = batch_ratio ** math.log2(SCALING_FLAG_RATIO)
        if ratio < 1:
            note = "throughput fell: prefer the smaller per-device batch"
        elif ratio < bar:
            note = (
                f"x{ratio:.2f} for a x{batch_ratio:g} batch (below x{bar:.2f}): saturated here, "
                "or an input/synchronisation bottleneck if this is a small batch"
            )
        else:
            note = ""
        report.append(
            {
                "from_key": a.key,
                "to_key": b.key,
                "per_device_batch_from": small,
                "per_device_batch_to": big,
                "batch_ratio": batch_ratio,
                "throughput_from": a.throughput,
                "throughput_to": b.throughput,
                "throughput_ratio": ratio,
                "flag": ratio < bar,
                "note": note,
            }
        )
    return report
