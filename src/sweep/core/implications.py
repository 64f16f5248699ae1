"""What finished trials imply about pairs never run (pure): memory, ranking and throughput order.

Every strategy and the confidence score read the results through these rules.

Memory monotonicity (what an OOM tells us about pairs never run). A step holds
the encoder/prediction activations (grow with per_device_batch, p) from the
encoder phase to the end of the backward pass; batch splitting adds a VRAM
overhead (none at split=1, assumed non-decreasing in split, s); the joint/loss
phase adds tensors that grow with joint_batch (j = p/s). Hence:

* encoder OOM at (p, s)      -> OOM at every pair with p' >= p and s' >= s
  (a smaller split may carry less overhead, so it is *not* implied);
* joint/optimizer OOM at (p, s, j) -> OOM at every pair with s' >= s and j' >= j
  (p' = s'j' >= p follows); a pair with the same j but a smaller p is *not*
  implied, because its held encoder activations are smaller;
* ok at (p, s, j)            -> fit at every pair with s' <= s and j' <= j.

Failed, timed-out and cancelled trials are "not feasible" but imply nothing.

Predicted OOM (core/memory_model.py). With a capacity and trust_memory_model on, a
pair whose peak the fitted memory model puts above the capacity with probability
>= 0.95 is treated like an implied OOM: not launched, and shown as `predicted_oom`.
Pairs a measured ok trial implies fit are never predicted out.

Throughput ordering (a heuristic, used to skip pairs that cannot win). A step
runs accum micro-batches of p samples through the encoder and per_device_total/j
joint chunks of j samples (whatever the split), plus a fixed cost per micro-batch
once split > 1. So a pair with no larger p and no larger j is no faster, unless
it drops the split to 1 where the other splits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sweep.core.measure import cannot_win
from sweep.core.memory_model import PeakPrediction, fit_from_results, predicted_oom
from sweep.core.ranking import ranked_ok
from sweep.core.schema import OK, OOM, PHASE_ENCODER, TrialResult
from sweep.core.space import Candidate


def rank_order(results: Mapping[str, TrialResult]) -> list[str]:
    """Keys of the ok results, fastest median throughput first, in the sweep table's order."""
    return [r.key for r in ranked_ok(results)]


def leader_key(results: Mapping[str, TrialResult]) -> str | None:
    order = rank_order(results)
    return order[0] if order else None


def may_outrun(r: TrialResult, other: TrialResult) -> bool:
    """False only when racing's rule says r cannot beat other (core/measure.cannot_win: r's 95%
    interval wholly below other's, both from enough timed steps); a result without an interval is
    never ruled slower."""
    if None in (r.throughput_low, r.throughput_high, other.throughput_low, other.throughput_high):
        return True
    return not cannot_win(
        (float(r.throughput_low or 0.0), float(r.throughput_high or 0.0)),
        (float(other.throughput_low or 0.0), float(other.throughput_high or 0.0)),
        candidate_steps=len(r.step_times_s),
        leader_steps=len(other.step_times_s),
    )


def oom_implied(c: Candidate, results: Iterable[TrialResult]) -> bool:
    """True when an OOM among `results` implies that `c` runs out of memory too."""
    for r in results:
        if r.status != OOM:
            continue
        if r.oom_phase == PHASE_ENCODER:
            if c.per_device_batch >= r.per_device_batch and c.split >= r.split:
                return True
        elif c.split >= r.split and c.joint_batch >= r.joint_batch:
            return True
    return False


def fit_implied(c: Candidate, results: Iterable[TrialResult]) -> bool:
    """True when a pair that ran ok needed at least as much memory as `c` in every phase."""
    return any(r.status == OK and c.split <= r.split and c.joint_batch <= r.joint_batch for r in results)


def no_faster_than(c: Candidate | TrialResult, other: Candidate | TrialResult) -> bool:
    """Throughput heuristic: c has no bigger micro-batches or joint chunks, and no split saving."""
    return (
        c.per_device_batch <= other.per_device_batch
        and c.joint_batch <= other.joint_batch
        and (c.split > 1 or other.split == 1)
    )


def predicted_ooms(
    candidates: Sequence[Candidate], finished: Mapping[str, TrialResult], capacity_gib: float | None
) -> dict[str, PeakPrediction]:
    """Untried valid pairs the memory model says run out of memory (not those a measured OOM already implies)."""
    if capacity_gib is None or capacity_gib <= 0:
        return {}
    results = list(finished.values())
    fit = fit_from_results(results, capacity_gib)
    if fit is None:
        return {}
    out = {}
    for c in candidates:
        if not c.valid or c.key in finished or oom_implied(c, results) or fit_implied(c, results):
            continue
        pred = predicted_oom(fit, c, capacity_gib)
        if pred is not None:
            out[c.key] = pred
    return out
