"""The recommendation (pure): the answer a sweep gives, its flags, and the one line that says it.

recommendation() picks the fastest pair the sweep may recommend (core/ranking.recommendable) and builds a
Recommendation; recommendation.yaml is its to_record(), which the report reads back with from_record().
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweep.core.growth import at_risk, risk_note
from sweep.core.ranking import SweepMeta, baseline_key, ranked_ok, recommendable
from sweep.core.schema import TrialResult


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
