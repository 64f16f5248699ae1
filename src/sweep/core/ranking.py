"""The ranked sweep table and its recommendation (pure).

One row per candidate, ok rows ranked by median throughput. Speedup is against
the seed's step-2 answer: the feasible split=1 pair with the smallest accum
(the setting a user would reach without batch splitting).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sweep.core.growth import at_risk, late_oom_note, risk_note
from sweep.core.ordering import ordering_note
from sweep.core.schema import (
    CANCELLED,
    FAILED,
    INVALID,
    OK,
    OOM,
    PENDING,
    PREDICTED_OOM,
    REJECTED,
    RUNNING,
    SKIPPED,
    TIMEOUT,
    TrialResult,
)
from sweep.core.space import Candidate
from sweep.core.stats import stall_note
from sweep.core.steady import changed_pace

# trials.csv columns, in order; units are in the names. sweep.load() documents the dtypes.
TABLE_COLUMNS = [
    "sweep_id",
    "machine",
    "workload",
    "global_batch_size",
    "num_devices",
    "rank",
    "accum",
    "split",
    "per_device_batch",
    "joint_batch",
    "status",
    "oom_phase",
    "throughput_samples_per_s",
    "throughput_low_samples_per_s",
    "throughput_high_samples_per_s",
    "speedup",
    "peak_mem_gib",
    "wall_s",
    "steps_measured",
    "reason",
    "log",
    "job_id",
    # Added later, appended so older readers' column positions hold.
    "throughput_unit",
    "tight",
    "stopped_early",
    "headroom",
    "peak_reserved_gib",
    "capacity_gib",
    "measured_by",
    "stalls",  # issue 50: an ok pair's steps stall (core/stats.py stall_note) or change pace (core/steady.py); "" if neither
    # The drift check's (core/drift.py): the re-timing's own figure, and the figure rank and speedup rest on
    # (the geometric mean of both timings where the pair was re-timed, else the trial's own figure) with its interval.
    "retimed_throughput_samples_per_s",
    "ranked_throughput_samples_per_s",
    "ranked_throughput_low_samples_per_s",
    "ranked_throughput_high_samples_per_s",
]

# Row order below the ranked rows: what is still coming, then what failed and why.
_STATUS_ORDER = {
    OK: 0, RUNNING: 1, PENDING: 2, OOM: 3, PREDICTED_OOM: 4, TIMEOUT: 5, FAILED: 6, REJECTED: 6, CANCELLED: 7, SKIPPED: 8, INVALID: 9,
}


@dataclass(frozen=True)
class SweepMeta:
    """What every row of one sweep shares."""

    sweep_id: str
    machine: str
    workload: str
    global_batch_size: int
    num_devices: int
    # How throughput was read and what it counts (issue 12); the built-in workload: "" and samples/s.
    parser: str = ""  # workload.parser.type: a framework preset (nanogpt, ...), myrtle, regex or jsonl
    throughput_unit: str = "samples/s"  # samples/s or tokens/s, the same for every trial of the sweep
    splits_apply: bool = True  # False: a 1-D sweep (micro-batch x accumulation), no split to recommend
    flags_template: str = ""  # the recommendation in the workload's own flags, {placeholders}; "": Myrtle's


def baseline_key(results: Mapping[str, TrialResult]) -> str | None:
    """The seed's step-2 answer, the 1.00x reference: the split=1 ok pair with the smallest accum that is not
    tight, growing or retrying (core/growth.py: a pair the recommendation itself passes over as not fitting); when every split=1 ok
    pair is tight, the smallest accum among them, as the recommendation then takes a tight pair too."""
    base = [r for r in results.values() if r.status == OK and r.split == 1 and r.throughput]
    base = [r for r in base if not at_risk(r)] or base
    return min(base, key=lambda r: r.accum).key if base else None


def ranked_ok(results: Mapping[str, TrialResult]) -> list[TrialResult]:
    """Ok results, fastest first; ties broken towards less accumulation (less memory pressure later)."""
    ok = [r for r in results.values() if r.status == OK and r.throughput]
    return sorted(ok, key=lambda r: (-(r.throughput or 0.0), r.accum, r.split))


def recommendable(ranked: list[TrialResult]) -> list[TrialResult]:
    """The ok pairs (ranked_ok's order) the recommendation chooses among, fastest first: the roomy ones, or every
    one when all are tight (core/growth.at_risk: tight, still growing or retrying)."""
    return [r for r in ranked if not at_risk(r)] or list(ranked)


def confidence_view(results: Mapping[str, TrialResult]) -> Mapping[str, TrialResult]:
    """The results to score the recommendation on: when it skips a faster tight pair, a tight pair
    counts as not fitting (as an OOM without a phase: a bigger joint batch would be tighter still),
    so the confidence is about the pair recommended, not about the tight leader it passed over.
    A pair whose reserved peak was still growing or whose allocator retried (core/growth.py) counts as tight throughout."""
    ranked = ranked_ok(results)
    if not ranked or not at_risk(ranked[0]) or all(at_risk(r) for r in ranked):
        return results
    return {k: (replace(r, status=OOM, oom_phase=None) if r.status == OK and at_risk(r) else r) for k, r in results.items()}


def build_table(
    meta: SweepMeta,
    candidates: Sequence[Candidate],
    results: Mapping[str, TrialResult],
    running: Collection[str] = (),
    live_throughput: Mapping[str, float] | None = None,
    done: bool = False,
    judged: Mapping[str, TrialResult] | None = None,
    retimed: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per candidate, ranked rows first. live_throughput: what running trials' logs show so far.

    done: the search has ended, so a candidate never run is `skipped`, not `pending`. A pair the
    memory model kept from launching comes as a `predicted_oom` record (orchestration/racing.py).
    judged: the records the recommendation rests on (core/drift.pooled: a re-timed pair on both its timings); rank
    and speedup follow them, so the table ranks by the recommendation's judgement. retimed: {key: the drift
    check's figure}. The throughput columns keep each trial's own figure; the ranked_* columns hold the judged one.
    """
    judged = results if judged is None else {**results, **judged}
    ranks = {r.key: i + 1 for i, r in enumerate(ranked_ok(judged))}
    base = baseline_key(judged)
    base_tp = judged[base].throughput if base else None
    rows = []
    for cand in candidates:
        res = results.get(cand.key)
        row: dict[str, Any] = {col: None for col in TABLE_COLUMNS}
        row.update(
            sweep_id=meta.sweep_id,
            machine=meta.machine,
            workload=meta.workload,
            global_batch_size=meta.global_batch_size,
            num_devices=meta.num_devices,
            accum=cand.accum,
            split=cand.split,
            per_device_batch=cand.per_device_batch or None,
            joint_batch=cand.joint_batch or None,
            reason=cand.reason,
            log="",
            job_id="",
        )
        if not cand.valid:
            row["status"] = INVALID
        elif res is None:
            row["status"] = RUNNING if cand.key in running else SKIPPED if done else PENDING
            if row["status"] == SKIPPED:
                row["reason"] = "not run: the search ruled it out (OOM implied, or it cannot beat the leader)"
            if live_throughput and cand.key in live_throughput:
                row["throughput_samples_per_s"] = live_throughput[cand.key]
                # The workload reports it in the sweep's unit (SweepMeta.throughput_unit where the meta has one).
                row["throughput_unit"] = getattr(meta, "throughput_unit", None)
        else:
            row.update(
                status=res.status,
                oom_phase=res.oom_phase,
                # A rejected record's figure did not measure this pair (its error quotes it): not in the table.
                throughput_samples_per_s=None if res.status == REJECTED else res.throughput,
                throughput_low_samples_per_s=None if res.status == REJECTED else res.throughput_low,
                throughput_high_samples_per_s=None if res.status == REJECTED else res.throughput_high,
                peak_mem_gib=res.peak_mem_gib,
                wall_s=res.wall_s,
                steps_measured=_steps_measured(res),
                reason="; ".join(filter(None, (res.error, late_oom_note(res))))
                or "; ".join(filter(None, (risk_note(res), ordering_note(res, results))))
                or (f"stopped early: {res.stopped_early}" if res.stopped_early else ""),
                log=res.log,
                job_id=res.job_id,
                rank=ranks.get(cand.key),
                throughput_unit=res.throughput_unit,
                tight=at_risk(res),
                stopped_early=res.stopped_early,
                headroom=res.headroom,
                peak_reserved_gib=res.peak_reserved_gib,
                capacity_gib=res.capacity_gib,
                measured_by=measured_by(res),
                # Where the steps are not one steady pattern: stalls again and again, or a change of pace mid-trial.
                stalls="; ".join(filter(None, (stall_note(res.step_times_s), changed_pace(res.step_times_s)))) if res.status == OK else "",
            )
            if res.status == OK and res.throughput:
                ranked_on = judged.get(cand.key, res)
                row.update(
                    retimed_throughput_samples_per_s=(retimed or {}).get(cand.key),
                    ranked_throughput_samples_per_s=ranked_on.throughput,
                    ranked_throughput_low_samples_per_s=ranked_on.throughput_low,
                    ranked_throughput_high_samples_per_s=ranked_on.throughput_high,
                )
                # From the figures the rank rests on, the baseline's too: recommendation()'s speedup is computed so.
                if base_tp and ranked_on.throughput:
                    row["speedup"] = ranked_on.throughput / base_tp
        rows.append(row)
    rows.sort(key=lambda r: (_STATUS_ORDER[r["status"]], r["rank"] or 0, r["accum"], r["split"]))
    return rows


def measured_by(res: TrialResult) -> str:
    """What gave the figure: "probe: optimizer steps", "probe: backward passes" (a trainer with no torch.optim
    step), "log" (the log parser), or "" (no figure, or a record from before the field existed)."""
    if res.measured_by == "probe":
        return f"probe: {res.probe_signal}" if res.probe_signal else "probe"
    return res.measured_by


def table_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else _fmt(row[k])) for k in TABLE_COLUMNS})
    return buf.getvalue()


def _fmt(value: Any) -> Any:
    # Full precision (Python's shortest round-trip repr): every output rounds once, from the same value, at
    # its own display (core/table.py); a CSV rounded to 6 digits made summary.md's interval disagree with the terminal's.
    return repr(value) if isinstance(value, float) else value


def _steps_measured(res: TrialResult) -> int | None:
    """The timed steps an ok figure rests on, as its result.json says; None for a trial with no figure.

    A result from before steps_measured existed counts its step times. A failed trial's step times
    (the steps before it died) are no measurement, and its result.json says steps_measured: null.
    """
    if res.steps_measured is not None:
        return res.steps_measured
    return (len(res.step_times_s) or None) if res.status == OK else None
