"""Growth and retries: a pair whose reserved peak still climbs at its end, or whose CUDA allocator retried in
a timed step, is not recommended, marked tight with the figure (core/growth.py), from the per-step reserved
peaks and allocator retries a trial records."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.results import trial_result

from sweep.core.growth import (
    GROWTH_PREFIX,
    RETRIES_PREFIX,
    at_risk,
    final_third_start,
    late_oom_note,
    late_rise,
    retries_note,
    risk_note,
    still_growing,
)
from sweep.core.probe_report import summarise
from sweep.core.ranking import SweepMeta, build_table, confidence_view
from sweep.core.recommendation import recommendation
from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.space import Candidate
from sweep.core.table import TIGHT_MARK, render_plain, sweep_table
from sweep.errors import ResultError
from sweep.workloads.command.probed import ProbeFollower

FLAT = [10.0, 12.0] + [12.0] * 30
STAIRS_EARLY = [10.0, 12.0, 12.5, 13.0] + [13.0] * 28  # settled after step 3
STAIRS_LATE = [10.0] * 20 + [10.5] * 6 + [11.0] * 6  # still rising near the end
STRESS_RISE = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.9]  # the stress step (9) needs more


MIB = 1 / 1024
# The bug this rule fixes (issue 43): an early rise, then a creep of 0.95 MiB before the final third and
# 0.09 MiB in it. Chained from the early rise, the creep added up past the 1 MiB tolerance (a 0.1 GiB
# capacity) in the final third and the pair read as growing.
EARLY_RISE_LATE_CREEP = [50 * MIB, 60 * MIB] + [(60 + 0.95 * i / 6) * MIB for i in range(1, 7)] + [
    (60.95 + 0.03 * i) * MIB for i in (1, 2, 3, 3)
]
EARLY_RISE_LATE_JUMP = EARLY_RISE_LATE_CREEP[:8] + [60.95 * MIB, 61.0 * MIB, 63.5 * MIB, 63.5 * MIB]  # 2.55 MiB up in the final third


@pytest.mark.parametrize(
    "peaks,capacity,growing,rise",
    [
        (FLAT, 24.0, False, None),
        (STAIRS_EARLY, 24.0, False, None),
        (STAIRS_LATE, 24.0, True, (26, 0.5, 20)),  # on step 20's 10.5 GiB, the highest before the final third
        (STRESS_RISE, 24.0, True, (9, pytest.approx(0.9), 0)),
        ([10.0, 10.05, 10.1, 10.11] * 5, 24.0, False, None),  # under 0.5% of 24 GiB: the allocator's rounding
        ([0.5 + 0.002 * i for i in range(20)], 24.0, False, None),  # a creep of 38 MiB in all: rounding
        ([10.0 + 0.03 * i for i in range(20)], 24.0, True, (19, pytest.approx(0.18), 13)),  # 184 MiB within the final third
        # 190 MiB in all, above the 123 MiB tolerance, but 61 MiB of it in the final third: settled enough.
        ([10.0 + 0.01 * i for i in range(20)], 24.0, False, None),
        (EARLY_RISE_LATE_CREEP, 0.1, False, None),
        (EARLY_RISE_LATE_JUMP, 0.1, True, (10, pytest.approx(2.55 * MIB), 7)),
        ([1.0, 2.0, 3.0], 24.0, False, None),  # three steps: too few for a verdict
        ([], 24.0, False, None),
        (STAIRS_LATE, None, True, (26, 0.5, 20)),  # capacity unknown: tolerance from the peak itself
    ],
)
def test_still_growing_table(peaks, capacity, growing, rise):
    assert late_rise(peaks, capacity) == rise
    note = still_growing(peaks, capacity)
    assert bool(note) == growing
    if growing:
        assert note.startswith(GROWTH_PREFIX) and f"at step {rise[0]} of {len(peaks)}" in note
        assert f"on the highest before the final third (step {rise[2]}: " in note


def test_an_early_rise_and_a_tiny_late_creep_is_not_growing():
    """The old rule's false alarm, spelled out: the creep past the early rise tops 1 MiB only in the final
    third, but within the final third it is 0.09 MiB."""
    peaks, start = EARLY_RISE_LATE_CREEP, final_third_start(len(EARLY_RISE_LATE_CREEP))
    assert (len(peaks), start) == (12, 8)
    assert peaks[-1] - peaks[1] > MIB  # chained from the early rise: above the tolerance, late
    assert max(peaks[start:]) - max(peaks[:start]) == pytest.approx(0.09 * MIB)
    assert still_growing(peaks, 0.1) == "" and not at_risk(result(1, 8, 100.0, peaks))
    assert still_growing(EARLY_RISE_LATE_JUMP, 0.1).startswith(f"{GROWTH_PREFIX}: 0.062 GiB of 0.1 GiB at step 10 of 12, up 3 MiB")


def result(accum, split, throughput, peaks=(), tight=False, status=OK, retries=(), warmup=0):
    return trial_result(
        accum, split, gbs=128, status=status, throughput=throughput, throughput_low=throughput * 0.98,
        throughput_high=throughput * 1.02, step_times_s=[1.0] * 8, peak_mem_gib=max(peaks, default=10.0),
        peak_reserved_gib=max(peaks, default=10.0), capacity_gib=24.0, headroom=0.5, tight=tight,
        step_peak_reserved_gib=list(peaks), step_alloc_retries=list(retries), warmup_steps=warmup,
    )


def test_a_growing_leader_is_not_recommended_and_shows_its_figure():
    results = {r.key: r for r in (result(1, 8, 100.0, STAIRS_LATE), result(2, 4, 90.0, FLAT), result(4, 1, 50.0, FLAT))}
    assert at_risk(results["accum1_split8"]) and not at_risk(results["accum2_split4"])
    meta = SweepMeta("s", "m", "rnnt", 128, 1)
    rec = recommendation(meta, results, confidence=80)
    assert (rec.accum, rec.split, rec.tight) == (2, 4, False)
    assert rec.memory_note.startswith("accum=1 split=8 is 11% faster") and GROWTH_PREFIX in rec.memory_note
    # Scored as if the growing pair did not fit, as a tight one is.
    assert confidence_view(results)["accum1_split8"].status == OOM
    cands = [Candidate(a, s, 128 // a, 128 // a // s) for a, s in ((1, 8), (2, 4), (4, 1))]
    table = sweep_table(build_table(meta, cands, results))
    growing_row = next(r for r in table.rows if (r.accum, r.split) == (1, 8))
    assert TIGHT_MARK in growing_row.marks and growing_row.note.startswith(GROWTH_PREFIX)
    assert "11 GiB of 24 GiB at step 26 of 32" in growing_row.note
    assert any("still growing" in line for line in table.legend)
    # Its note sits under a heading that says an ok pair can be there: "Not run ok" alone contradicted the row.
    assert table.notes_title == "Not run ok, or ok but still growing:"
    assert "\nNot run ok, or ok but still growing:\n  accum=1 split=8 ok: " + GROWTH_PREFIX in render_plain(table)


def test_settled_and_unmeasured_trials_are_not_at_risk():
    assert not at_risk(result(1, 8, 100.0, STAIRS_EARLY))
    assert not at_risk(result(1, 8, 100.0))  # no per-step figures (an older record, a command trial)
    assert at_risk(result(1, 8, 100.0, tight=True))
    assert not at_risk(result(1, 8, 100.0, STAIRS_LATE, status=OOM))  # an OOM is out already


def test_a_late_oom_says_at_which_step_it_came():
    late = result(2, 8, 0.0, status=OOM)
    late.step_times_s, late.warmup_steps, late.error = [1.0] * 22, 2, "CUDA out of memory in phase joint"
    assert late_oom_note(late) == "out of memory at step 24 after 24 steps had fitted: a late OOM"
    first = result(8, 1, 0.0, status=OOM)
    first.step_times_s = []
    assert late_oom_note(first) == "" and late_oom_note(result(1, 8, 100.0)) == ""
    meta = SweepMeta("s", "m", "rnnt", 128, 1)
    rows = build_table(meta, [Candidate(2, 8, 64, 8)], {late.key: late})
    assert rows[0]["reason"] == "CUDA out of memory in phase joint; out of memory at step 24 after 24 steps had fitted: a late OOM"


SETTLED = [10.0] * 10  # no growth: only the retries can put these at risk


@pytest.mark.parametrize(
    "retries,warmup,expected",
    [
        ([3, 1, 0, 0, 0, 2, 0, 0, 1, 0], 2, "3 retries at steps 5, 8 of 10"),  # rose in timed steps 5 and 8
        ([0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 2, "1 retry at step 9 of 10"),  # one, in the last step
        ([0, 0] + [1] * 8, 2, "8 retries at steps 2, 3, 4, 5, 6, ... of 10"),  # the first timed step counts
        ([5, 2] + [0] * 8, 2, ""),  # only in warm-up (a cold cache): not at risk
        ([7] + [0] * 9, 0, ""),  # step 0 holds start-up's (and a warm worker's earlier trials') count: never counted
        ([0] * 10, 2, ""),
        ([], 2, ""),  # not measured (CPU, a log-parsed trial, a record from before the field)
    ],
)
def test_allocator_retries_in_timed_steps_put_a_pair_at_risk(retries, warmup, expected):
    r = result(1, 8, 100.0, SETTLED, retries=retries, warmup=warmup)
    note = retries_note(r)
    assert at_risk(r) == bool(expected) and risk_note(r) == note
    if expected:
        assert note.startswith(f"{RETRIES_PREFIX}: {expected} (a cudaMalloc failed; ") and note.endswith("may OOM in real training")
    else:
        assert note == ""
    assert not at_risk(result(1, 8, 100.0, SETTLED, retries=retries, warmup=warmup, status=OOM))  # an OOM is out already


def test_growth_is_named_before_retries():
    r = result(1, 8, 100.0, STAIRS_LATE, retries=[0] * 31 + [1], warmup=2)
    assert risk_note(r).startswith(GROWTH_PREFIX) and retries_note(r).startswith(RETRIES_PREFIX)


def test_a_retrying_leader_is_not_recommended_and_shows_its_figure():
    """The table, the notes' heading and the recommendation treat a retrying pair as a growing one."""
    retrying = result(1, 8, 100.0, SETTLED, retries=[4, 0, 0, 0, 1, 0, 0, 2, 0, 0], warmup=2)
    results = {r.key: r for r in (retrying, result(2, 4, 90.0, SETTLED, retries=[2] + [0] * 9, warmup=2), result(4, 1, 50.0, FLAT))}
    assert at_risk(results["accum1_split8"]) and not at_risk(results["accum2_split4"])
    meta = SweepMeta("s", "m", "rnnt", 128, 1)
    rec = recommendation(meta, results, confidence=80)
    assert (rec.accum, rec.split, rec.tight) == (2, 4, False)
    assert rec.memory_note == f"accum=1 split=8 is 11% faster (100.0 vs 90.0 samples/s) but {retries_note(retrying)}"
    assert confidence_view(results)["accum1_split8"].status == OOM
    cands = [Candidate(a, s, 128 // a, 128 // a // s) for a, s in ((1, 8), (2, 4), (4, 1))]
    table = sweep_table(build_table(meta, cands, results))
    row = next(r for r in table.rows if (r.accum, r.split) == (1, 8))
    assert TIGHT_MARK in row.marks
    assert row.note == (
        f"{RETRIES_PREFIX}: 3 retries at steps 4, 7 of 10 (a cudaMalloc failed; the cache was flushed to fit): may OOM in real training"
    )
    assert any("retrying" in line for line in table.legend)
    assert table.notes_title == "Not run ok, or ok but retrying allocations:"
    assert "\nNot run ok, or ok but retrying allocations:\n  accum=1 split=8 ok: " + RETRIES_PREFIX in render_plain(table)
    # Both kinds at once: the heading names both.
    results["accum4_split1"] = result(4, 1, 50.0, STAIRS_LATE)
    both = sweep_table(build_table(meta, cands, results))
    assert both.notes_title == "Not run ok, or ok but still growing or retrying allocations:"
    # Every pair at risk: the fastest is recommended, tight, with its figure.
    only = {retrying.key: retrying}
    assert recommendation(meta, only, confidence=None).memory_note == (
        f"accum=1 split=8 is tight: {retries_note(retrying)}; every ok pair is tight, growing or retrying"
    )


def test_retries_read_back_from_a_record_and_older_records_have_none():
    r = result(1, 8, 100.0, SETTLED, retries=[0, 0, 1] + [0] * 7, warmup=2)
    data = r.to_dict()
    assert TrialResult.from_dict(data) == r and at_risk(TrialResult.from_dict(data))
    del data["step_alloc_retries"]  # written before the field existed
    old = TrialResult.from_dict(data)
    assert old.step_alloc_retries == [] and not at_risk(old)
    for bad in ([1, "x"], [1.5], [-1], [True], 3):
        with pytest.raises(ResultError, match=r"step_alloc_retries=.* is not a list of counts"):
            TrialResult.from_dict({**data, "step_alloc_retries": bad})


def _step_record(step, retries, reserved=10 * 1024**3):
    return {"kind": "step", "step": step, "rank": 0, "seconds": 1.0, "device": "cuda", "allocated_peak": reserved,
            "reserved_peak": reserved, "retries": retries}


def test_a_probe_report_with_rising_retries_reaches_the_command_trials_result():
    """ProbeReport -> ProbeFollower.memory_fields (the command workload's) -> TrialResult -> at_risk."""
    records = [{"kind": "start"}] + [_step_record(i, n) for i, n in enumerate([2, 0, 0, 1, 0, 0])]
    report = summarise({"rank0.jsonl": records})
    assert report.step_retries == [2, 0, 0, 1, 0, 0]
    follower = ProbeFollower(Path("unused"), warmup_steps=2, global_batch_size=128, tokens_per_sample=None, unit="samples/s")
    follower.report = report
    fields = follower.memory_fields("cuda", 80.0)
    assert fields["step_alloc_retries"] == [2, 0, 0, 1, 0, 0]
    trial = TrialResult(accum=1, split=1, per_device_batch=128, joint_batch=128, global_batch_size=128, num_devices=1,
                        status=OK, measured_by="probe", **follower.ok_fields(), **fields)
    assert trial.warmup_steps == 2 and at_risk(trial)
    assert retries_note(trial).startswith(f"{RETRIES_PREFIX}: 1 retry at step 3 of 6")
    # Only the warm-up's retries: not at risk.
    follower.report = summarise({"rank0.jsonl": [{"kind": "start"}] + [_step_record(i, n) for i, n in enumerate([2, 3, 0, 0, 0])]})
    calm = TrialResult(accum=1, split=1, per_device_batch=128, joint_batch=128, global_batch_size=128, num_devices=1,
                       status=OK, **follower.ok_fields(), **follower.memory_fields("cuda", 80.0))
    assert calm.step_alloc_retries == [2, 3, 0, 0, 0] and not at_risk(calm)
    # Ranks: a step's count is the most any rank retried; a trainer's reset (a negative count) reads as 0.
    rank1 = [{**_step_record(0, -4), "rank": 1}, {**_step_record(1, 3), "rank": 1}]
    two = summarise({"r0": [_step_record(0, 0), _step_record(1, 1)], "r1": rank1})
    assert two.step_retries == [0, 3] and summarise({"r0": [_step_record(0, -4)]}).step_retries == [0]
    cpu = summarise({"r0": [{"kind": "step", "step": i, "seconds": 1.0, "device": "cpu", "retries": None} for i in range(3)]})
    assert cpu.step_retries == []
