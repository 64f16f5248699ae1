"""The ranked sweep table and its recommendation (pure).

One row per candidate, ok rows ranked by median throughput. Speedup is against
the seed's step-2 answer: the feasible split=1 pair with the smallest accum
(the setting a user would reach without batch splitting).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from sweep.core.schema import (
    CANCELLED,
    FAILED,
    INVALID,
    OK,
    OOM,
    PENDING,
    PREDICTED_OOM,
    RUNNING,
    SKIPPED,
    TIMEOUT,
    TrialResult,
)
from sweep.core.space import Candidate

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
]

# Row order below the ranked rows: what is still coming, then what failed and why.
_STATUS_ORDER = {OK: 0, RUNNING: 1, PENDING: 2, OOM: 3, PREDICTED_OOM: 3, TIMEOUT: 4, FAILED: 5, CANCELLED: 6, SKIPPED: 7, INVALID: 8}


@dataclass(frozen=True)
class SweepMeta:
    """What every row of one sweep shares."""

    sweep_id: str
    machine: str
    workload: str
    global_batch_size: int
    num_devices: int


def baseline_key(results: Mapping[str, TrialResult]) -> str | None:
    """The split=1 ok pair with the smallest accum: the 1.00x reference."""
    base = [r for r in results.values() if r.status == OK and r.split == 1 and r.throughput]
    return min(base, key=lambda r: r.accum).key if base else None


def ranked_ok(results: Mapping[str, TrialResult]) -> list[TrialResult]:
    """Ok results, fastest first; ties broken towards less accumulation (less memory pressure later)."""
    ok = [r for r in results.values() if r.status == OK and r.throughput]
    return sorted(ok, key=lambda r: (-(r.throughput or 0.0), r.accum, r.split))


def build_table(
    meta: SweepMeta,
    candidates: Sequence[Candidate],
    results: Mapping[str, TrialResult],
    running: Collection[str] = (),
    live_throughput: Mapping[str, float] | None = None,
    done: bool = False,
) -> list[dict[str, Any]]:
    """One row per candidate, ranked rows first. live_throughput: what running trials' logs show so far.

    done: the search has ended, so a candidate never run is `skipped`, not `pending`.
    """
    ranks = {r.key: i + 1 for i, r in enumerate(ranked_ok(results))}
    base = baseline_key(results)
    base_tp = results[base].throughput if base else None
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
        else:
            row.update(
                status=res.status,
                oom_phase=res.oom_phase,
                throughput_samples_per_s=res.throughput,
                throughput_low_samples_per_s=res.throughput_low,
                throughput_high_samples_per_s=res.throughput_high,
                peak_mem_gib=res.peak_mem_gib,
                wall_s=res.wall_s,
                steps_measured=len(res.step_times_s) if res.step_times_s else None,
                reason=res.error or (f"stopped early: {res.stopped_early}" if res.stopped_early else ""),
                log=res.log,
                job_id=res.job_id,
                rank=ranks.get(cand.key),
            )
            if res.status == OK and base_tp and res.throughput:
                row["speedup"] = res.throughput / base_tp
        rows.append(row)
    rows.sort(key=lambda r: (_STATUS_ORDER[r["status"]], r["rank"] or 0, r["accum"], r["split"]))
    return rows


def table_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else _fmt(row[k])) for k in TABLE_COLUMNS})
    return buf.getvalue()


def _fmt(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def cli_flags(accum: int, split: int) -> str:
    """What users paste into the Myrtle.ai training command."""
    return f"--grad_accumulation_batches={accum} --batch_split_factor={split}"


def recommendation(
    meta: SweepMeta, results: Mapping[str, TrialResult], confidence: int | None
) -> dict[str, Any] | None:
    """The rank-1 pair and everything needed to use it; None until something ran ok."""
    ranked = ranked_ok(results)
    if not ranked:
        return None
    best = ranked[0]
    base = baseline_key(results)
    base_tp = results[base].throughput if base else None
    return {
        "accum": best.accum,
        "split": best.split,
        "per_device_batch": best.per_device_batch,
        "joint_batch": best.joint_batch,
        "global_batch_size": meta.global_batch_size,
        "num_devices": meta.num_devices,
        "machine": meta.machine,
        "throughput_samples_per_s": round(best.throughput or 0.0, 3),
        "throughput_interval_samples_per_s": [round(best.throughput_low or 0.0, 3), round(best.throughput_high or 0.0, 3)],
        "speedup": round(best.throughput / base_tp, 4) if base_tp and best.throughput else None,
        "baseline": {"accum": results[base].accum, "split": 1} if base else None,
        "confidence": confidence,
        "flags": cli_flags(best.accum, best.split),
    }


def recommendation_line(rec: Mapping[str, Any] | None) -> str:
    """Cerebras-style one-liner: `recommended accum=2 split=4: 1.23x the split=1 baseline, confidence 67/100`."""
    if rec is None:
        return "no recommendation yet: no trial has run ok"
    speed = f"{rec['speedup']:.2f}x the split=1 baseline" if rec.get("speedup") else "no split=1 baseline ran ok"
    conf = f", confidence {rec['confidence']}/100" if rec.get("confidence") is not None else ""
    return f"recommended accum={rec['accum']} split={rec['split']}: {speed}{conf}"
