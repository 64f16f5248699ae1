"""Trial results and sweep dirs built without running a sweep.

`trial_result` is the one TrialResult factory: the batch arithmetic done (per_device_batch =
global_batch_size / (num_devices * accum), joint_batch = per_device_batch / split), any field given by name
on top. `make_sweep` writes a whole sweep dir the way the orchestrator does, from `synthetic_result`s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sweep.core.ranking import SweepMeta, build_table, table_csv
from sweep.core.recommendation import recommendation
from sweep.core.schema import FAILED, OK, OOM, TrialResult, trial_dir
from sweep.core.space import enumerate_candidates
from sweep.core.stats import throughput_summary
from sweep.records import write_result


def trial_result(accum: int = 1, split: int = 1, *, gbs: int = 64, devices: int = 1, status: Any = OK,
                 times: Sequence[float] | None = None, **fields: Any) -> TrialResult:
    """A TrialResult of pair (accum, split) at global batch `gbs` over `devices` devices: per_device_batch and
    joint_batch follow from them (either may be given in `fields` instead). `times`: its measured step times, and
    the figure and interval throughput_summary makes of them (each may be given in `fields` instead). Every other
    field from `fields`."""
    per_device = fields.pop("per_device_batch", gbs // (devices * accum))
    joint = fields.pop("joint_batch", per_device // split)
    if times is not None:
        mid, low, high = throughput_summary(list(times), gbs)
        fields = {"step_times_s": list(times), "throughput": mid, "throughput_low": low, "throughput_high": high, **fields}
    return TrialResult(accum=accum, split=split, per_device_batch=per_device, joint_batch=joint, global_batch_size=gbs,
                       num_devices=devices, status=status, **fields)


def synthetic_result(accum: int, split: int, gbs: int, nd: int, scale: float = 1.0) -> TrialResult:
    """An RNN-T-like outcome: the encoder OOMs at per-device batch 128, the joint above joint batch 16."""
    per_device = gbs // (nd * accum)
    joint = per_device // split
    common = dict(gbs=gbs, devices=nd, job_id=f"{1000 + accum * 100 + split}", log=f"/logs/accum{accum}_split{split}.log",
                  device="cuda", wall_s=40.0 + accum)
    if per_device >= 128:
        return trial_result(accum, split, status=OOM, oom_phase="encoder", error="CUDA out of memory in encoder forward",
                            peak_mem_gib=79.2, **common)
    if joint > 16:
        return trial_result(accum, split, status=OOM, oom_phase="joint", error="CUDA out of memory in joint (B*T*U*V)",
                            peak_mem_gib=79.5, **common)
    if accum == 4 and split == 32:
        return trial_result(accum, split, status=FAILED, error="NCCL error: unhandled system error", **common)
    # More per-device batch pays (sub-linearly); each split costs a little joint-launch overhead.
    tp = scale * 900.0 * (per_device / 16) ** 0.45 * (1 - 0.03 * math.log2(split))
    step = gbs / tp
    times = [step * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(8)]
    mid, lo, hi = throughput_summary(times, gbs)
    return trial_result(accum, split, status=OK, step_times_s=times, throughput=mid, throughput_low=lo, throughput_high=hi,
                        warmup_steps=2, peak_mem_gib=20.0 + per_device / split * 3.1, **common)


def make_sweep(
    root: Path,
    name: str,
    *,
    machine: str = "dgx-a100",
    workload: str = "rnnt",
    gbs: int = 1024,
    nd: int = 8,
    accums: Iterable[int] = (1, 2, 3, 4, 8),
    splits: Iterable[int] = (1, 2, 4, 8, 32),
    scale: float = 1.0,
    scale_pairs: Mapping[tuple[int, int], float] | None = None,
    finished: set[tuple[int, int]] | None = None,
    running: Iterable[tuple[int, int]] = (),
    confidence: int | None = 80,
    link_latest: bool = True,
) -> Path:
    """Write a sweep dir like the orchestrator does; `finished=None` means every valid pair finished."""
    sweep = root / name
    sweep.mkdir(parents=True)
    meta = SweepMeta(sweep_id=name, machine=machine, workload=workload, global_batch_size=gbs, num_devices=nd)
    cands = enumerate_candidates(gbs, nd, list(accums), list(splits))
    results = {}
    for c in cands:
        if not c.valid or (finished is not None and (c.accum, c.split) not in finished):
            continue
        res = synthetic_result(c.accum, c.split, gbs, nd, scale * (scale_pairs or {}).get((c.accum, c.split), 1.0))
        write_result(res, trial_dir(sweep, c.key))
        results[c.key] = res
    running_keys = {f"accum{a}_split{s}" for a, s in running}
    (sweep / "trials.csv").write_text(table_csv(build_table(meta, cands, results, running_keys)))
    rec = recommendation(meta, results, confidence)
    if rec is not None:
        (sweep / "recommendation.yaml").write_text(yaml.safe_dump(rec.to_record(), sort_keys=False))
    done = finished is None
    (sweep / "sweep.json").write_text(json.dumps({
        "schema_version": 1, "sweep_id": name, "machine": machine, "workload": workload,
        "global_batch_size": gbs, "num_devices": nd, "search": "grid",
        "started_at": "2024-05-01T10:00:00+00:00", "finished_at": "2024-05-01T11:00:00+00:00" if done else None,
        "state": "done" if done else "running", "command": "python -m sweep machine=dgx-a100",
    }))
    if link_latest:
        latest = root / "latest"
        if latest.is_symlink():
            latest.unlink()
        latest.symlink_to(name)
    return sweep


