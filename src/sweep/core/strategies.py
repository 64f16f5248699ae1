"""Search strategies: which (accum, split) pairs to try next (pure).

The orchestrator asks `strategy.propose(finished, in_flight)` after every landed
result and launches the first few proposed candidates as slots free. Everything
a strategy knows is recomputed from the results, so a resumed sweep picks up
where it left off and results may land in any order.

What a result implies about pairs never run (memory monotonicity, the throughput
ordering, the memory model's predicted OOMs) lives in core/implications.py. The
throughput ordering is a prior there: it may skip a pair, except the leader's
neighbours it alone ranks below the leader, which the staircase runs before it ends,
and it is not applied against pairs whose measurements contradict it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sweep.core.growth import at_risk
from sweep.core.implications import (
    may_outrun,
    near,
    no_faster_than,
    oom_implied,
    ordered_below,
    ordering_breaks,
    ordering_neighbours,
    predicted_ooms,
)
from sweep.core.memory_model import PeakPrediction
from sweep.core.ranking import ranked_ok
from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.space import Candidate


@dataclass
class Proposal:
    candidates: list[Candidate]  # in preference order
    done: bool  # nothing more to propose, ever


class Strategy(Protocol):
    name: str

    def propose(self, finished: Mapping[str, TrialResult], in_flight: Collection[str]) -> Proposal: ...

    def predicted_ooms(self, finished: Mapping[str, TrialResult]) -> dict[str, PeakPrediction]: ...


class _Base:
    """What every strategy shares: its candidates, the trial budget and the memory model's verdicts."""

    name = ""
    # What the orchestration asks of a strategy, rather than its name:
    starts_slowest = False  # its first fitting pair is the slow end of its search, so that pair may stop provisionally (core/decision rule 0)
    uses_ordering = True  # it rules pairs out by the throughput ordering, so a screening trial outranked before its first step is cancelled
    one_dimensional = False  # it walks the per-device batch alone: its summary is a scaling line, not a 2-D table

    def __init__(
        self,
        candidates: Sequence[Candidate],
        max_trials: int | None = None,
        capacity_gib: float | None = None,
        trust_memory_model: bool = True,
    ) -> None:
        self.candidates = _valid(candidates)
        self.max_trials = max_trials
        self.capacity_gib = capacity_gib  # per device; None: no predictions
        self.trust_memory_model = trust_memory_model
        self._predicted: set[str] = set()  # this propose() call's predicted OOMs
        self._breaks: list[TrialResult] = []  # this propose() call's ordering_breaks: where the measurements contradict it

    def predicted_ooms(self, finished: Mapping[str, TrialResult]) -> dict[str, PeakPrediction]:
        """Pairs this strategy will not launch on the memory model's word, with their predictions."""
        if not self.trust_memory_model:
            return {}
        return predicted_ooms(self.candidates, finished, self.capacity_gib)

    def propose(self, finished: Mapping[str, TrialResult], in_flight: Collection[str]) -> Proposal:
        self._predicted = set(self.predicted_ooms(finished))
        return _bounded(self._plan(finished), finished, in_flight, self.max_trials)

    def _plan(self, finished: Mapping[str, TrialResult]) -> list[Candidate]:
        raise NotImplementedError

    def _ruled_out(self, c: Candidate, results: Iterable[TrialResult]) -> bool:
        """Known not to fit: a measured OOM implies it, or the memory model predicts it."""
        return c.key in self._predicted or oom_implied(c, results)


def _valid(candidates: Sequence[Candidate]) -> list[Candidate]:
    return sorted(c for c in candidates if c.valid)


def _bounded(
    plan: Iterable[Candidate],
    finished: Mapping[str, TrialResult],
    in_flight: Collection[str],
    max_trials: int | None,
) -> Proposal:
    """Drop what already ran or runs, cap at the trial budget, and decide whether we are done."""
    left = None if max_trials is None else max_trials - len(finished) - len(in_flight)
    if left is not None and left <= 0:
        return Proposal([], done=True)
    out: list[Candidate] = []
    seen: set[str] = set()
    for c in plan:
        if c.key in finished or c.key in in_flight or c.key in seen:
            continue
        seen.add(c.key)
        out.append(c)
    if left is not None:
        out = out[:left]
    # Nothing to run now but something in flight: its result may open new work.
    return Proposal(out, done=not out and not in_flight)


# --- grid -----------------------------------------------------------------------------------


class Grid(_Base):
    """Every valid pair, accum ascending then split: the reference every other strategy is judged by.

    Only pairs the memory model predicts to OOM are left out (measured OOMs prune nothing here).
    """

    name = "grid"
    uses_ordering = False  # every valid pair is run: the first pair is the biggest micro-batch, as likely the answer as not

    def _plan(self, finished: Mapping[str, TrialResult]) -> list[Candidate]:
        return [c for c in self.candidates if c.key not in self._predicted]


# --- staircase ------------------------------------------------------------------------------


def _bisection_order(items: list[Candidate]) -> list[Candidate]:
    """Midpoint first, then the midpoints of each half, breadth first.

    With one slot this is plain bisection; with k slots the first k entries
    split the interval k+1 ways, so parallel trials are never redundant.
    """
    out: list[Candidate] = []
    ranges = [(0, len(items) - 1)]
    while ranges:
        nxt = []
        for lo, hi in ranges:
            if lo > hi:
                continue
            mid = (lo + hi) // 2
            out.append(items[mid])
            nxt += [(lo, mid - 1), (mid + 1, hi)]
        ranges = nxt
    return out


class Staircase(_Base):
    """The seed procedure, automated.

    Step 2: bisect over accum at the smallest split for the smallest accum that
    runs ok. Step 3: halve accum and double split (constant product) until the
    encoder OOMs or no valid pair remains. A stair that OOMs in the joint/loss
    phase is retried at the same accum with the split doubled: the encoder
    activations held through the joint phase grow with the per-device batch,
    so the seed's constant joint batch need not fit any more. Then hill-climb:
    try the leader's neighbours (each walked up in split past OOMs) that no
    measured pair outranks, until none is left or the budget is spent. A tight
    pair (ok, but below trial.memory_margin) that may be the fastest (the leader,
    or one racing would not stop against the best roomy pair) adds its split-doubled
    neighbour, and only roomy pairs outrank: a tight pair is not what the sweep
    recommends.

    The seed's special case (OOM in step 3: double step 2's accum b and redo
    step 3) needs no code of its own here: its first pair (b, 2) is step 2's
    batch with an extra split, which (b, 1) outranks, and its later pairs
    (b/2, 4), (b/4, 8), ... are what the split walk at accum b/2 already tried
    or ruled out. Whichever ran faster is the leader, as the seed asks.
    """

    name = "staircase"
    starts_slowest = True  # its first fitting pair is the biggest accumulation at split 1

    def __init__(self, candidates: Sequence[Candidate], max_trials: int | None = None, spare_retry: bool = False, **memory: Any) -> None:
        super().__init__(candidates, max_trials, **memory)
        self.spare_retry = spare_retry
        self.by_pair = {(c.accum, c.split): c for c in self.candidates}
        self.splits_at: dict[int, list[int]] = {}
        for c in self.candidates:  # sorted, so each list is ascending
            self.splits_at.setdefault(c.accum, []).append(c.split)
        self.base_split = min((c.split for c in self.candidates), default=1)
        self.column = [c for c in self.candidates if c.split == self.base_split]  # accum ascending

    def _plan(self, finished: Mapping[str, TrialResult]) -> list[Candidate]:
        results = list(finished.values())
        # Only a roomy pair outranks: a tight one is not the answer (ranking.recommend), so a pair
        # no faster than it may still be.
        roomy = [r for r in results if r.status == OK and not at_risk(r)]
        self._breaks = ordering_breaks(finished)
        base, pending = self._step2(finished, results)
        if pending:
            return pending
        if base is not None:
            pending = self._step3(base, finished, results, roomy)
            if pending and self.spare_retry:
                # For a spare slot: the last stair's split-doubled pair, what a joint-phase OOM there retries; then the
                # answer so far's neighbours below it, which the search runs before it ends (_neighbours) in any case.
                state, retry = self._first_runnable(pending[-1].accum, pending[-1].split * 2, finished, results, roomy)
                return pending + ([retry] if state == "pending" and retry is not None else []) + self._neighbours(finished, results)
            if pending:
                return pending
        return self._refine(finished, results, roomy)

    def _step2(
        self, finished: Mapping[str, TrialResult], results: list[TrialResult]
    ) -> tuple[int | None, list[Candidate]]:
        """(smallest accum that ran ok, candidates still to bisect over)."""
        ok = [c.accum for c in self.column if c.key in finished and finished[c.key].status == OK]
        hi = min(ok) if ok else None
        # Any OOM on this column implies OOM at every smaller accum (bigger p and j, same split).
        ooms = [
            c.accum
            for c in self.column
            if (finished[c.key].status == OOM if c.key in finished else self._ruled_out(c, results))
        ]
        lo = max(ooms) if ooms else None
        unknown = [
            c
            for c in self.column
            if c.key not in finished and (lo is None or c.accum > lo) and (hi is None or c.accum < hi)
        ]
        return hi, _bisection_order(unknown)

    def _step3(
        self, base_accum: int, finished: Mapping[str, TrialResult], results: list[TrialResult], roomy: list[TrialResult]
    ) -> list[Candidate]:
        """Stairs still to run, in order; those after the first are speculative, for free slots."""
        accum, split = base_accum, self.base_split
        pending: list[Candidate] = []
        while accum % 2 == 0:
            state, c = self._first_runnable(accum // 2, split * 2, finished, results, roomy)
            if c is None:
                break
            if state == "pending":
                pending.append(c)
            # An outranked stair is stepped over unrun: the next one has a bigger batch and may still win.
            accum, split = c.accum, c.split
        return pending

    def _first_runnable(
        self,
        accum: int,
        split: int,
        finished: Mapping[str, TrialResult],
        results: list[TrialResult],
        roomy: list[TrialResult],
    ) -> tuple[str, Candidate | None]:
        """At this accum, the first split >= `split` not known or implied to OOM.

        Returns ("ran", c) if that pair already finished (ok or failed),
        ("pending", c) if it is worth running, ("outranked", c) if a measured
        roomy pair outranks it (and so every bigger split here), ("none", None) if
        every split OOMs.
        """
        for s in self.splits_at.get(accum, []):
            if s < split:
                continue
            c = self.by_pair[(accum, s)]
            r = finished.get(c.key)
            if r is not None and r.status != OOM:
                return "ran", c
            if r is None and not self._ruled_out(c, results):
                return ("outranked" if any(ordered_below(c, m, self._breaks) for m in roomy) else "pending"), c
        return "none", None

    def _refine(
        self, finished: Mapping[str, TrialResult], results: list[TrialResult], roomy: list[TrialResult]
    ) -> list[Candidate]:
        ranked = ranked_ok(finished)
        if not ranked:
            # Nothing ran ok (e.g. every trial at the smallest split failed): try what
            # is left, least memory first, until something runs.
            rest = [c for c in self.candidates if c.key not in finished and not self._ruled_out(c, results)]
            return sorted(rest, key=lambda c: (c.per_device_batch, c.joint_batch))
        lead = ranked[0]
        a, s = lead.accum, lead.split
        # Neighbours in (per-device batch, joint batch): p doubled, j doubled; p same, j doubled;
        # p halved, j quadrupled (or split dropped to 1). Walking each up in split past OOMs also
        # reaches p doubled with j the same or smaller. Anything else the leader outranks.
        neighbours = [(a // 2, s), (a, s // 2), (a * 2, s // 4)]
        # A tight pair is too close to OOM to recommend, but the same per-device batch with its joint
        # run in more chunks needs less memory and may still beat every roomy pair: so for any tight
        # pair that racing would not stop against the best roomy pair (run-to-run noise reorders
        # pairs whose intervals overlap), or, with nothing roomy yet, for the leader alone.
        best_roomy = next((r for r in ranked if not at_risk(r)), None)
        neighbours += [
            (r.accum, r.split * 2)
            for r in ranked
            if at_risk(r) and (may_outrun(r, best_roomy) if best_roomy is not None else r is lead)
        ]
        out = []
        for na, ns in neighbours:
            state, c = self._first_runnable(na, ns, finished, results, roomy)
            if state == "pending" and c is not None:
                out.append(c)
        return out + self._neighbours(finished, results)

    def _neighbours(self, finished: Mapping[str, TrialResult], results: list[TrialResult]) -> list[Candidate]:
        """The ordering is a prior: the pairs next to the answer so far that it alone ranks below it (its next smaller
        micro-batch and joint batch: implications.ordering_neighbours) are run before the search ends. Where the
        largest micro-batch that fits is the slower one (allocator retries near the limit), the next one down is the
        answer; elsewhere each costs a few steps (core/decision.py's rule 1 stops it once its steps confirm the ordering)."""
        # The answer so far: the fastest roomy pair, a provisional one included (it is run again in full if it may be
        # the answer, orchestration/remeasure.py: then these are its neighbours, already run).
        answer = next((r for r in ranked_ok(finished) if not at_risk(r)), None)
        if answer is None:
            return []
        # Its next bigger ones too, where they may fit and only the ordering skipped them: ranked below a measured pair
        # that did not beat the answer (a tie, or the largest micro-batch slowed), they may be the peak between the two.
        roomy = [r for r in results if r.status == OK and not at_risk(r)]
        bigger = [
            c for c in self.candidates
            if no_faster_than(answer, c) and near(c, answer, self.candidates) and any(ordered_below(c, m, self._breaks) for m in roomy)
        ]
        return [
            c for c in [*ordering_neighbours(answer, self.candidates), *bigger] if c.key not in finished and not self._ruled_out(c, results)
        ]


# --- powers ---------------------------------------------------------------------------------


class Powers(_Base):
    """The tuning playbook: double the per-device batch (halve accum) until OOM.

    Splits are kept at the smallest value that can still fit: when a doubling
    OOMs in the joint/loss phase, the same per-device batch is retried with the
    split doubled (the seed's knob for exactly that OOM); an encoder OOM, or no
    split left that could fit, ends the climb. A failed trial counts as that
    batch's attempt and the climb goes on. Use `scaling_report` on the results.
    """

    name = "powers"
    starts_slowest = True  # its first fitting pair is the smallest micro-batch
    one_dimensional = True

    def __init__(self, candidates: Sequence[Candidate], max_trials: int | None = None, **memory: Any) -> None:
        super().__init__(candidates, max_trials, **memory)
        self.batches = sorted({c.per_device_batch for c in self.candidates})

    def _plan(self, finished: Mapping[str, TrialResult]) -> list[Candidate]:
        results = list(finished.values())
        plan: list[Candidate] = []
        for p in self.batches:
            row = [c for c in self.candidates if c.per_device_batch == p]  # split ascending
            if any(c.key in finished and finished[c.key].status != OOM for c in row):
                continue  # this batch has its answer
            nxt = next((c for c in row if c.key not in finished and not self._ruled_out(c, results)), None)
            if nxt is None:
                break  # every split at this batch runs out of memory: the climb ends here
            if plan and nxt.split != plan[0].split:
                break  # later doublings for free slots only at the split in use, not guessed ones
            plan.append(nxt)
        return plan


# --- factory --------------------------------------------------------------------------------

STRATEGIES: dict[str, type[_Base]] = {cls.name: cls for cls in (Grid, Staircase, Powers)}


def strategy_class(name: str) -> type[_Base]:
    """The strategy class of search.name (validated at the edge: core/config.SEARCHES), for its traits."""
    return STRATEGIES[name]


def make_strategy(
    name: str,
    candidates: Sequence[Candidate],
    max_trials: int | None = None,
    *,
    capacity_gib: float | None = None,
    trust_memory_model: bool = True,
    spare_retry: bool = False,
) -> Strategy:
    """capacity_gib: device memory per device (machine.memory_gib); None turns predictions off.
    spare_retry: the staircase offers spare slots its last stair's split-doubled pair (Staircase)."""
    cls = STRATEGIES.get(name)
    if cls is None:
        raise ValueError(f"unknown search strategy {name!r}: valid names are {', '.join(sorted(STRATEGIES))}")
    if max_trials is not None and (isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1):
        raise ValueError(f"max_trials={max_trials!r} is not valid: expected a positive integer or None")
    if capacity_gib is not None and (isinstance(capacity_gib, bool) or not isinstance(capacity_gib, (int, float)) or capacity_gib <= 0):
        raise ValueError(f"memory capacity={capacity_gib!r} GiB is not valid: expected a positive number or None")
    extra = {"spare_retry": True} if spare_retry and cls is Staircase else {}
    strategy: Strategy = cls(candidates, max_trials, capacity_gib=capacity_gib, trust_memory_model=bool(trust_memory_model), **extra)
    return strategy
