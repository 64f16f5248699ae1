"""The Recommendation (core/ranking.py) and recommendation.yaml: to_record() is the file's mapping, key for key and in
order, and from_record() reads it back to the same value (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from sweep.core.ranking import SweepMeta
from sweep.core.recommendation import Recommendation, recommendation
from sweep.core.schema import OK, TrialResult

KEYS = ["accum", "split", "per_device_batch", "joint_batch", "global_batch_size", "num_devices", "machine",
        "throughput_samples_per_s", "throughput_interval_samples_per_s", "speedup", "baseline", "confidence", "run_to_run_noise",
        "flags", "throughput_unit", "splits_apply", "tight", "headroom", "memory_note"]


def ok(accum: int, split: int, tp: float) -> TrialResult:
    pdb = 128 // accum
    return TrialResult(accum=accum, split=split, per_device_batch=pdb, joint_batch=pdb // split, global_batch_size=128, num_devices=1,
                       status=OK, throughput=tp, throughput_low=tp * 0.97, throughput_high=tp * 1.03, headroom=0.4)


def rec() -> Recommendation:
    results = {r.key: r for r in (ok(8, 1, 1000.0), ok(4, 2, 1234.5678))}
    out = recommendation(SweepMeta("s", "local", "rnnt", 128, 1), results, 51, 0.05, 0.07)
    assert out is not None
    return out


def test_the_record_is_recommendation_yamls_mapping() -> None:
    record = rec().to_record()
    assert list(record) == KEYS
    assert record["baseline"] == {"accum": 8, "split": 1}
    assert record["throughput_interval_samples_per_s"] == [round(1234.5678 * 0.97, 3), round(1234.5678 * 1.03, 3)]
    assert (record["accum"], record["split"], record["speedup"], record["throughput_samples_per_s"]) == (4, 2, 1.2346, 1234.568)
    # The orchestrator's extras come last: drift and drift_note once the drift check ran, the busy host's note where there is one.
    drift = {"assumed_noise": 0.07, "retimed": [{"accum": 4, "split": 2, "first": 1.0, "again": 1.1, "moved": 0.1}]}
    extra = replace(rec(), drift=drift, drift_note=None, busy_host_note="busy host").to_record()
    assert list(extra) == [*KEYS, "drift", "drift_note", "busy_host_note"] and extra["drift_note"] is None


@pytest.mark.parametrize("extras", [{}, {"drift": {"dof": 2, "retimed": []}, "drift_note": "a note"}, {"busy_host_note": "busy"}])
def test_the_file_reads_back_to_the_same_recommendation(extras: dict) -> None:
    original = replace(rec(), **extras)
    text = yaml.safe_dump(original.to_record(), sort_keys=False)
    assert Recommendation.from_record(yaml.safe_load(text)) == original


def test_a_file_without_the_pair_is_not_a_recommendation() -> None:
    with pytest.raises(ValueError, match="recommendation lacks per_device_batch, num_devices: not a recommendation.yaml written by sweep"):
        Recommendation.from_record({"accum": 1, "split": 1, "global_batch_size": 8})
    # Keys an older sweep did not write read as unknown.
    old = Recommendation.from_record({"accum": 2, "split": 1, "per_device_batch": 4, "global_batch_size": 8, "num_devices": 1})
    assert (old.flags, old.splits_apply, old.speedup, old.baseline_accum, old.drift) == ("", True, None, None, None)
