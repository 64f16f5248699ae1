"""Parallel screening on multi-device hosts (pure): which pairs a full N-device trial must confirm.

With machine.num_devices=N, a one-rank trial at the same per-device batch (global batch / N, one
device) needs the same per-rank memory, bar DDP's gradient buckets, and runs at nearly the same
per-rank speed. So the search screens candidates as one-rank trials, N at a time, one per device;
then the pairs inside the noise of the screening leader are run as full N-device trials, and the
table and recommendation rest on those. The screening rows are kept, labelled, in their own subdir.
"""

from __future__ import annotations

from collections.abc import Mapping

from sweep.core.decision import FIT_KNOWN_STEPS
from sweep.core.growth import at_risk
from sweep.core.measure import MIN_INTERVAL_STEPS
from sweep.core.ranking import ranked_ok
from sweep.core.schema import OK, TrialResult

SCREEN_MODES = ("auto", "on", "off")
SCREENING_DIR = "screening"  # under the sweep dir: the one-rank trials, a sweep dir of their own

# How the decision (core/decision.py) measures a screening trial. A screening row is never the
# recommendation: it nominates pairs for the full trials, and each full trial meets the workload's
# stress step itself, at full scale (where DDP's buckets add memory the one-rank trial never saw).
# So a screened pair may stop for being ahead or tied once its interval decides it, without waiting
# for the stress step, and the first screened pair, there only for later pairs to be compared with,
# stops at the fewest steps that give a real 95% interval instead of trial.measure_steps.
SCREEN_AHEAD_STEPS = FIT_KNOWN_STEPS
SCREEN_FIRST_PAIR_STEPS = MIN_INTERVAL_STEPS


def screens(mode: str, num_devices: int) -> bool:
    """Whether a sweep of num_devices-rank trials screens first: auto and on, when there are ranks to split."""
    if mode not in SCREEN_MODES:
        raise ValueError(f"search.screen={mode!r} is not valid: expected one of {', '.join(SCREEN_MODES)}")
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
    tight, the next screened pairs in order: the table's answer must rest on a full trial.
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
