"""GPU sweeps simulated step by step: today's policy against warm workers, measuring to the decision
and parallel screening (bench/bench_gpu.py and tests/test_bench_gpu.py).

A landscape here answers, per pair: its outcome (status, OOM phase, timed steps before a late
OOM), step time, step draws, peaks and tightness, and what a fresh trial process costs to start
(tests/support/landscapes_h100.py for the recorded H100 sweeps; `Simulated` wraps tests/support/landscapes.py's).

The simulation is event-driven: each running trial pays its start-up, the warm-up steps and then
timed steps one at a time; after each timed step the policy's stop rules are asked, with every
other running trial's progress as it stands (as the orchestrator's poll sees it), and the real
strategy (core/strategies.py, staircase with the memory model) fills each free slot. When it has
nothing left to run, a provisional pair that may be the answer runs again in full, as the
orchestrator's loop does (core/decision.provisional_contenders, orchestration/remeasure.py).

What the code does, as modelled: a warm worker (launch/warm_pool.py) serves one-rank trials only,
so the first trial on each device pays a fresh start-up and later ones WARM_START_S; a trial of
several ranks (an 8-GPU confirmation) is a fresh process per rank and pays a fresh start-up every
time; a cancelled trial (screening's cancel of an outranked trial) ends its worker, so that
device's next trial starts a fresh one. A trial that stops early (racing, the decision) or runs out
of memory leaves its worker warm (CUDA: freed and reset, then checked clean).

Assumed, not measured (stated in the bench's output):
* WARM_START_S: what a trial in a warm worker still pays before its first step: the model build,
  optimizer and synthetic data, the one-sample warm-up pass, re-arming the probe, the hand-off.
  The recordings time only each trial's whole start-up (an ok trial's wall minus its steps:
  11.8-16.3 s; an OOM at step 0: 13.8-15.1 s of wall), so its parts cannot be read from them.
  What they do show: start-up does not grow with the model (rnnt_base, 84.7M parameters: 15.1 s
  on average over 10 trials; rnnt_large, 195.6M: 13.9 s over 4), so the model build a worker
  still pays is a small part of it; built on this host's CPU, rnnt_base took 0.9 s and
  rnnt_large 1.2 s. 3 s is taken, and the bench prints what 1 s and 0 s would give;
* DDP_OVERHEAD: an N-rank trial's step is this much slower than one rank's at the same per-device
  batch (the gradient all-reduce), and its memory is the same (DDP's buckets are ignored).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from support.landscapes import Landscape
from sweep.core.config import RUN_TO_RUN_NOISE
from sweep.core.decision import PROVISIONAL_STEPS, Running, ahead_after_steps, cancel_reason, decision_stop, provisional_contenders
from sweep.core.measure import cannot_win, enough_measured, race_reason
from sweep.core.ranking import ranked_ok
from sweep.core.schema import CANCELLED, OK, OOM, TrialResult
from sweep.core.space import Candidate
from sweep.core.stats import throughput_summary
from sweep.core.strategies import Proposal, make_strategy

WARM_START_S = 3.0
DDP_OVERHEAD = 0.05
WARMUP_STEPS = 2
MEASURE_STEPS = 8  # trial.measure_steps
MAX_STEPS = 32  # trial.max_measure_steps
PRECISION = 0.02  # trial.target_precision
TIGHT_MARGIN = 0.05


class GpuLandscape(Protocol):
    name: str
    capacity_gib: float

    def valid(self) -> list[Candidate]: ...
    def step_time_s(self, c: Candidate) -> float: ...
    def outcome(self, c: Candidate) -> tuple[str, str | None, int | None]: ...
    def peaks(self, c: Candidate) -> tuple[float | None, float | None]: ...
    def tight(self, c: Candidate) -> bool: ...
    def draw_steps(self, c: Candidate, rng: random.Random, n: int) -> list[float]: ...
    def startup_s(self, rng: random.Random) -> float: ...


@dataclass
class Simulated:
    """tests/support/landscapes.py's Landscape as one rank's share: the same pairs on one device."""

    land: Landscape
    name: str = ""
    capacity_gib: float = 0.0

    def __post_init__(self) -> None:
        self.land = self.land.with_(global_batch_size=self.land.global_batch_size // self.land.num_devices, num_devices=1)
        self.name = self.name or self.land.name
        self.capacity_gib = self.land.budget_gib

    def valid(self) -> list[Candidate]:
        return self.land.valid()

    def step_time_s(self, c: Candidate) -> float:
        return self.land.step_time_s(c)

    def outcome(self, c: Candidate) -> tuple[str, str | None, int | None]:
        status, phase = self.land.outcome(c)
        return status, phase, 0 if status == OOM else None

    def peaks(self, c: Candidate) -> tuple[float | None, float | None]:
        encoder, joint = self.land.peaks(c)
        status, phase = self.land.outcome(c)
        peak = joint if status != OOM else min(self.capacity_gib, encoder if phase != "encoder" else self.land.base_gib)
        return peak, peak

    def tight(self, c: Candidate) -> bool:
        return self.land.peaks(c)[1] > self.capacity_gib * (1 - TIGHT_MARGIN)

    def draw_steps(self, c: Candidate, rng: random.Random, n: int) -> list[float]:
        offset = math.exp(rng.gauss(0.0, self.land.trial_noise))
        out = []
        for _ in range(n):
            t = self.land.step_time_s(c) * offset * math.exp(rng.gauss(0.0, self.land.step_noise))
            if rng.random() < self.land.outlier_rate:
                t *= rng.uniform(1.3, 2.0)
            out.append(t)
        return out

    def startup_s(self, rng: random.Random) -> float:
        return rng.uniform(11.8, 16.3)  # the recorded H100 start-ups' range


@dataclass(frozen=True)
class Policy:
    name: str
    warm: bool = False  # warm workers: start-up paid once per device
    to_decision: bool = False  # core/decision.py; else racing against the finished leader
    screen: bool = False  # on a multi-device host: one-rank screening, then full confirmations
    # workload.stress_step (step index, warm-up included; 0: none): the built-in RNN-T repeats its worst
    # batch there, and a trial that reaches it is assumed to meet there the late OOM the recording met
    # at that step or later. The decision stops a pair for being ahead only past it (ahead_after_steps).
    stress_step: int = 0
    ahead_past_stress: bool = True  # False: the rule before it, a pair may stop for being ahead after FIT_KNOWN_STEPS
    cancel_outranked: bool = False  # screening: a trial the ordering rules out before its first timed step is cancelled
    # machine.run_to_run_noise as the decision is told it (core/decision.py's rule 4, tied pairs); 0: the rule before it
    run_to_run_noise: float = 0.0
    # the search's first pair stops provisionally (core/decision.py's rule 0) and is run again in full if it may be
    # the answer (orchestration/remeasure.py); never in confirmations (screen: racing.plan_stop_steps)
    provisional: bool = False
    nominates_only: bool = False  # a screening phase's trials: never the answer, so never run again in full


OLD = Policy("today: fresh process per trial, adaptive to the cap, racing, one trial at a time")
DECISION = Policy("measure to the decision", to_decision=True)
STRESS_STEP = WARMUP_STEPS + MEASURE_STEPS - 1  # the rnnt workload's default: the last step of the shortest trial
STRESS_EARLY = Policy(
    "measure to the decision + stress step, ahead once separated", to_decision=True, stress_step=STRESS_STEP, ahead_past_stress=False
)
STRESS = Policy("measure to the decision + stress step, ahead past it", to_decision=True, stress_step=STRESS_STEP)
WARM_ONLY = Policy("+ warm workers", warm=True, to_decision=True, stress_step=STRESS_STEP)
# machine.run_to_run_noise on cuda unset, as the orchestrator hands it to the decision (core/config.run_to_run_noise)
CUDA_NOISE = RUN_TO_RUN_NOISE["cuda"]
TIED = Policy(
    f"+ tied pairs stop past the stress step (run-to-run noise {CUDA_NOISE:.0%})", warm=True, to_decision=True, stress_step=STRESS_STEP,
    run_to_run_noise=CUDA_NOISE,
)
WARM = replace(TIED, name="+ first pair provisional, run again in full if it may be the answer", provisional=True)
NEW = replace(WARM, name="+ screening (N one-rank trials at once, then full confirmations)", screen=True)


@dataclass
class Phase:
    results: dict[str, TrialResult]
    wall_s: float
    gpu_s: float
    provisional: list[TrialResult] = field(default_factory=list)  # provisional records a full re-run replaced


@dataclass
class Outcome:
    gpu_s: float
    wall_s: float
    pick: str | None
    trials: int
    screening: dict[str, TrialResult] = field(default_factory=dict)


class _Confirm:
    """The confirmations: core/screening.confirm_candidates, one full trial at a time."""

    def __init__(self, screening: Mapping[str, TrialResult]) -> None:
        self.screening = screening

    def propose(self, finished: Mapping[str, TrialResult], in_flight: Any) -> Proposal:
        from sweep.core.screening import confirm_candidates

        confirm = confirm_candidates(self.screening, finished)
        left = [Candidate(r.accum, r.split, r.per_device_batch, r.joint_batch, True) for r in confirm]
        left = [c for c in left if c.key not in in_flight]
        return Proposal(left, done=not left and not in_flight)


@dataclass
class _Trial:
    cand: Candidate
    started: float
    events: list[float]  # completion time of each timed step
    oom_at: float | None  # when it runs out of memory, if it does before the cap
    ranks: int
    times: list[float]
    done: int = 0


def pick_of(results: Mapping[str, TrialResult]) -> str | None:
    """What the sweep recommends: the fastest ok pair that is not tight."""
    return next((r.key for r in ranked_ok(results) if not r.tight), None)


def run_phase(
    land: GpuLandscape, strategy: Any, policy: Policy, rng: random.Random, *, slots: int, ranks: int, gbs: int, first_start: float = 0.0,
    max_steps: int = MAX_STEPS,
) -> Phase:
    """Run `strategy`'s proposals on `slots` device groups of `ranks` devices; max_steps: the trials' cap."""
    scale = 1.0 + (DDP_OVERHEAD if ranks > 1 else 0.0)
    finished: dict[str, TrialResult] = {}
    running: dict[str, _Trial] = {}
    free_slots = list(range(slots))
    warm_slots: set[int] = set()
    slot_of: dict[str, int] = {}
    now, gpu_s = first_start, 0.0
    queue: list[tuple[float, int, str]] = []
    seq = 0
    # Provisional pairs run again in full (orchestration/remeasure.run_in_full): those still to launch, and every
    # one so far (never stopped provisionally again); the provisional records their re-runs replaced.
    rerun: dict[str, Candidate] = {}
    in_full: set[str] = set()
    replaced: list[TrialResult] = []
    while True:
        prop = strategy.propose(dict(finished), frozenset(running))
        for c in [*rerun.values(), *prop.candidates]:
            if not free_slots:
                break
            if c.key in running:
                continue
            rerun.pop(c.key, None)
            slot = free_slots.pop(0)
            # A worker serves one-rank trials only (launch/warm_pool.py): a trial of several ranks is a fresh process per rank.
            start = WARM_START_S if policy.warm and ranks == 1 and slot in warm_slots else land.startup_s(rng)
            warm_slots.add(slot)
            status, _, oom_step = land.outcome(c)
            stress_timed = policy.stress_step - WARMUP_STEPS  # the stress step's 0-based timed index
            if status == OOM and oom_step is not None and policy.stress_step and 0 <= stress_timed < oom_step:
                oom_step = stress_timed  # a late OOM is met at the worst batch's repeat, if not earlier
            t0 = now + start
            warm = [t * scale for t in land.draw_steps(c, rng, WARMUP_STEPS)]
            times = [t * scale for t in land.draw_steps(c, rng, max_steps)]
            ends, t = [], t0 + sum(warm)
            for x in times:
                t += x
                ends.append(t)
            oom_at = None
            if status == OOM and (oom_step or 0) < max_steps:
                oom_at = t0 + warm[0] if not oom_step else ends[oom_step]  # during warm-up, or during step oom_step + 1
            running[c.key] = _Trial(c, now, ends, oom_at, ranks, times)
            slot_of[c.key] = slot
            seq += 1
            heapq.heappush(queue, (oom_at if oom_at is not None and oom_at <= ends[0] else ends[0], seq, c.key))
        if not running:
            # As the orchestrator's loop: with nothing left to run, a provisional pair that may be the answer runs again.
            again = [k for k in provisional_contenders(finished) if k not in in_full] if policy.provisional and not policy.nominates_only else []
            if not again:
                return Phase(finished, now, gpu_s, replaced)
            for k in again:
                r = finished[k]
                in_full.add(k)
                rerun[k] = Candidate(r.accum, r.split, r.per_device_batch, r.joint_batch, True)
            continue
        at, _, key = heapq.heappop(queue)
        if key not in running:
            continue  # cancelled: its next step never comes
        now = at
        tr = running[key]
        result: TrialResult | None = None
        if tr.oom_at is not None and now >= tr.oom_at:
            result = _result(land, tr, gbs, OOM, [], "")
        else:
            tr.done += 1
            steps = tr.times[: tr.done]
            reason = _stop(key, running, finished, gbs, policy, steps, max_steps, provisional=key not in in_full)
            if reason is not None:  # stopped before a late OOM to come is recorded ok: what the sweep would see
                result = _result(land, tr, gbs, OK, steps, reason)
            else:
                nxt = tr.events[tr.done]
                seq += 1
                heapq.heappush(queue, (tr.oom_at if tr.oom_at is not None and tr.oom_at <= nxt else nxt, seq, key))
        done = [(key, result)] if result is not None else []
        if result is not None and result.status == OK and policy.cancel_outranked:
            landed = {**finished, key: result}
            for other, t in running.items():
                why = cancel_reason(t.cand, landed) if other != key and t.done == 0 else None
                if why:
                    done.append((other, TrialResult(**t.cand.numbers(gbs, t.ranks), status=CANCELLED, error=why)))
        for k, res in done:
            t = running.pop(k)
            res.wall_s = now - t.started
            gpu_s += res.wall_s * t.ranks
            if k in finished:
                replaced.append(finished[k])
            finished[k] = res
            slot = slot_of.pop(k)
            if res.status == CANCELLED:
                warm_slots.discard(slot)  # cancelling a trial ends its worker: the slot's next trial starts a fresh one
            free_slots.append(slot)


def _stop(
    key: str, running: Mapping[str, _Trial], finished: Mapping[str, TrialResult], gbs: int, policy: Policy, steps: list[float], max_steps: int,
    provisional: bool,
) -> str | None:
    """None: time another step; "": the trial's own rule ended it; else why it stopped early.

    As orchestration/racing.plan_stop_steps: a screening row meets the stress step like a full trial, and the
    search's first pair stops provisionally except in confirmations (policy.screen) and in a re-run in full."""
    if enough_measured(steps, target_precision=PRECISION, min_steps=min(MEASURE_STEPS, max_steps), max_steps=max_steps):
        return ""
    if policy.to_decision:
        view = {k: Running(t.cand, t.times[: t.done]) for k, t in running.items()}
        ahead = ahead_after_steps(policy.stress_step if policy.ahead_past_stress else 0, WARMUP_STEPS)
        first = PROVISIONAL_STEPS if policy.provisional and provisional and not policy.screen else 0
        return decision_stop(
            key, view, finished, gbs, first_pair_steps=MEASURE_STEPS, ahead_steps=ahead, run_to_run_noise=policy.run_to_run_noise,
            provisional_steps=first, max_steps=max_steps,
        )
    lead = next((r for r in ranked_ok(finished) if r.step_times_s and not r.tight), None)
    if lead is None:
        return None
    _, low, high = throughput_summary(steps, gbs)
    lead_iv = (float(lead.throughput_low or 0.0), float(lead.throughput_high or 0.0))
    if cannot_win((low, high), lead_iv, candidate_steps=len(steps), leader_steps=len(lead.step_times_s)):
        return race_reason((low, high), lead_iv, lead.key)
    return None


def _result(land: GpuLandscape, tr: _Trial, gbs: int, status: str, steps: list[float], stopped: str) -> TrialResult:
    c = tr.cand
    used, reserved = land.peaks(c)
    res = TrialResult(
        accum=c.accum, split=c.split, per_device_batch=c.per_device_batch, joint_batch=c.joint_batch, global_batch_size=gbs,
        num_devices=tr.ranks, status=status, oom_phase=land.outcome(c)[1] if status == OOM else None,
        peak_mem_gib=used, peak_reserved_gib=reserved if reserved is not None and math.isfinite(reserved) else None,
        tight=status == OK and land.tight(c), stopped_early=stopped if status == OK else "",
    )
    if status == OK:
        res.step_times_s = list(steps)
        res.throughput, res.throughput_low, res.throughput_high = throughput_summary(steps, gbs)
    return res


def one_device_phase(land: GpuLandscape, policy: Policy, seed: int) -> Phase:
    """One device's sweep: every trial it ran, as it ended."""
    rng = random.Random(f"{land.name}/{seed}")
    strategy = make_strategy("staircase", land.valid(), capacity_gib=land.capacity_gib)
    return run_phase(land, strategy, policy, rng, slots=1, ranks=1, gbs=128)


def one_device(land: GpuLandscape, policy: Policy, seed: int) -> Outcome:
    phase = one_device_phase(land, policy, seed)
    return Outcome(phase.gpu_s, phase.wall_s, pick_of(phase.results), len(phase.results))


def eight_gpu_host(land: GpuLandscape, policy: Policy, seed: int, devices: int = 8) -> Outcome:
    """machine.num_devices=devices on one host: global batch 128 * devices, the same per-device pairs."""
    rng = random.Random(f"{land.name}/{seed}/host")
    strategy = make_strategy("staircase", land.valid(), capacity_gib=land.capacity_gib)
    gbs = 128 * devices
    if not policy.screen:
        phase = run_phase(land, strategy, policy, rng, slots=1, ranks=devices, gbs=gbs)
        return Outcome(phase.gpu_s, phase.wall_s, pick_of(phase.results), len(phase.results))
    # Screening is coarse (at most trial.measure_steps): what it cannot separate, a full trial confirms. A sweep of
    # its own (orchestration/screening.screening_plan: screen off, its rows only nominate).
    sub = replace(policy, cancel_outranked=True, nominates_only=True, screen=False)
    strategy = make_strategy("staircase", land.valid(), capacity_gib=land.capacity_gib, spare_retry=True)
    screen = run_phase(land, strategy, sub, rng, slots=devices, ranks=1, gbs=128, max_steps=MEASURE_STEPS)
    # The pairs inside the leader's noise; when none of them ends roomy and ok, the next screened pairs.
    confirm = _Confirm(screen.results)
    full = run_phase(land, confirm, policy, rng, slots=1, ranks=devices, gbs=gbs, first_start=screen.wall_s)
    return Outcome(screen.gpu_s + full.gpu_s, full.wall_s, pick_of(full.results), len(screen.results) + len(full.results), screen.results)


def grid_answer(land: GpuLandscape, seed: int) -> tuple[str | None, dict[str, float], float]:
    """Every pair as a full trial (warm-up, then the cap): (the recommendation, ok medians, the pick's low bound)."""
    rng = random.Random(f"grid/{land.name}/{seed}")
    medians, lows, tight = {}, {}, set()
    for c in land.valid():
        status, _, oom_step = land.outcome(c)
        if status == OOM and (oom_step or 0) < MAX_STEPS:
            continue
        if status != OK and status != OOM:
            continue
        mid, low, _ = throughput_summary(land.draw_steps(c, rng, MAX_STEPS), 128)
        medians[c.key], lows[c.key] = mid, low
        if land.tight(c):
            tight.add(c.key)
    roomy = [k for k in medians if k not in tight]
    if not roomy:
        return None, medians, 0.0
    best = max(roomy, key=medians.__getitem__)
    return best, medians, lows[best]


def same_answer(pick: str | None, grid: tuple[str | None, dict[str, float], float]) -> bool:
    best, medians, low = grid
    return pick == best or (pick is not None and medians.get(pick, 0.0) >= low > 0)


def trace(land: GpuLandscape, policy: Policy, seed: int, devices: int = 1) -> list[str]:
    """One sweep's trials, in the order they ended: what a reader checks a policy against."""
    rng = random.Random(f"{land.name}/{seed}")
    strategy = make_strategy("staircase", land.valid(), capacity_gib=land.capacity_gib)
    phase = run_phase(land, strategy, policy, rng, slots=devices, ranks=1, gbs=128)
    return [
        f"{r.key:16} {r.status:3} {len(r.step_times_s):>3} steps {r.wall_s or 0.0:>6.1f} s {r.throughput or 0.0:>7.1f}/s  {r.stopped_early}"
        for r in phase.results.values()
    ]
