"""Measure to the decision (pure): stop a running trial once more steps cannot change the answer.

Adaptive measurement (core/measure.py) times a pair until its own median is known to
+-target_precision; on a GPU, where per-step times scatter by 5-7%, that is rarely met before
the cap, so every pair that fits cost the full cap, whether or not it could be the answer.
Here the question is the sweep's instead. A running pair is stopped because it cannot win once
warm-up and FIT_KNOWN_STEPS timed steps have passed, when

1. ordering: a finished roomy pair outranks it by the throughput ordering
   (core/implications.ordered_below: no bigger micro-batch, no bigger joint chunk, no split
   saving, and no measurement has contradicted the ordering there) and its own steps so far agree
   (its median is below that pair's). The ordering is a prior; a pair whose first steps contradict
   it runs on to the rules below. A pair next to the one that outranks it (implications.near: within
   one step of its micro-batch and joint batch) is where the ordering fails (the largest micro-batch
   that fits slowed by allocator retries near the memory limit): it stops so only once its own steps
   confirm it, NEIGHBOUR_STEPS timed steps each below that pair's 95% lower bound, or on a real
   interval (MIN_INTERVAL_STEPS steps); a tie runs on. The score counts a neighbour stopped sooner
   as open (core/confidence.open_neighbours);
2. racing: its 95% interval lies wholly below the leader's (core/measure.cannot_win, with its
   guards: real intervals on both sides, a margin for run-to-run drift);

and, before any pair has a figure to be compared with, when

0. provisional: no roomy pair has finished and no running one has a real interval, so the search
   has only begun; the staircase's first fitting pair is its slowest candidate that fits (the
   biggest accumulation at split 1), and the pairs it launches next are expected to beat it. Its
   figure serves to order them (rule 1) and its status to guide the search, so it stops once its
   fit at the first (worst) batch is known (PROVISIONAL_STEPS), before its stress step, with
   `stopped_early` starting "provisional". A figure of so few steps has no 95% interval, so no
   rule below compares a pair with it (rivals need MIN_INTERVAL_STEPS steps), and it is never the
   answer as it stands, nor ruled out by it: its one step may have been the sweep's coldest (the
   first trial on a cold page cache, a cold compile cache), so a slow provisional figure is no
   evidence that the pair is slow. A provisional pair that may still be the answer when the search
   ends (one no pair measured in full outranks by the throughput ordering, or whose median reaches
   the recommendation's 95% lower bound: provisional_contenders) is run again, in full, and decided
   on that measurement; until then the confidence score stays below 80 (core/confidence.py).

and because it is ahead only once its fit is known (it has passed its stress step: see
ahead_after_steps), when

3. separated: its interval lies wholly above every rival's (each finished roomy ok pair and each
   running pair with a real interval, MIN_INTERVAL_STEPS steps or more): it is the answer so far,
   and more steps would only narrow an interval that already decides. With no rival measured yet,
   the pair stops at trial.measure_steps: every later pair is compared with it, and one that lands
   inside its interval is measured on (rule 3 cannot separate them) to the cap.

A pair stopped for being ahead may be the recommendation, so it must have met the worst memory its
training will: the built-in RNN-T repeats its worst batch at step workload.stress_step, after the
allocator has seen other shapes (the late OOMs on the H100 came at timed steps 9 and 22, after
the first step had fitted). A pair stopped because it cannot win is not recommended whatever its
fit, so those rules need not wait.

and, also only once its fit is known, when

4. tied: every rival it is not separated from (each one whose interval overlaps its own) has a
   median inside the run-to-run noise of its own (tie_band: two trial processes' figures of one
   pair differ by up to 1.96 * sqrt(2) * machine.run_to_run_noise, 2.8% at cuda's default 1%).
   More steps narrow each trial's own interval, but a rerun of either moves it by more than the
   gap: no number of steps orders them, and the confidence score, which adds that noise to every
   trial's error, calls them a tie either way;
5. its own steps cannot separate it: every rival it is not separated from is tied with it (rule 4)
   or has finished with an interval that holds its own whole 95% interval (with racing's margin).
   Its own further steps converge on its true median, which (at 95%) lies inside that finished
   rival's interval, where no interval of its own can clear the rival's: only the rival's steps
   could order them, and it has stopped. The order of the two medians decides, and the confidence
   score carries both intervals as they are. (On the H100's base24, accum=1 split=32 ran 24 timed
   steps past its stress step inside accum=2 split=16's 8-step interval, to the cap.) The same holds
   of a rival that does not hold its interval whole but that no figure inside its interval could
   clear by the trial's cap (trial.max_measure_steps), its interval narrowed as its steps' scatter
   says it will (_unseparable_by_cap): the cap would end it undecided whatever its truth.

A pair that may still be the answer (its interval overlaps the leader's or the runner-up's, further
apart than the noise, and reaches out of them) runs on until the trial's own rule (target precision
or the cap) ends it. A stopped trial keeps its partial measurement as ok with `stopped_early` saying
why, as racing's stops do.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sweep.core.confidence import outranked_by_measured
from sweep.core.growth import at_risk
from sweep.core.implications import NEIGHBOUR_STEPS, ORDERED_STOP, confirmed_below, near, no_faster_than, ordered_below, ordering_breaks
from sweep.core.measure import MIN_INTERVAL_STEPS, RACE_MARGIN, cannot_win, race_reason
from sweep.core.ranking import ranked_ok, recommendable
from sweep.core.schema import OK, TrialResult
from sweep.core.space import Candidate
from sweep.core.stats import t95, throughput_summary, wall_time_se
from sweep.core.steady import still_warming

# Timed steps after warm-up before a pair may stop because it cannot win. The built-in RNN-T's
# first step is its longest batch, so one passed step has met the worst memory on a fresh
# allocator; a command trial's worst step is unknown, and this is also where it may stop ahead.
FIT_KNOWN_STEPS = 1
# Where a pair stops provisionally (rule 0): as soon as its fit at the worst batch is known and it has
# one figure to order the next pairs by. Its stop reason starts with PROVISIONAL.
PROVISIONAL_STEPS = FIT_KNOWN_STEPS
PROVISIONAL = "provisional"


def ahead_after_steps(stress_step: int, warmup_steps: int) -> int:
    """Timed steps a pair must have run before it may stop for being ahead.

    stress_step: the step index, warm-up included and counted from 0, at which the workload repeats
    its worst batch (the built-in RNN-T's workload.stress_step); 0 where it has none (command
    trials). Passing that step is timed step stress_step - warmup_steps + 1; a stress step inside
    the warm-up, or none, leaves FIT_KNOWN_STEPS."""
    if stress_step <= 0:
        return FIT_KNOWN_STEPS
    return max(FIT_KNOWN_STEPS, stress_step - warmup_steps + 1)

Interval = tuple[float, float]

# Two figures from two trial processes differ by the run-to-run noise of each, sd sqrt(2) * noise: a gap
# inside TIE_Z of those sds is not an ordering a single measurement of each can state, however many steps.
TIE_Z = 1.96


def tie_band(run_to_run_noise: float) -> float:
    """The relative gap between two pairs' medians below which their order is the run-to-run noise's."""
    return TIE_Z * math.sqrt(2.0) * run_to_run_noise


def tied(a: float, b: float, run_to_run_noise: float) -> bool:
    """Whether two medians (samples/s) lie inside each other's run-to-run noise (tie_band)."""
    return a > 0 and b > 0 and abs(math.log(a / b)) <= tie_band(run_to_run_noise)


@dataclass(frozen=True)
class Running:
    """A running trial as the decision sees it: its pair and the timed steps it has reported."""

    cand: Candidate
    step_times_s: Sequence[float]


def _interval(times: Sequence[float], global_batch_size: int) -> tuple[float, Interval]:
    mid, low, high = throughput_summary(times, global_batch_size)
    return mid, (low, high)


def _has_interval(r: TrialResult) -> bool:
    """A real 95% interval: MIN_INTERVAL_STEPS steps or more. A finished pair with fewer was stopped by
    the ordering (rule 1: never the answer) or provisionally (rule 0: run again if it may be); it is
    no rival to separate from, as no interval can be separated from its figure (cannot_win's guard)."""
    return bool(r.throughput_low and r.throughput_high and len(r.step_times_s) >= MIN_INTERVAL_STEPS)


def race_leader(results: Mapping[str, TrialResult], excluding: str = "") -> TrialResult | None:
    """Who leads a race, the one definition every stop asks (rule 2 here, racing alone in `losers`): the fastest
    finished ok pair that is roomy (a tight or otherwise at-risk pair is not what the sweep recommends, so a pair that
    cannot beat it may yet be the answer) and has a real 95% interval (a figure of fewer steps cannot be separated
    from). The table's rank 1 (core/implications.leader_key) may differ: it ranks every ok pair."""
    return next((r for r in ranked_ok(results) if r.key != excluding and not at_risk(r) and _has_interval(r)), None)


def losers(running: Mapping[str, Sequence[float]], results: Mapping[str, TrialResult], global_batch_size: int) -> dict[str, str]:
    """Racing alone (search.measure_to_decision=false): {key: reason} for each running trial (its timed steps so far)
    whose 95% interval lies wholly below the race leader's."""
    lead = race_leader(results)
    if lead is None:
        return {}
    lead_interval = (float(lead.throughput_low or 0.0), float(lead.throughput_high or 0.0))
    out = {}
    for key, times in running.items():
        steps = [t for t in times if t > 0]
        if not steps:
            continue
        _, mine = _interval(steps, global_batch_size)
        if cannot_win(mine, lead_interval, candidate_steps=len(steps), leader_steps=len(lead.step_times_s)):
            out[key] = race_reason(mine, lead_interval, lead.key)
    return out


def _holds(outer: Interval, inner: Interval) -> bool:
    """Whether `outer` (a finished rival's interval) holds all of `inner`, with racing's margin on each side:
    then no narrowing of `inner` around a median inside it can clear `outer` either way (cannot_win)."""
    return inner[0] * (1.0 + RACE_MARGIN) >= outer[0] and inner[1] <= outer[1] * (1.0 + RACE_MARGIN)


def _unseparable_by_cap(outer: Interval, inner: Interval, times: Sequence[float], max_steps: int) -> bool:
    """Whether no figure inside `inner` (its 95% interval) would let the pair's own steps clear `outer` (a finished
    rival's interval, racing's margin on each side) by the trial's cap: a futility bound on its own further steps.

    At the cap its log half-width is today's standard error scaled by sqrt(n / max_steps) times the t quantile on
    max_steps - 1 (the steps' scatter as measured). Even were its figure its upper bound, its lower bound at the cap
    would not clear the rival's upper one; even were it its lower bound, its upper bound would not fall below the
    rival's lower one. Where both hold, the cap ends it inside the rival's interval whatever its truth: only the
    rival's steps could order them, as when `outer` holds `inner` whole (_holds)."""
    n = len(times)
    if max_steps <= n:
        return False  # the trial's own rule ends it now
    se, _ = wall_time_se(times)
    if not math.isfinite(se):
        return False
    at_cap = t95(max_steps - 1) * se * math.sqrt(n / max_steps)
    cannot_clear_above = inner[1] * math.exp(-at_cap) <= outer[1] * (1.0 + RACE_MARGIN)
    cannot_fall_below = inner[0] * math.exp(at_cap) * (1.0 + RACE_MARGIN) >= outer[0]
    return cannot_clear_above and cannot_fall_below


def outranking(cand: Candidate, results: Mapping[str, TrialResult]) -> list[TrialResult]:
    """The finished roomy ok pairs that outrank `cand` by the throughput ordering (where no measurement has
    contradicted it: core/implications.ordered_below), fastest first."""
    breaks = ordering_breaks(results)
    return [r for r in ranked_ok(results) if not at_risk(r) and r.key != cand.key and ordered_below(cand, r, breaks)]


def _clearly_below(times: Sequence[float], r: TrialResult, global_batch_size: int) -> bool:
    """NEIGHBOUR_STEPS timed steps or more, each slower than r's 95% lower bound: the ordering confirmed, not a tie."""
    low = float(r.throughput_low or r.throughput or 0.0)
    return len(times) >= NEIGHBOUR_STEPS and all(global_batch_size / t < low for t in times)


def cancel_reason(cand: Candidate, results: Mapping[str, TrialResult]) -> str | None:
    """Why a screening trial still before its first timed step is not needed, or None.

    The throughput ordering rules it out as it rules out the pairs the staircase does not launch:
    a screening trial outranked before it timed a step is treated like one of those (its job is
    cancelled), since what it would add, screening's coarse figure, cannot change which pairs
    the full trials confirm."""
    by = outranking(cand, results)
    if not by:
        return None
    return f"cancelled before its first timed step: outranked by {by[0].key} (no bigger micro-batch or joint chunk)"


def decision_stop(
    key: str,
    running: Mapping[str, Running],
    results: Mapping[str, TrialResult],
    global_batch_size: int,
    *,
    first_pair_steps: int,
    ahead_steps: int = FIT_KNOWN_STEPS,
    run_to_run_noise: float = 0.0,
    provisional_steps: int = 0,
    space: Sequence[Candidate] | None = None,
    max_steps: int = 0,
) -> str | None:
    """Why the running trial `key` should stop now, or None while it may still change the answer.

    first_pair_steps: where a pair stops with no rival measured (trial.measure_steps).
    ahead_steps: timed steps before a pair may stop for being ahead (ahead_after_steps).
    run_to_run_noise: machine.run_to_run_noise; 0 leaves tied pairs to the trial's own rule (rule 4).
    provisional_steps: where the search's first pair stops provisionally (rule 0, PROVISIONAL_STEPS);
    0 for a trial that must not (a re-run of a provisional pair, a confirmation of screened ones).
    space: the sweep's candidates, whose values say which pairs are next to each other (rule 1); None: one doubling.
    max_steps: the trial's cap (trial.max_measure_steps), for rule 5's bound on what its own steps can still separate;
    0: unknown, so only a rival whose interval holds its whole interval counts.
    """
    me = running[key]
    times = [t for t in me.step_times_s if t > 0]
    n = len(times)
    if n < FIT_KNOWN_STEPS:
        return None
    mid, mine = _interval(times, global_batch_size)
    if still_warming(times):
        return None  # still speeding up: its figure so far is its warm-up's, which no rule may judge it by
    roomy = [r for r in ranked_ok(results) if not at_risk(r) and r.key != key]
    # 1. the throughput ordering, where the pair's own steps agree with it; next to that pair, where they agree clearly
    above = outranking(me.cand, results)
    if n < MIN_INTERVAL_STEPS and any(near(me.cand, r, space) and not _clearly_below(times, r, global_batch_size) for r in above):
        above = []  # next to a pair that outranks it, and its own steps have not yet confirmed the ordering there
    for r in above:
        if mid < float(r.throughput or 0.0):
            return (
                f"{ORDERED_STOP} {r.key} (no bigger micro-batch or "
                f"joint chunk, and {mid:.4g} samples/s so far against its {float(r.throughput or 0.0):.4g})"
            )
    # 0. the search's first pair: a figure to order the next pairs by, its fit at the worst batch known (one that
    # reached its stress step and trial.measure_steps before a poll saw it is measured in full: rule 3 stops it)
    measured = {k: [t for t in run.step_times_s if t > 0] for k, run in running.items() if k != key}
    in_full = n >= max(ahead_steps, first_pair_steps)
    if 0 < provisional_steps <= n and not in_full and not roomy and all(len(t) < MIN_INTERVAL_STEPS for t in measured.values()):
        return (
            f"{PROVISIONAL}: the search's first pair, no other pair measured yet; its fit at the first (worst) batch is known, "
            f"its stress step is not: run again in full if it may be the answer"
        )
    if n < MIN_INTERVAL_STEPS:
        return None
    rivals: list[tuple[str, Interval, int]] = [
        (r.key, (float(r.throughput_low or 0.0), float(r.throughput_high or 0.0)), len(r.step_times_s)) for r in roomy if _has_interval(r)
    ]
    medians = {r.key: float(r.throughput or 0.0) for r in roomy if _has_interval(r)}
    for other, other_times in measured.items():
        if len(other_times) >= MIN_INTERVAL_STEPS:
            other_mid, other_iv = _interval(other_times, global_batch_size)
            rivals.append((other, other_iv, len(other_times)))
            medians[other] = other_mid
    # 2. racing: below the finished leader (race_leader)
    lead = race_leader(results, excluding=key)
    if lead is not None:
        lead_interval = (float(lead.throughput_low or 0.0), float(lead.throughput_high or 0.0))
        if cannot_win(mine, lead_interval, candidate_steps=n, leader_steps=len(lead.step_times_s)):
            return race_reason(mine, lead_interval, lead.key)
    # 3. separated above every rival: the answer so far, already decided, once its fit is known
    if n < ahead_steps:
        return None
    if not rivals:
        if n >= first_pair_steps:
            return "no other pair measured in full yet (each later pair is compared with this one)"
        return None
    if all(cannot_win(iv, mine, candidate_steps=steps, leader_steps=n) for _, iv, steps in rivals):
        runner_up = max(rivals, key=lambda x: x[1][1])
        return (
            f"ahead of every measured pair (95% lower bound {mine[0]:.4g} samples/s "
            f"> the runner-up {runner_up[0]}'s upper bound {runner_up[1][1]:.4g})"
        )
    # 4. tied within the run-to-run noise with every rival it is not separated from
    open_rivals = [(k, iv) for k, iv, steps in rivals if not cannot_win(iv, mine, candidate_steps=steps, leader_steps=n)]
    ties = {k for k, _ in open_rivals if run_to_run_noise > 0 and tied(mid, medians[k], run_to_run_noise)}
    if open_rivals and len(ties) == len(open_rivals):
        nearest = min(ties, key=lambda k: abs(math.log(mid / medians[k])))
        return (
            f"tied with {nearest} within the run-to-run noise ({mid:.4g} against {medians[nearest]:.4g} samples/s, "
            f"closer than {tie_band(run_to_run_noise):.1%}: a rerun moves either by more)"
        )
    # 5. the rest hold its whole interval in finished ones of their own: only their steps could order them
    holding = [(k, iv) for k, iv in open_rivals if k not in ties and k in results and _holds(iv, mine)]
    by_cap = [(k, iv) for k, iv in open_rivals if k not in ties and k in results and (k, iv) not in holding
              and _unseparable_by_cap(iv, mine, times, max_steps)]
    if open_rivals and len(ties) + len(holding) + len(by_cap) == len(open_rivals):
        k, iv = (holding or by_cap)[0]
        where = "lies inside" if holding else f"cannot clear, by the cap of {max_steps} steps, "
        return (
            f"its own steps cannot separate it from {k}: its 95% interval {mine[0]:.4g}-{mine[1]:.4g} samples/s "
            f"{where} that finished pair's {iv[0]:.4g}-{iv[1]:.4g}"
        )
    return None


def decision_stops(
    running: Mapping[str, Running],
    results: Mapping[str, TrialResult],
    global_batch_size: int,
    *,
    first_pair_steps: int,
    ahead_steps: int = FIT_KNOWN_STEPS,
    run_to_run_noise: float = 0.0,
    provisional_steps: int = 0,
    in_full: Collection[str] = (),
    space: Sequence[Candidate] | None = None,
    max_steps: int = 0,
) -> dict[str, str]:
    """{key: reason} for every running trial that should stop now; in_full: the running trials that may
    not stop provisionally (the re-runs of provisional pairs)."""
    out = {}
    for key in running:
        reason = decision_stop(
            key, running, results, global_batch_size, first_pair_steps=first_pair_steps, ahead_steps=ahead_steps,
            run_to_run_noise=run_to_run_noise, provisional_steps=0 if key in in_full else provisional_steps, space=space,
            max_steps=max_steps,
        )
        if reason:
            out[key] = reason
    return out


def is_provisional(r: TrialResult) -> bool:
    """An ok trial stopped by rule 0: its figure orders the search, it is never the answer as it stands."""
    return r.status == OK and (r.stopped_early or "").startswith(PROVISIONAL)


def cut_short(r: TrialResult) -> bool:
    """An ok trial the sweep stopped on fewer timed steps than a 95% interval needs (provisionally, or by the ordering)."""
    return r.status == OK and bool(r.stopped_early) and max(len(r.step_times_s), r.steps_measured or 0) < MIN_INTERVAL_STEPS


def provisional_contenders(results: Mapping[str, TrialResult], space: Sequence[Candidate] | None = None) -> list[str]:
    """The provisional pairs that may still be the answer, fastest first: each is run again in full.

    A provisional figure rests on one step, and the search's first step is its coldest (page cache, kernel and
    compile caches, a recompile), so a slow one orders the search but rules nothing out on its own: every
    provisional pair that no pair measured in full outranks by the throughput ordering (the heuristic that
    rules out untried pairs too: core/confidence.outranked_by_measured) is run again; so is one whose median
    reaches the lower bound of the pair the recommendation would take (or is that pair). A re-run that lands
    lower may leave another provisional pair first: that one is run again in its turn.

    So is a pair cut short on a step or two (provisionally or by the ordering) that is a neighbour of the answer
    the ordering alone ranks below it (core/implications.ordering_neighbours; space: the sweep's candidates, None:
    one doubling): the score stays below 80 until it is measured (core/confidence.open_neighbours)."""
    pool = recommendable(ranked_ok(results))
    if not pool:
        return []
    best = pool[0]
    floor = float(best.throughput_low or best.throughput or 0.0)
    measured = [r for r in pool if not cut_short(r)]
    beside = {
        r.key for r in results.values()
        if measured and cut_short(r) and not confirmed_below(r) and no_faster_than(r, measured[0]) and near(r, measured[0], space)
    }
    return [
        r.key for r in ranked_ok(results)
        if (is_provisional(r) and (r.key == best.key or float(r.throughput or 0.0) >= floor or not outranked_by_measured(r, results)))
        or r.key in beside
    ]
