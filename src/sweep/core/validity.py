"""A figure counts only when it measured what was asked (pure): the checks an ok record must pass.

A trial's figure is filed under its pair, and the search, the ranking and the confidence score take it
as that pair's. Before it counts, its provenance (what the probe saw while it was measured, written on
the record by the workload) must show that it measured that pair:

- the batch it trained: an out-of-memory error the probe recorded means the pair does not fit at the
  configured batch, whatever the trainer did next (HF's `auto_find_batch_size` and accelerate's
  `find_executable_batch_size` catch it and go on at half the batch, then exit 0): the trial is `oom`,
  with the module and the message;
- the ranks that trained it: the ranks' own world size, and the ranks the probe recorded steps from (on
  every node), equal machine.num_devices; a command that starts twice the ranks trains twice the global
  batch a step;
- the accumulation: where the probe counted backward passes, each optimizer step holds a whole multiple
  of `accum` of them (a GAN's two losses make two per micro-batch); one per step where accum=4 was asked
  means the command did not accumulate as asked. Where no torch.optim optimizer exists, the backward passes
  between the parameter updates the probe saw (a watched parameter's values changed) are checked the same way;
- the steady state: the probe's steps the figure rests on are not still speeding up (core/steady.py);
- agreement: where the probe gave the figure (on MIN_INTERVAL_STEPS steps or more) and the log gave one
  too, the two agree within LOG_AGREEMENT; a per-micro-batch or per-rank log figure is off by the
  accumulation or the ranks.

A record that fails a check becomes `rejected` with every failed check in its error: not a measurement,
so it is never the answer, it prunes nothing (only `oom` does), and the confidence score counts the pair
as untried. The checks are idempotent, so the trial runs them before it writes its record and the
orchestrator again on every record it reads (a record written before these checks existed included).
"""

from __future__ import annotations

import math

from sweep.core.measure import MIN_INTERVAL_STEPS
from sweep.core.probe_report import oom_phase_of
from sweep.core.schema import OK, OOM, REJECTED, OomPhase, TrialResult
from sweep.core.steady import still_warming

# Log and probe figures further apart than this factor disagree. The two clocks differ in what they count
# (data loading, logging) and over which steps (the preset's own warm-up against the probe's): the real
# frameworks' figures agreed within 1-3% of the probe's on a quiet box (tests/test_frameworks_real.py), and a
# full suite's load moved Lightning's apart by more than 25% once; a wrong unit is off by the accumulation
# or the ranks, 2x or more.
LOG_AGREEMENT = 1.5


def caught_oom(result: TrialResult) -> bool:
    """An ok record whose probe saw an out-of-memory error: the trainer caught it and carried on."""
    return result.status == OK and bool(result.probe_oom)


def rank_problem(result: TrialResult) -> str:
    """Why the ranks that stepped are not the devices asked for, or ""."""
    asked = result.num_devices
    if result.world_size is not None and result.world_size != asked:
        return (
            f"the ranks' world size was {result.world_size} where machine.num_devices={asked}: each step trained "
            f"{result.world_size / asked:g}x the global batch; the command must start {asked} rank(s) in all, over every node"
        )
    if result.ranks_seen is not None and result.ranks_seen != asked:
        return (
            f"the probe recorded steps from {result.ranks_seen} rank(s) where machine.num_devices={asked}: "
            f"the figure does not rest on every rank"
        )
    return ""


def accumulation_problem(result: TrialResult) -> str:
    """Why the backward passes per optimizer step (or, with no torch.optim step, between the parameter updates the
    probe saw) do not match the accumulation asked for, or ""."""
    per_step, between = result.backward_per_step, "per optimizer step"
    if per_step is None:
        per_step, between = result.backward_per_update, "between the parameter updates it saw (no torch.optim step)"
        # The figure itself counts `accum` backward passes a step (probe_report.backward_step_times), so the passes
        # between updates must be exactly accum: two passes per micro-batch (a SAM- or GAN-style loop) would make
        # every step look twice as fast, and a trainer that updates after every pass trains accum times the batch.
        if per_step is not None and per_step > 0 and abs(per_step - result.accum) >= 0.05:
            return (
                f"the probe saw {per_step:g} backward pass(es) {between} where accum={result.accum} was asked: the "
                f"command does not accumulate as asked (check the argv's {{accum}}), or runs more than one backward "
                f"pass per micro-batch, so a step of {result.accum} passes is not its step"
            )
        return ""
    if per_step <= 0 or result.accum <= 1:
        return ""
    # Counted optimizer steps time whole steps, however many backward passes each takes (the built-in RNN-T runs
    # one per joint chunk): a whole multiple of accum is a trainer that splits its micro-batch, not a wrong figure.
    whole = round(per_step)
    if abs(per_step - whole) < 0.05 and whole % result.accum == 0:
        return ""
    return (
        f"the probe saw {per_step:g} backward pass(es) {between} where accum={result.accum} was asked: "
        f"the command does not accumulate as asked (check the argv's {{accum}})"
    )


def agreement_problem(result: TrialResult) -> str:
    """Why the log's figure contradicts the probe's, or "". The log's figure is over every step it printed, so it is
    compared with the probe's over every timed step: where a box got quieter part-way, the leading slow steps
    core/steady.py leaves out of the probe's figure are in the log's (a busy suite once put those 1.77x apart)."""
    log, probe = result.log_throughput, result.untrimmed_throughput or result.throughput
    if result.measured_by != "probe" or not log or not probe or not (math.isfinite(log) and log > 0):
        return ""
    if len(result.step_times_s) < MIN_INTERVAL_STEPS:
        return ""  # a step or two (a pair the ordering ruled out at once) may sit beside a log figure of another step
    ratio = log / probe
    if 1.0 / LOG_AGREEMENT <= ratio <= LOG_AGREEMENT:
        return ""
    return (
        f"the log's figure {log:.4g} {result.throughput_unit} is {ratio:.3g}x the probe's {probe:.4g}: one of them did "
        f"not time a step of the global batch (a per-micro-batch or per-rank log figure?)"
    )


def validated(result: TrialResult) -> TrialResult:
    """The record with its figure checked, in place: an ok record that fails a check becomes oom (a caught
    OOM) or rejected (every other check), its error naming what was seen. Other statuses pass as they are."""
    if result.status != OK:
        return result
    if caught_oom(result):
        result.status = OOM
        if result.oom_phase is None:
            phase = oom_phase_of(result.oom_module)
            result.oom_phase = OomPhase(phase) if phase else None
        result.error = (
            f"out of memory at the configured batch, caught by the trainer, which carried on (probe: {result.probe_oom}); "
            f"its figure was not of this pair"
        )
        result.stopped_early = ""
        return result
    # Only the probe's steps are trimmed of a fading warm-up (core/steady.py): a log's figures are the preset's. And
    # only a trial that ran to its own end: one the sweep cut short (provisionally, or because it cannot win) kept
    # the figure the sweep decided on, and a cut-short pair is scored as untried anyway (core/confidence.py).
    warming = still_warming(result.step_times_s) if result.measured_by == "probe" and not result.stopped_early else ""
    problems = [p for p in (rank_problem(result), accumulation_problem(result), agreement_problem(result), warming) if p]
    if problems:
        figure = f" (its figure, {result.throughput:.4g} {result.throughput_unit}, is not counted)" if result.throughput else ""
        result.status = REJECTED
        result.error = "; ".join(problems) + figure
    return result
