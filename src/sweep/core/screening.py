"""Parallel screening on multi-device hosts (pure): which pairs a full N-device trial must confirm.

With machine.num_devices=N, a one-rank trial at the same per-device batch (global batch / N, one
device) needs the same per-rank memory, bar DDP's gradient buckets, and runs at nearly the same
per-rank speed. So the search screens candidates as one-rank trials, N at a time, one per device;
then the pairs inside the noise of the screening leader are run as full N-device trials, and the
table and recommendation rest on those. The screening rows are kept, labelled, in their own subdir.

A screening row is measured to the decision (core/decision.py) like a full trial, with the workload's
stress step: a screened pair may be confirmed, and a confirmation is a fresh N-rank job, so a late
OOM is cheaper met at one rank, on a warm worker, than in it; and the pair's ok status prunes the
screening search through the ordering, so it rests on the stress step passed. (Stopping screening
rows ahead before the stress step, as before, nominated H100 pairs that ran out of memory at it:
large80's accum=1 split=8, base24's accum=2 split=8, and kept the staircase from the split-doubled
pair that was the answer.) The search's first screened pair stops provisionally
(core/decision.py's rule 0) and is never run again: a screening row is never the answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweep.core.growth import at_risk
from sweep.core.ranking import ranked_ok
from sweep.core.schema import OK, TrialResult

SCREENING_DIR = "screening"  # under the sweep dir: the one-rank trials, a sweep dir of their own


def screens(mode: str, num_devices: int) -> bool:
    """Whether a sweep of num_devices-rank trials screens first: auto and on, when there are ranks to split.
    mode: one of SCREEN_MODES, as the edge validated it (orchestration/settings.py)."""
    return mode != "off" and num_devices > 1


def screening_batch(global_batch_size: int, num_devices: int) -> int:
    """The one-rank trials' global batch: one rank's share, so every pair keeps its per-device batch."""
    return global_batch_size // num_devices


def confirm_candidates(screening: Mapping[str, TrialResult], confirmed: Mapping[str, TrialResult] | None = None) -> list[TrialResult]:
    """The screened pairs still to confirm with a full trial, fastest first.

    The leader (the fastest roomy screened pair) and every roomy screened pair whose interval
    reaches the leader's lower bound (inside its noise). A pair tight at one rank is left out while
    a roomy one is there: a full trial's ranks need at least that memory (DDP adds its buckets), so
    it would be tight again. When every pair confirmed so far failed, ran out of memory or was
    tight, the next screened pairs in order: the table's answer must rest on a full trial. Every
    pair inside the leader's noise is confirmed, a pair screened within the run-to-run noise of a
    confirmed one included: the table and the recommendation rest on full trials, and two pairs
    that screening cannot order are each measured at full scale.
    """
    done = dict(confirmed or {})
    ranked = [r for r in ranked_ok(screening) if r.throughput_high]
    roomy = [r for r in ranked if not at_risk(r)]
    if not roomy:
        return [r for r in ranked if r.key not in done][:1]
    lead = roomy[0]
    floor = float(lead.throughput_low or lead.throughput or 0.0)
    noise = [r for r in roomy if r is lead or float(r.throughput_high or 0.0) >= floor]
    left = [r for r in noise if r.key not in done]
    if left or any(r.status == OK and not at_risk(r) for r in done.values()):
        return left
    return [r for r in roomy if r.key not in done][:1]
