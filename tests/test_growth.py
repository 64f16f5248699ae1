"""Growth: a pair whose reserved peak still climbs at its end is not recommended, marked tight with
the figure (core/growth.py), from the per-step reserved peaks a trial records."""

from __future__ import annotations

import pytest

from sweep.core.growth import GROWTH_PREFIX, at_risk, last_rise, late_oom_note, still_growing
from sweep.core.ranking import SweepMeta, build_table, confidence_view, recommendation
from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.space import Candidate
from sweep.core.table import TIGHT_MARK, render_plain, sweep_table

FLAT = [10.0, 12.0] + [12.0] * 30
STAIRS_EARLY = [10.0, 12.0, 12.5, 13.0] + [13.0] * 28  # settled after step 3
STAIRS_LATE = [10.0] * 20 + [10.5] * 6 + [11.0] * 6  # still rising near the end
STRESS_RISE = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.9]  # the stress step (9) needs more


@pytest.mark.parametrize(
    "peaks,capacity,growing,rise",
    [
        (FLAT, 24.0, False, (1, 2.0)),
        (STAIRS_EARLY, 24.0, False, (3, 0.5)),
        (STAIRS_LATE, 24.0, True, (26, 0.5)),
        (STRESS_RISE, 24.0, True, (9, pytest.approx(0.9))),
        ([10.0, 10.05, 10.1, 10.11] * 5, 24.0, False, None),  # under 0.5% of 24 GiB: the allocator's rounding
        ([0.5 + 0.002 * i for i in range(20)], 24.0, False, None),  # a creep of 38 MiB in all: rounding
        ([10.0 + 0.02 * i for i in range(20)], 24.0, True, (14, pytest.approx(0.14))),  # a creep that adds up
        ([1.0, 2.0, 3.0], 24.0, False, (2, 1.0)),  # three steps: too few for a verdict
        ([], 24.0, False, None),
        (STAIRS_LATE, None, True, (26, 0.5)),  # capacity unknown: tolerance from the peak itself
    ],
)
def test_still_growing_table(peaks, capacity, growing, rise):
    assert last_rise(peaks, capacity) == rise
    note = still_growing(peaks, capacity)
    assert bool(note) == growing
    if growing:
        assert note.startswith(GROWTH_PREFIX) and f"at step {rise[0]} of {len(peaks)}" in note


def result(accum, split, throughput, peaks=(), tight=False, status=OK):
    per_device = 128 // accum
    return TrialResult(
        accum=accum, split=split, per_device_batch=per_device, joint_batch=per_device // split, global_batch_size=128,
        num_devices=1, status=status, throughput=throughput, throughput_low=throughput * 0.98,
        throughput_high=throughput * 1.02, step_times_s=[1.0] * 8, peak_mem_gib=max(peaks, default=10.0),
        peak_reserved_gib=max(peaks, default=10.0), capacity_gib=24.0, headroom=0.5, tight=tight,
        step_peak_reserved_gib=list(peaks),
    )


def test_a_growing_leader_is_not_recommended_and_shows_its_figure():
    results = {r.key: r for r in (result(1, 8, 100.0, STAIRS_LATE), result(2, 4, 90.0, FLAT), result(4, 1, 50.0, FLAT))}
    assert at_risk(results["accum1_split8"]) and not at_risk(results["accum2_split4"])
    meta = SweepMeta("s", "m", "rnnt", 128, 1)
    rec = recommendation(meta, results, confidence=80)
    assert (rec["accum"], rec["split"], rec["tight"]) == (2, 4, False)
    assert rec["memory_note"].startswith("accum=1 split=8 is 11% faster") and GROWTH_PREFIX in rec["memory_note"]
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
