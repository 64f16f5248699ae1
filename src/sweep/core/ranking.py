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


def cli_flags(accum: int, split: int) -> str:
    """What users paste into the Myrtle.ai training command."""
    return f"--grad_accumulation_batches={accum} --batch_split_factor={split}"


@dataclass(frozen=True)
class Recommendation:
    """The answer and everything needed to use it: recommendation() builds it, the orchestrator adds the drift check's
    and the busy host's words (dataclasses.replace), recommendation.yaml is its to_record(), and the report reads
    that file back with from_record(). Field names are recommendation.yaml's keys."""

    accum: int  # grad_accumulation_batches
    split: int  # batch_split_factor (1 in a 1-D sweep)
    per_device_batch: int  # samples per device per optimizer step's micro-batch: global_batch_size / (accum * num_devices)
    joint_batch: int | None  # per_device_batch / split: what one forward pass takes (None: a file that does not say)
    global_batch_size: int  # the fixed global batch the sweep ran at
    num_devices: int  # devices one trial trains on
    machine: str  # machine.name the sweep ran on
    throughput_samples_per_s: float | None  # the figure the pair is ranked on, 3 decimals, in throughput_unit (the key predates units)
    throughput_interval_samples_per_s: tuple[float, float] | None  # its 95% interval, 3 decimals
    speedup: float | None  # against the baseline, 4 decimals; None: no baseline ran ok
    baseline_accum: int | None  # the 1.00x reference (baseline_key): accum of the split=1 pair; None: none ran ok
    confidence: int | None  # 0-100 that the pair is the fastest (core/confidence.py); None: not scored
    run_to_run_noise: float | None  # the machine's run-to-run noise, as the confidence score assumed it
    flags: str  # the pair in the training command's own flags (recommended_flags); "": a file from before flags
    throughput_unit: str  # samples/s or tokens/s
    splits_apply: bool  # False: a 1-D sweep (micro-batch x accumulation), no split to recommend
    tight: bool  # its headroom is below trial.memory_margin, or its peak grew or the allocator retried (core/growth.py)
    headroom: float | None  # fraction of the device's memory left at the pair's peak; None: unknown
    memory_note: str | None  # one line where the memory margin changed or qualifies the answer (_memory_note)
    # Set by the orchestrator once the drift check ran (orchestration/retime.py): its block (core/drift.Drift.record)
    # and the line where the answer on both timings differs from the first figures' (core/drift.pooled_note).
    drift: dict[str, Any] | None = None
    drift_note: str | None = None
    busy_host_note: str = ""  # set where a busy CPU host made the score noisier (orchestration/host_load.busy_host_note)

    def to_record(self) -> dict[str, Any]:
        """recommendation.yaml's mapping: its keys in their order, drift and drift_note only once the drift check
        ran, busy_host_note only where there is one."""
        interval = self.throughput_interval_samples_per_s
        record: dict[str, Any] = {
            "accum": self.accum,
            "split": self.split,
            "per_device_batch": self.per_device_batch,
            "joint_batch": self.joint_batch,
            "global_batch_size": self.global_batch_size,
            "num_devices": self.num_devices,
            "machine": self.machine,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "throughput_interval_samples_per_s": None if interval is None else list(interval),
            "speedup": self.speedup,
            "baseline": None if self.baseline_accum is None else {"accum": self.baseline_accum, "split": 1},
            "confidence": self.confidence,
            "run_to_run_noise": self.run_to_run_noise,
            "flags": self.flags,
            "throughput_unit": self.throughput_unit,
            "splits_apply": self.splits_apply,
            "tight": self.tight,
            "headroom": self.headroom,
            "memory_note": self.memory_note,
        }
        if self.drift is not None:
            record.update(drift=self.drift, drift_note=self.drift_note)
        if self.busy_host_note:
            record["busy_host_note"] = self.busy_host_note
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Recommendation:
        """A recommendation.yaml mapping back; keys a file lacks (one from an older sweep) read as unknown. ValueError
        where it lacks what every sweep wrote (the pair and the batch it is for): not a recommendation.yaml."""
        missing = [k for k in _REQUIRED_KEYS if record.get(k) is None]
        if missing:
            raise ValueError(f"recommendation lacks {', '.join(missing)}: not a recommendation.yaml written by sweep")
        interval = record.get("throughput_interval_samples_per_s")
        baseline = record.get("baseline")
        drift = record.get("drift")
        return cls(
            accum=int(record["accum"]),
            split=int(record["split"]),
            per_device_batch=int(record["per_device_batch"]),
            joint_batch=_opt_int(record.get("joint_batch")),
            global_batch_size=int(record["global_batch_size"]),
            num_devices=int(record["num_devices"]),
            machine=str(record.get("machine") or ""),
            throughput_samples_per_s=_opt_float(record.get("throughput_samples_per_s")),
            throughput_interval_samples_per_s=(
                (float(interval[0]), float(interval[1]))
                if isinstance(interval, (list, tuple)) and len(interval) == 2 and None not in interval else None
            ),
            speedup=_opt_float(record.get("speedup")),
            baseline_accum=_opt_int(baseline.get("accum")) if isinstance(baseline, Mapping) else None,
            confidence=_opt_int(record.get("confidence")),
            run_to_run_noise=_opt_float(record.get("run_to_run_noise")),
            flags=str(record.get("flags") or ""),
            throughput_unit=str(record.get("throughput_unit") or "samples/s"),
            splits_apply=record.get("splits_apply") is not False,
            tight=bool(record.get("tight")),
            headroom=_opt_float(record.get("headroom")),
            memory_note=_opt_str(record.get("memory_note")),
            drift=dict(drift) if isinstance(drift, Mapping) else None,
            drift_note=_opt_str(record.get("drift_note")),
            busy_host_note=str(record.get("busy_host_note") or ""),
        )


# What every recommendation.yaml has said: the pair and the batch it is for (Recommendation.from_record).
_REQUIRED_KEYS = ("accum", "split", "per_device_batch", "global_batch_size", "num_devices")


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def recommendation(
    meta: SweepMeta,
    results: Mapping[str, TrialResult],
    confidence: int | None,
    memory_margin: float | None = None,
    run_to_run_noise: float | None = None,
) -> Recommendation | None:
    """The fastest ok pair that is not tight, and everything needed to use it; None until something ran ok.

    run_to_run_noise: the machine's, as the confidence score assumed it (recorded beside the score).

    A tight pair (ok, but its peak leaves less than trial.memory_margin of the device) may OOM in
    real training, so it is recommended only when every ok pair is tight; a faster tight pair is
    named in `memory_note` with both figures. A pair whose reserved peak was still growing at its
    end, or whose allocator retried in timed steps (core/growth.py), is treated as tight, and the note
    gives that figure instead.
    """
    ranked = ranked_ok(results)
    if not ranked:
        return None
    best = recommendable(ranked)[0]
    note = _memory_note(best, ranked[0], at_risk(best), _margin_text(memory_margin), meta.throughput_unit or "samples/s", meta.splits_apply)
    base = baseline_key(results)
    base_tp = results[base].throughput if base else None
    return Recommendation(
        accum=best.accum,
        split=best.split,
        per_device_batch=best.per_device_batch,
        joint_batch=best.joint_batch,
        global_batch_size=meta.global_batch_size,
        num_devices=meta.num_devices,
        machine=meta.machine,
        throughput_samples_per_s=round(best.throughput or 0.0, 3),
        throughput_interval_samples_per_s=(round(best.throughput_low or 0.0, 3), round(best.throughput_high or 0.0, 3)),
        speedup=round(best.throughput / base_tp, 4) if base_tp and best.throughput else None,
        baseline_accum=results[base].accum if base else None,
        confidence=confidence,
        run_to_run_noise=run_to_run_noise,
        flags=recommended_flags(meta, best),
        throughput_unit=meta.throughput_unit,
        splits_apply=meta.splits_apply,
        tight=at_risk(best),
        headroom=best.headroom,
        memory_note=note,
    )


def recommended_flags(meta: SweepMeta, best: TrialResult) -> str:
    """The pair in the flags the user's training command takes (sweep.parsers.presets.flags_template)."""
    if not meta.flags_template:
        return cli_flags(best.accum, best.split)
    return meta.flags_template.format(
        accum=best.accum, split=best.split, per_device_batch=best.per_device_batch, joint_batch=best.joint_batch,
        global_batch_size=meta.global_batch_size, num_devices=meta.num_devices, accum_x_devices=best.accum * meta.num_devices,
    )


def _margin_text(margin: float | None) -> str:
    return "trial.memory_margin" if margin is None else f"trial.memory_margin={margin:g}"


def _memory_note(best: TrialResult, fastest: TrialResult, all_tight: bool, margin: str, unit: str, splits_apply: bool = True) -> str | None:
    """One line when the memory margin changed or qualifies the answer; None when it did not."""

    def pair(r: TrialResult) -> str:
        return f"accum={r.accum} split={r.split}" if splits_apply is not False else f"accum={r.accum}"

    if all_tight:
        if risk_note(best):
            return f"{pair(best)} is tight: {risk_note(best)}; every ok pair is tight, growing or retrying"
        return f"{pair(best)} is tight: it leaves {_pct(best.headroom)} headroom, below {margin}; every ok pair does"
    if fastest is best:
        return None
    faster = (fastest.throughput or 0.0) / (best.throughput or 1.0) - 1.0
    shown = f"{faster:.0%}" if faster >= 0.01 else f"{faster:.1%}"  # never "0% faster"
    why = risk_note(fastest) if not fastest.tight else f"leaves {_pct(fastest.headroom)} headroom, below {margin}"
    return f"{pair(fastest)} is {shown} faster ({fastest.throughput:.1f} vs {best.throughput:.1f} {unit}) but {why}"


def _pct(fraction: float | None) -> str:
    return "unknown" if fraction is None else f"{fraction:.0%}"


SURE_CONFIDENCE = 80  # the score from which the line says a pair "is the fastest" rather than that it leads so far


def recommendation_line(rec: Recommendation | None) -> str:
    """Cerebras-style one-liner: `recommended accum=2 split=4: 1.23x the split=1 baseline, confidence 67/100`."""
    if rec is None:
        return "no recommendation yet: no trial has run ok"
    speed = f"{rec.speedup:.2f}x the split=1 baseline" if rec.speedup else "no split=1 baseline ran ok"
    conf = f", confidence {rec.confidence}/100" if rec.confidence is not None else ""
    if not rec.splits_apply:  # 1-D: no split to name; the framework's own flags say it all
        base = rec.baseline_accum
        if base == rec.accum:
            # "The fastest" only where the score backs it; below that the sweep knows only that it leads what ran.
            sure = rec.confidence is not None and rec.confidence >= SURE_CONFIDENCE
            speed = f"the least accumulation that ran ok {'is the fastest' if sure else 'leads so far'}"
        else:
            speed = f"{rec.speedup:.2f}x the accum={base} baseline" if rec.speedup else "no baseline ran ok"
        line = f"recommended {rec.flags} (accum={rec.accum}): {speed}{conf}"
    else:
        line = f"recommended accum={rec.accum} split={rec.split}: {speed}{conf}"
    notes = [note for note in (rec.memory_note, rec.drift_note) if note]
    return "\n".join([line, *notes])
