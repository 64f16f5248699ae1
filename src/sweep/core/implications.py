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

The ordering is a prior, never a measurement (issue 50). Near the memory limit it fails: PyTorch's
caching allocator retries (flushes its cache and allocates again) in the steps that only just fit,
so the largest micro-batch that fits can run slower than the next one down (Composer lowers its
micro-batch on exactly that signal). Hence:

* where two measured pairs contradict it (ordering_breaks: a pair it ranks below another beat that
  one beyond both 95% intervals), it is not applied against that slower pair, nor against any pair
  at least as big in both p and j (nearer the limit still): ordered_below;
* the pairs next to the leader that it alone ranks below (ordering_neighbours: within one step of
  the leader's p and j among the sweep's values) are measured before the search ends, and until
  they are, the confidence score stays below 80 (core/confidence.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sweep.core.measure import cannot_win
from sweep.core.memory_model import PeakPrediction, fit_from_results, predicted_oom
from sweep.core.ordering import beats, measured_in_full
from sweep.core.ordering import no_faster_than as no_faster_than  # the rule lives in core/ordering.py (ranking reads it there)
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


Pair = Candidate | TrialResult


def ordering_breaks(results: Mapping[str, TrialResult] | Iterable[TrialResult]) -> list[TrialResult]:
    """The measured pairs the throughput ordering is wrong about on this workload: each pair measured in full that
    a pair the ordering ranks no faster than it (no bigger p or j) beat beyond both 95% intervals."""
    done = [r for r in (results.values() if isinstance(results, Mapping) else results) if measured_in_full(r)]
    return [y for y in done if any(x.key != y.key and no_faster_than(x, y) and beats(x, y) for x in done)]


def ordering_broken_at(other: Pair, breaks: Sequence[TrialResult]) -> bool:
    """Whether the ordering may not rank pairs below `other`: a measurement contradicted it at `other`, or at a
    pair no bigger in p and j (the contradiction is memory pressure's, and `other` is as near the limit or nearer)."""
    return any(other.per_device_batch >= y.per_device_batch and other.joint_batch >= y.joint_batch for y in breaks)


def ordered_below(c: Pair, other: Pair, breaks: Sequence[TrialResult] = ()) -> bool:
    """no_faster_than, where the measurements have not contradicted it (ordering_broken_at): the prior's rule."""
    return no_faster_than(c, other) and not ordering_broken_at(other, breaks)


def _steps_apart(a: int, b: int, values: Sequence[int] | None) -> int:
    """How many of the sweep's values lie from a to b (1: adjacent); without them, doublings, rounded up."""
    if a == b:
        return 0
    if values and a in values and b in values:
        lo, hi = sorted((a, b))
        return sum(1 for v in values if lo < v <= hi)
    lo, hi = sorted((a, b))
    steps = 0
    while lo < hi:
        lo, steps = lo * 2, steps + 1
    return steps


def _values(space: Sequence[Candidate] | None) -> tuple[list[int] | None, list[int] | None]:
    if not space:
        return None, None
    return sorted({x.per_device_batch for x in space if x.valid}), sorted({x.joint_batch for x in space if x.valid})


def near(c: Pair, lead: Pair, space: Sequence[Candidate] | None = None) -> bool:
    """Whether c lies within one step of lead in per-device batch and in joint batch (and is not lead): the next
    value up or down among the sweep's valid pairs' values (space), or one doubling where the space is not given."""
    return _near(c, lead, *_values(space))


def _near(c: Pair, lead: Pair, ps: Sequence[int] | None, js: Sequence[int] | None) -> bool:
    if (c.accum, c.split) == (lead.accum, lead.split):
        return False
    return _steps_apart(c.per_device_batch, lead.per_device_batch, ps) <= 1 and _steps_apart(c.joint_batch, lead.joint_batch, js) <= 1


def ordering_neighbours(lead: Pair, space: Sequence[Candidate]) -> list[Candidate]:
    """The leader's next smaller micro-batch and next smaller joint batch among the valid pairs (near), where only the
    throughput ordering ranks them below it: at most two, one step down along each of the ordering's own axes. The
    micro-batch one step down at the leader's joint batch (where there is none, as in a 1-D sweep whose joint batch is
    the micro-batch, with the joint batch one step down too), and the joint batch one step down at the leader's
    micro-batch (the next split up). On the staircase's path the first is its previous stair, already measured.
    The ordering is a prior: these are measured before the search ends (strategies) and the score stays below 80
    while one of them is open (core/confidence.py)."""
    ps, js = _values(space)
    below = [c for c in space if c.valid and no_faster_than(c, lead) and _near(c, lead, ps, js)]
    smaller_batch = [c for c in below if c.per_device_batch < lead.per_device_batch]
    out = [c for c in below if c.per_device_batch == lead.per_device_batch]
    if smaller_batch:
        out.append(max(smaller_batch, key=lambda c: c.joint_batch))
    return out


# How core/decision.py's rule 1 (the ordering) words its stop; a neighbour it stopped after NEIGHBOUR_STEPS timed
# steps, every one below the outranking pair's 95% lower bound, has confirmed the ordering on its own steps.
ORDERED_STOP = "outranked by"
NEIGHBOUR_STEPS = 2


def confirmed_below(r: TrialResult) -> bool:
    """A pair the ordering stopped (decision rule 1) only once its own steps agreed: NEIGHBOUR_STEPS timed steps or
    more, each below the outranking pair's 95% lower bound (a neighbour of that pair is never stopped sooner)."""
    steps = max(len(r.step_times_s), r.steps_measured or 0)
    return r.status == OK and r.stopped_early.startswith(ORDERED_STOP) and steps >= NEIGHBOUR_STEPS


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
