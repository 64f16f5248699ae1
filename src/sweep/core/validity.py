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
  means the command did not accumulate as asked, unless the root modules ran a whole multiple of `accum`
  forward passes a step: a loop that averages its micro-batches' losses and runs one backward pass is judged by
  its updates, one optimizer step per `accum` micro-batches. Where no torch.optim optimizer exists, the backward
  passes between the parameter updates the probe saw (a watched parameter's values changed) are checked the same way;
- the accumulation across pairs (validated_across_pairs, over the sweep's records as they land): passes a step
  that do not grow with `accum` mean the command does not accumulate, whatever their count at one pair (a GAN's
  two losses without accumulation make 2 passes at accum=2 as one loss accumulating would); its pairs with
  accum > 1 are rejected, earlier records included;
- the steady state: the probe's steps the figure rests on are not still speeding up (core/steady.py). Steps that
  change pace mid-trial (core/steady.changed_pace) are not rejected: a busy box does that to right figures; the
  score holds such a pair below 80 instead (core/confidence.py unsteady);
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
from collections.abc import Mapping

import numpy as np

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
    if _whole_multiple(per_step, result.accum):
        return ""
    # One backward pass of a loss averaged over `accum` micro-batches: judged by its updates, one optimizer step per
    # `accum` forward passes of the model (the probe counts the root modules' forwards with gradients on).
    forwards = result.forward_per_step
    if forwards is not None and forwards >= result.accum and _whole_multiple(forwards, result.accum):
        return ""
    seen = "" if forwards is None else f" (and {forwards:g} forward pass(es) of the model a step)"
    return (
        f"the probe saw {per_step:g} backward pass(es) {between} where accum={result.accum} was asked{seen}: "
        f"the command does not accumulate as asked (check the argv's {{accum}})"
    )


def _whole_multiple(count: float, accum: int) -> bool:
    whole = round(count)
    return whole > 0 and abs(count - whole) < 0.05 and whole % accum == 0


# ---------------------------------------------------------------- the accumulation across pairs


def _passes_by_accum(results: list[TrialResult], forwards: bool) -> dict[int, float]:
    """{accum: median count a step} over the records that counted them (ok or rejected: a rejected pair's count is
    evidence too)."""
    counts: dict[int, list[float]] = {}
    for r in results:
        count = r.forward_per_step if forwards else (r.backward_per_step if r.backward_per_step is not None else r.backward_per_update)
        if r.status in (OK, REJECTED) and count is not None and count > 0:
            counts.setdefault(r.accum, []).append(float(count))
    return {accum: float(np.median(c)) for accum, c in sorted(counts.items())}


def _grows(by_accum: dict[int, float]) -> bool | None:
    """Whether the count grows with accum at every pair of accumulations measured; None: fewer than two measured."""
    if len(by_accum) < 2:
        return None
    counts = [by_accum[a] for a in sorted(by_accum)]
    return all(later > earlier for earlier, later in zip(counts, counts[1:]))


def accumulation_across_pairs(results: Mapping[str, TrialResult]) -> dict[str, str]:
    """{key: why} for the ok records with accum > 1 that the sweep's other pairs contradict: where the backward passes
    a step (or between updates) do not grow with accum, and neither do the model's forward passes where counted,
    the command does not accumulate, and a count that matched accum at one pair did so by coincidence."""
    records = list(results.values())
    backward, forward = _passes_by_accum(records, False), _passes_by_accum(records, True)
    if _grows(backward) is not False or _grows(forward):
        return {}  # too few accumulations measured to tell, or one count grows as accumulating does
    seen = ", ".join(f"accum={a}: {c:g}" for a, c in backward.items())
    if forward:
        seen += "; forward passes of the model " + ", ".join(f"accum={a}: {c:g}" for a, c in forward.items())
    why = (f"the backward passes a step do not grow with accum across the sweep's pairs ({seen}): the command does not "
           f"accumulate as asked, so this pair's count matched accum only by coincidence (two losses a micro-batch?)")
    return {key: why for key, r in results.items() if r.status == OK and r.accum > 1}


def validated_across_pairs(results: Mapping[str, TrialResult]) -> list[str]:
    """Reject, in place, the ok records accumulation_across_pairs contradicts (records that landed earlier included);
    the keys rejected now. Idempotent: run it whenever a record lands."""
    rejected = []
    for key, why in accumulation_across_pairs(results).items():
        r = results[key]
        figure = f" (its figure, {r.throughput:.4g} {r.throughput_unit}, is not counted)" if r.throughput else ""
        r.status, r.error = REJECTED, why + figure
        rejected.append(key)
    return rejected


def agreement_problem(result: TrialResult) -> str:
    """Why the log's figure contradicts the probe's, or "". Like is compared with like: the log's figure (a median of
    per-step rates, each perhaps a mean over the steps before it or a running mean from the first step, or one average)
    with the probe's steps under each of those statistics (_like_figures), never one median against one mean: on a busy
    box a heavy tail of slow steps puts a log's average and the probe's median 2x apart with both right. Only a gap a
    wrong unit explains rejects (the log counted micro-batches or one rank: a multiple of accum or of the ranks, beyond
    LOG_AGREEMENT of every like figure); any other gap keeps the probe's figure and is noted (agreement_note)."""
    log, probe = result.log_throughput, result.throughput
    if result.measured_by != "probe" or not log or not probe or not (math.isfinite(log) and log > 0):
        return ""
    if len(result.step_times_s) < MIN_INTERVAL_STEPS:
        return ""  # a step or two (a pair the ordering ruled out at once) may sit beside a log figure of another step
    likes = _like_figures(result)
    if any(1.0 / LOG_AGREEMENT <= log / like <= LOG_AGREEMENT for like in likes):
        return ""
    explained = _unit_explaining(log, likes, result.accum, result.num_devices)
    if explained is None:
        return ""
    unit, like = explained
    return (
        f"the log's figure {log:.4g} {result.throughput_unit} is {log / like:.3g}x the probe's {like:.4g} over the same "
        f"steps, {unit}: one of them did not time a step of the global batch (a per-micro-batch or per-rank log figure?)"
    )


def agreement_note(result: TrialResult) -> str:
    """One line where the log's figure and the probe's disagree beyond LOG_AGREEMENT with no unit to explain it (the
    figure stays the probe's), or ""."""
    log = result.log_throughput
    if agreement_problem(result) or result.measured_by != "probe" or not log or not result.throughput:
        return ""
    if not math.isfinite(log) or log <= 0 or len(result.step_times_s) < MIN_INTERVAL_STEPS:
        return ""
    likes = _like_figures(result)
    if any(1.0 / LOG_AGREEMENT <= log / like <= LOG_AGREEMENT for like in likes):
        return ""
    nearest = min(likes, key=lambda like: abs(math.log(log / like)))
    return (
        f"note: the log's figure {log:.4g} {result.throughput_unit} is {log / nearest:.3g}x the nearest of the probe's "
        f"over the same steps ({nearest:.4g}), a gap no unit (accum={result.accum}, {result.num_devices} rank(s)) "
        f"explains: the probe's figure is kept"
    )


# A wrong unit puts the log's figure at a multiple of accum or of the ranks of a right one: within this factor of it it is
# that unit's. The busy box put Lightning's right figure at 0.42x the probe's median where accum=2 (1.19x off
# 0.5), so the tolerance stays under that; the like-for-like figures bring such a figure back near 1 anyway.
UNIT_TOLERANCE = 1.15


def _like_figures(result: TrialResult) -> list[float]:
    """The probe's figure over its steps by each statistic a log prints: the median step's rate, the mean rate over the
    whole run, the median over the run of means over the last w steps (w = 2, 4, ... : a smoothed bar's rate, a
    log-every-w window), and the median and last of the running means from the first step (the leading steps still
    warming up included where the record says how slow they were); the probe's own figures as well."""
    times = [float(t) for t in result.step_times_s if t > 0]
    probe, untrimmed = float(result.throughput or 0.0), result.untrimmed_throughput
    likes = [probe] + ([float(untrimmed)] if untrimmed and untrimmed > 0 else [])
    if not times:
        return likes
    # Samples a step in the figure's unit: the global batch for samples/s; for tokens/s the tokens a step are not on
    # the record, so both readings of the probe's figure (its median step's rate, its mean rate) scale the steps.
    if result.throughput_unit == "samples/s":
        scales = [float(result.global_batch_size)]
    else:
        scales = [probe * sorted(times)[len(times) // 2], probe * sum(times) / len(times)]
    runs = [times]
    if result.transient_steps and untrimmed and untrimmed > 0:
        # The steps left out as still warming up, as slow as the untrimmed figure says they were in all (read as a mean).
        left_out = scales[0] * (len(times) + result.transient_steps) / float(untrimmed) - sum(times)
        if left_out > 0:
            runs.append([left_out / result.transient_steps] * result.transient_steps + times)
    for scale in scales:
        for run in runs:
            likes += _statistics(run, scale)
    return likes


def _statistics(times: list[float], scale: float) -> list[float]:
    """The rates (scale per step) of _like_figures over one run of step times."""
    from statistics import median

    n, ends = len(times), [0.0]
    for t in times:
        ends.append(ends[-1] + t)
    figures = [scale / median(times), scale * n / ends[-1]]
    width = 2
    while width < n:
        figures.append(median(scale * width / (ends[i] - ends[i - width]) for i in range(width, n + 1)))
        width *= 2
    running = [scale * i / ends[i] for i in range(1, n + 1)]
    figures += [median(running), running[-1]]
    return figures


def _unit_explaining(log: float, likes: list[float], accum: int, num_devices: int) -> tuple[str, float] | None:
    """(the unit, the like figure) where log / like is a multiple of accum or of the ranks (or their product, or the
    inverse of any) within UNIT_TOLERANCE, the nearest; None where none is."""
    units: dict[float, str] = {}
    for a, a_name in ((1, ""), (accum, "accum"), (1.0 / accum, "1/accum")):
        for d, d_name in ((1, ""), (num_devices, "the ranks"), (1.0 / num_devices, "1/the ranks")):
            factor = a * d
            if abs(math.log(factor)) > math.log(LOG_AGREEMENT):  # a unit inside the noise explains nothing
                units.setdefault(factor, " x ".join(name for name in (a_name, d_name) if name))
    best: tuple[float, str, float] | None = None
    for factor, name in units.items():
        for like in likes:
            off = abs(math.log(log / (like * factor)))
            if off <= math.log(UNIT_TOLERANCE) and (best is None or off < best[0]):
                best = (off, f"{factor:.3g}x is {name} (accum={accum}, {num_devices} rank(s))", like)
    return None if best is None else (best[1], best[2])


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
