"""How likely is the leader (fastest ok trial by wall-time throughput) to be the truly fastest feasible pair? (pure)

1. Measured: each ok trial's log throughput ~ normal around its wall-time figure, with the se its 95% interval
   states (core/stats.py: stalls widen it), shrunk toward the pooled robust step jitter, plus the machine's
   run-to-run noise (1% unless told otherwise); P_measured = P(the leader beats every other ok
   pair), by 1-D quadrature over the leader's error (error < 1e-9).
2. Untried: a valid pair not finished, whose OOM is not implied and that no measured pair outranks,
   may be feasible and faster with prior q = Q[direction] * 0.52**(d-1) (* 0.54 unless an ok trial
   implies it fits, * 0.44 if a slower measured pair lies between it and the leader that way, and
   * the leader's gain per doubling over the nearest measured pair behind it / 0.23, in [0.02, 1]:
   diminishing returns); direction and d (doublings) are taken in (per-device batch, joint batch).
3. confidence = P_measured * prod(1 - q), as an integer 0..99: never 100, as Cerebras.

What counts as measured (issue 43): a pair the sweep stopped early on fewer than MIN_INTERVAL_STEPS timed
steps (the search's provisional first pair, a pair the throughput ordering ruled out after a step) has no
95% interval and may have been timed on a cold step, so it is scored as untried, not as measured: it
drops out of P_measured and counts as an open pair unless a pair measured in full outranks it. A
`rejected` record (its figure failed core/validity.py's checks) and a `cancelled` one are untried too.
A pair that ran to its own end on fewer steps (thinly_measured) stays in P_measured, but while it could be
the answer the score stays below 80, as it does for a pair cut short.

The throughput ordering is a prior, not a measurement (issue 50; core/implications.py): a pair it alone ranks
below a measured pair is not pruned but open with a small prior (ORDER_SLIP, decaying with its distance from the
leader), and none where the measurements contradict it (implications.ordering_breaks). The leader's neighbours
that only the ordering ranks below it (its next smaller micro-batch and joint batch: implications.ordering_neighbours)
cap the score below 80 while one is open: the largest micro-batch that fits can be the slower one (allocator
retries near the memory limit), and only measuring the next one down says it is not. A rejected pair is never
pruned by the ordering: it could not be judged, so it counts as unknown.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache

import numpy as np

from sweep.core.implications import (
    confirmed_below,
    fit_implied,
    leader_key,
    near,
    no_faster_than,
    oom_implied,
    ordered_below,
    ordering_breaks,
    ordering_neighbours,
    rank_order,
)
from sweep.core.measure import MIN_INTERVAL_STEPS
from sweep.core.schema import CANCELLED, OK, OOM, REJECTED, TrialResult
from sweep.core.space import Candidate
from sweep.core.stats import interval_se, normal_pdf, special, wall_time_se
from sweep.core.steady import changed_pace

__all__ = ["confidence_score", "leader_probability", "leader_key", "open_pairs", "rank_order"]

# Measurement model. A trial's steps share conditions (node, clocks, data order) that the
# next trial does not, so trials differ by more than their step scatter suggests.
TRIAL_FLOOR = 0.01  # between-trial log-throughput noise when the machine's run-to-run noise is not given
SHRINK_STEPS = 8  # weight, in steps, of the pooled spread when estimating one trial's spread
DEFAULT_SE = 0.05  # a result with neither step times nor an interval
UNMEASURED_CAP = 0.79  # the most the score says while a pair that may be the answer was cut short (unmeasured)
# Prior that a pair the throughput ordering alone ranks below a measured pair is feasible and faster than the leader
# anyway, at one doubling from the leader (* DECAY per further doubling): the ordering fails near the memory limit
# (allocator retries), so it is a prior, not a prune. The leader's own neighbours it covers cap the score instead.
ORDER_SLIP = 0.01

# Prior that an untried pair is feasible and faster than the leader, by direction from the
# leader in (per-device batch p, joint batch j) at d = 1 doubling. The two trade-off directions
# share one prior: which of "bigger p, more joint chunks" and "smaller p, fewer chunks" wins is
# the workload's compute/launch balance, which another workload (or another machine) reverses, so
# a prior sharpened on one simulator's answer does not transfer. What holds for any workload keeps
# its own prior: bigger in both is faster if it fits, smaller in both only wins on a split overhead.
Q = {
    "outranks": 0.92,  # p and j both at least the leader's: faster if it fits (often it does not)
    "wider": 1.0,  # bigger p, smaller j (the staircase direction); always d >= 2, so <= DECAY
    "narrower": 1.0,  # smaller p, bigger j; always d >= 2 as well
    "drops_split": 0.19,  # smaller p and j, but split=1 saves the splitting overhead
}
DECAY = 0.52  # per further doubling in p or j (d = |doublings of p| + |doublings of j|)
FIT_UNKNOWN = 0.54  # no ok trial implies it fits
SHADOW = 0.44  # a slower measured pair in the same direction lies between it and the leader
# Diminishing returns: throughput saturates with batch size in any workload (fixed costs amortise,
# utilisation nears a roof), so the gain per doubling shrinks further along a line. If the leader
# beat the nearest measured pair behind it (the leader lying between that pair and c) by g in log
# throughput per doubling, c is scaled by clamp(g / GAIN_FULL, GAIN_FLOOR, 1).
GAIN_FULL = 0.23  # log gain per doubling at which the trend no longer lowers the prior
GAIN_FLOOR = 0.02
# Every constant above was fitted (then rounded to 2 decimals) by maximum likelihood of "the leader is
# truly fastest" given the score, on the in-sample family alone (tests/support/landscapes.py random_landscape,
# 1500 staircase and 1500 grid sweeps, seed 0). The roofline family (random_roofline_landscape) is a
# held-out check: nothing was fitted on it. The structure (shared trade-off prior, the gain trend) was
# chosen by the reasoning above after seeing that the previous model was off there in the 20-40 band.

# Quadrature nodes for the leader's error, in its standard errors. The trapezoid rule on a normal-weighted
# smooth integrand converges geometrically: 0.1 apart it is within 1e-9 of scipy's adaptive quad, where
# Gauss-Legendre on the same span needs 160 nodes for 3e-6 and Gauss-Hermite is worse (measured, 3000 cases).
_Z = np.linspace(-8.0, 8.0, 161)


# The normal functions are scipy.special's (the ones scipy.stats' distributions call), imported on first use
# (core/stats.py's special()): scipy.stats' own import took 0.5 s of CPU (0.9 s on a busy box) in every sweep
# that scored a finished trial.
_NORMAL_MAD_SCALE = 0.6744897501960817  # special.ndtri(0.75): scipy.stats.median_abs_deviation's scale="normal", as it writes it
_trapezoid = getattr(np, "trapezoid", None) or getattr(np, "trapz")  # noqa: B009 - numpy 2 renamed it; scipy.integrate's is numpy's


@lru_cache(maxsize=1)
def _normal_density_at_nodes() -> np.ndarray:
    return normal_pdf(_Z)


@lru_cache(maxsize=8192)
def _step_spread(step_times_s: tuple[float, ...]) -> tuple[float, float, int] | None:
    """(spread of the wall-time figure, the machine's step jitter, how many steps) for a trial's steps; None under two.

    The first is the figure's own: its standard error (core/stats.py's wall_time_se, whose t-interval the table
    prints) times sqrt(n), so that a trial's se is that of its wall-time figure, stalls and hiccups included. The
    second is what other trials are shrunk toward: the normal-scaled median absolute deviation of the log step times
    (the sample sd if that is 0), which one pair's stalls do not inflate for every other pair. Cached: a sweep
    rescores every finished trial each time one lands.
    """
    times = [t for t in step_times_s if t > 0]
    if len(times) < 2:
        return None
    logs = np.log(times)
    mad = float(np.median(np.abs(logs - np.median(logs)))) / _NORMAL_MAD_SCALE
    jitter = mad if mad > 0 else float(np.std(logs, ddof=1))
    return wall_time_se(times)[0] * math.sqrt(len(times)), jitter, len(times)


def _estimates(ok: list[TrialResult], run_to_run: float = TRIAL_FLOOR) -> dict[str, tuple[float, float]]:
    """key -> (log throughput, standard deviation of its error)."""
    spreads: dict[str, tuple[float, float, int]] = {}
    for r in ok:
        spread = _step_spread(tuple(r.step_times_s))
        if spread is not None:
            spreads[r.key] = spread
    # A handful of steps gives a poor spread on its own; trials on one machine share most of its jitter (not its stalls,
    # which are a pair's own: a pair that stalls keeps its wide spread, and lends none of it to the rest).
    dof = sum(n - 1 for _, _, n in spreads.values())
    pooled = math.sqrt(sum((n - 1) * j * j for _, j, n in spreads.values()) / dof) if dof else 0.0
    out = {}
    for r in ok:
        if r.key in spreads:
            s, _, n = spreads[r.key]
            s = math.sqrt((n * s * s + SHRINK_STEPS * pooled * pooled) / (n + SHRINK_STEPS))
            se = s / math.sqrt(n)
        else:
            se = interval_se(r.throughput_low, r.throughput_high) or DEFAULT_SE
        out[r.key] = (math.log(r.throughput), math.sqrt(se * se + run_to_run**2))  # type: ignore[arg-type]
    return out


def leader_probability(results: Mapping[str, TrialResult], run_to_run: float = TRIAL_FLOOR) -> float | None:
    """P(the leader's true throughput beats every other ok pair's), from the measurements alone.

    run_to_run: the machine's run-to-run noise (relative sd between trial processes), added to every
    trial's own error: two pairs measured closer than it are not told apart, however many steps ran.
    """
    lead = leader_key(results)
    if lead is None:
        return None
    est = _estimates([r for r in results.values() if r.status == OK and r.throughput], run_to_run)
    m0, s0 = est[lead]
    # Rivals 8 combined standard errors behind cannot move the answer.
    rivals = [(m, s) for k, (m, s) in est.items() if k != lead and m0 - m < 8.0 * math.hypot(s0, s)]
    if not rivals:
        return 1.0
    means, sds = np.array(rivals).T
    # At each node: the density of the leader's error times P(every rival falls below the leader's value there).
    beats_all = np.prod(special().ndtr((m0 + s0 * _Z[:, None] - means) / sds), axis=1)
    return float(min(1.0, _trapezoid(_normal_density_at_nodes() * beats_all, _Z)))


def _timed_steps(r: TrialResult) -> int:
    return max(len(r.step_times_s), r.steps_measured or 0)


def unmeasured(r: TrialResult) -> bool:
    """Whether a finished record is no measurement of its pair for the score: cancelled, rejected, or ok but
    stopped early by the sweep on fewer timed steps than a 95% interval needs."""
    if r.status in (CANCELLED, REJECTED):
        return True
    return r.status == OK and bool(r.stopped_early) and _timed_steps(r) < MIN_INTERVAL_STEPS


def thinly_measured(r: TrialResult) -> bool:
    """An ok pair that ran to its own end on fewer timed steps than a 95% interval needs (trial.measure_steps=2, a
    trainer that stops after two steps, a busy box's warm-up leaving few): a figure, but no interval.

    A log's figures count as steps too, but for one: the parsers take an epoch's or a whole run's average (Myrtle's,
    HF's summary) alone, one figure covering the many steps it averages, and widen its interval to the noise floor
    (parsers/throughput.py), so a single log figure is that average, not a step. Two to five log figures are
    per-step lines (an average is never used with others): a few steps, thin like the probe's."""
    if r.status != OK or r.stopped_early:
        return False
    steps = _timed_steps(r)
    if r.measured_by == "log" and steps <= 1:
        return False
    return steps < MIN_INTERVAL_STEPS


def unsteady(r: TrialResult) -> bool:
    """An ok pair whose probe steps changed pace mid-trial (core/steady.changed_pace): its figure is what that window
    trained at, but no steady state, so, like a thin one, it keeps the score below 80 while it could be the answer."""
    return r.status == OK and r.measured_by == "probe" and bool(changed_pace(r.step_times_s))


def outranked_by_measured(
    c: Candidate | TrialResult, results: Mapping[str, TrialResult], breaks: Sequence[TrialResult] | None = None
) -> bool:
    """Whether an ok pair measured in full (not unmeasured) outranks c by the throughput ordering, where the
    measurements have not contradicted it (core/implications.ordered_below; breaks: implications.ordering_breaks
    of the results, computed when not given): a prior that c is no faster, which the score keeps small."""
    if breaks is None:
        breaks = ordering_breaks(results)
    return any(r.status == OK and not unmeasured(r) and r.key != c.key and ordered_below(c, r, breaks) for r in results.values())


def scored(results: Mapping[str, TrialResult]) -> dict[str, TrialResult]:
    """The records the score rests on: every finished one but those that are no measurement (unmeasured)."""
    return {k: r for k, r in results.items() if not unmeasured(r)}


def _offset(c: Candidate | TrialResult, lead: TrialResult) -> tuple[float, float]:
    """Doublings of per-device batch and of joint batch from the leader."""
    return math.log2(c.per_device_batch / lead.per_device_batch), math.log2(c.joint_batch / lead.joint_batch)


def _direction(u: float, w: float) -> str:
    if u >= 0 and w >= 0:
        return "outranks"
    if u > 0:
        return "wider"
    if w > 0:
        return "narrower"
    return "drops_split"  # smaller in both and still not outranked: it must have dropped to split=1


def _between(x: float, end: float) -> bool:
    return 0 <= x <= end if end >= 0 else end <= x <= 0


def _trend(u: float, w: float, gains: list[tuple[float, float, float]]) -> float:
    """Prior factor from the leader's gain per doubling over the nearest measured pair behind it, away from (u, w)."""
    behind = [(abs(mu) + abs(mw), gain / (abs(mu) + abs(mw))) for mu, mw, gain in gains if mu * u <= 0 and mw * w <= 0]
    if not behind:
        return 1.0
    per_doubling = min(behind)[1]
    return min(1.0, max(GAIN_FLOOR, per_doubling / GAIN_FULL))


def open_pairs(
    candidates: Sequence[Candidate],
    results: Mapping[str, TrialResult],
    predicted_oom: Mapping[str, float] | None = None,
    unknown: Collection[str] = (),
) -> list[tuple[Candidate, float]]:
    """Untried pairs that could still beat the leader, each with its prior q (empty with no leader).
    A failed or timed-out pair is infeasible here; a cancelled one was never measured, so it is untried.
    A pair the throughput ordering alone ranks below a measured pair is open with the ordering's prior
    (ORDER_SLIP), not pruned; a rejected one (in results, or its key in `unknown`) is never ranked by the
    ordering at all: it could not be judged.

    predicted_oom: {key: p_exceeds} of pairs skipped on the memory model's prediction. They are
    not proven OOM: the model's 1 - p_exceeds replaces the generic FIT_UNKNOWN as their chance to fit.
    """
    lead_key = leader_key(results)
    if lead_key is None:
        return []
    lead = results[lead_key]
    finished = list(results.values())
    ok = [r for r in finished if r.status == OK]
    measured = [(_direction(*_offset(r, lead)), *_offset(r, lead)) for r in ok if r.key != lead_key]
    gains = [(*_offset(r, lead), math.log(float(lead.throughput or 0.0) / float(r.throughput or 1.0)))
             for r in ok if r.key != lead_key and r.throughput and lead.throughput]
    breaks = ordering_breaks(results)
    rejected = set(unknown) | {k for k, r in results.items() if r.status == REJECTED}
    out = []
    for c in candidates:
        # A cancelled trial was interrupted, a rejected one measured something else: neither was measured.
        tried = c.key in results and not unmeasured(results[c.key])
        if not c.valid or tried or oom_implied(c, finished):
            continue
        u, w = _offset(c, lead)
        if c.key not in rejected and outranked_by_measured(c, results, breaks):
            # No faster than a measured pair by the ordering: a prior, small and shrinking with the distance.
            q = ORDER_SLIP * DECAY ** (abs(u) + abs(w) - 1)
            if predicted_oom and c.key in predicted_oom:
                q *= max(0.0, 1.0 - predicted_oom[c.key])
            out.append((c, q))
            continue
        direction = _direction(u, w)
        q = Q[direction] * DECAY ** (abs(u) + abs(w) - 1)
        if predicted_oom and c.key in predicted_oom:
            q *= max(0.0, 1.0 - predicted_oom[c.key])
        elif not fit_implied(c, finished):
            q *= FIT_UNKNOWN
        # Throughput that fell off between the leader and c, the same way, has likely peaked.
        if any(d == direction and _between(mu, u) and _between(mw, w) for d, mu, mw in measured):
            q *= SHADOW
        q *= _trend(u, w, gains)
        out.append((c, q))
    return out


def open_neighbours(
    candidates: Sequence[Candidate], results: Mapping[str, TrialResult], predicted_oom: Mapping[str, float] | None = None
) -> list[Candidate]:
    """The leader's neighbours that only the throughput ordering ranks below it (implications.ordering_neighbours)
    and that could beat it: wherever the leader is, one that was rejected (it could not be judged) or cut short
    before its own steps confirmed the ordering (implications.confirmed_below: one step may be a cold one, and a
    tie needs a real interval); and one never run (or cancelled) that is not implied nor predicted to OOM, while the
    leader sits at the memory limit (a pair one step bigger does not fit: where allocator retries slow the largest
    micro-batch that fits). While one is open no score reaches 80: the next one down is what shows whether the
    ordering held."""
    lead_key = leader_key(scored(results))
    if lead_key is None:
        return []
    lead = results[lead_key]
    finished = list(results.values())

    def fits_not(c: Candidate) -> bool:
        r = results.get(c.key)
        return (r is not None and r.status == OOM) or oom_implied(c, finished) or bool(predicted_oom and c.key in predicted_oom)

    at_limit = any(fits_not(c) for c in candidates if c.valid and no_faster_than(lead, c) and near(c, lead, candidates))
    out = []
    for c in ordering_neighbours(lead, candidates):
        r = results.get(c.key)
        if r is not None and (r.status == REJECTED or (r.status == OK and unmeasured(r) and not confirmed_below(r))):
            out.append(c)  # could not be judged, or cut short before its own steps said anything
        elif at_limit and (r is None or unmeasured(r)) and not fits_not(c):
            out.append(c)
    return out


def confidence_score(
    candidates: Sequence[Candidate],
    results: Mapping[str, TrialResult],
    predicted_oom: Mapping[str, float] | None = None,
    run_to_run: float = TRIAL_FLOOR,
    capped: bool = True,
) -> int | None:
    """0..99: how likely the leader is the fastest feasible pair; None when no trial ran ok.

    In-flight pairs count as untried. predicted_oom: see open_pairs. run_to_run: see leader_probability.
    Whether the search has ended is not an input: the score rests on the results alone, so an interim
    score and a final one mean the same thing.

    capped=False: the model's probability alone, without the evidence caps below (UNMEASURED_CAP: a pair cut short,
    a thin figure, an open neighbour of the leader). The caps are a rule, not a probability: they hold the score
    below 80 until what the model assumes has been measured, so where the assumption held they are conservative
    (tests/landscapes.simulate_calibration checks the model's calibration, and that the capped score is never
    more confident than it).
    """
    everything = results
    breaks = ordering_breaks(everything)
    cut_short = [r for r in results.values() if r.status == OK and unmeasured(r) and not outranked_by_measured(r, results, breaks)]
    rejected = {k for k, r in results.items() if r.status == REJECTED}
    results = scored(results)
    p = leader_probability(results, run_to_run)
    if p is None:
        return 0 if cut_short else None  # pairs ran ok, none measured in full yet: no evidence for any answer
    for _, q in open_pairs(candidates, results, predicted_oom, unknown=rejected):
        p *= 1.0 - q
    # A pair that fit but was cut short on a step or two, and that no pair measured in full outranks, may be the
    # answer its one cold step hid: until it is measured in full (orchestration/remeasure.py), no 80 or above.
    # Likewise a pair that could be the answer (the leader, or one no pair measured in full outranks) whose whole
    # figure rests on a step or two: the score's 80 and above are earned by steps, never assumed.
    lead = leader_key(results)
    thin = [r for r in results.values() if (thinly_measured(r) or unsteady(r)) and (r.key == lead or not outranked_by_measured(r, results, breaks))]
    if capped and (cut_short or thin or open_neighbours(candidates, everything, predicted_oom)):
        p = min(p, UNMEASURED_CAP)
    return max(0, min(99, int(round(100 * p))))
