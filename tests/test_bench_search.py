"""bench/bench_search.py's rules: the pairs a search without the throughput ordering must measure for the
grid's answer, "same answer", and the memory model asked about each pair the grid ran with that pair left out."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_search import leave_one_out, pairs_the_answer_needs, same_answer  # noqa: E402


def row(status="ok", low="", high="", steps="12"):
    return {"status": status, "throughput_low_samples_per_s": low, "throughput_high_samples_per_s": high,
            "steps_measured": steps if status == "ok" else ""}


PICK, BASE = ("4", "2"), ("8", "1")


@pytest.mark.parametrize(
    "others, needed",
    [
        # a faster pair (tight, or the pick would be it) and an overlapping one must run; an OOM need not
        ({("2", "4"): row(low="230", high="238"), ("2", "8"): row(low="203", high="206"), ("1", "16"): row("oom")},
         [("2", "4"), ("2", "8")]),
        # wholly below the pick by more than racing's 1% margin: ruled out without running
        ({("4", "4"): row(low="184", high="190")}, []),
        # just below, but within the 1% margin: racing would not stop it, so it is needed
        ({("4", "4"): row(low="195", high="201")}, [("4", "4")]),
        # too few timed steps behind its interval for racing to decide anything
        ({("4", "4"): row(low="150", high="160", steps="3")}, [("4", "4")]),
    ],
)
def test_pairs_the_answer_needs(others, needed):
    rows = {PICK: row(low="203", high="209"), BASE: row(low="170", high="180"), **others}
    assert pairs_the_answer_needs(rows, PICK, BASE) == [PICK, BASE, *needed]


def test_pick_without_a_baseline_needs_only_itself_and_its_rivals():
    rows = {PICK: row(low="203", high="209"), ("2", "8"): row(low="205", high="210")}
    assert pairs_the_answer_needs(rows, PICK, None) == [PICK, ("2", "8")]


@pytest.mark.parametrize(
    "pick, same",
    [
        (("4", "2"), True),  # the grid's own pick
        (("8", "2"), True),  # another pair, measured by the grid inside its pick's interval
        (("8", "1"), False),  # measured below it
        (("2", "1"), False),  # the grid saw it run out of memory
    ],
)
def test_same_answer_is_the_pick_or_inside_its_interval(pick, same):
    def measured(mid, low="", high=""):
        return {"status": "ok", "throughput_samples_per_s": mid, "throughput_low_samples_per_s": low, "throughput_high_samples_per_s": high}

    grid = {"pick": ("4", "2"), "rows": {("4", "2"): measured("850", "800", "870"), ("8", "2"): measured("805"),
                                         ("8", "1"): measured("760"), ("2", "1"): {"status": "oom", "throughput_samples_per_s": ""}}}
    assert same_answer(pick, grid) is same


def test_leave_one_out_predicts_each_pair_without_its_own_peak():
    # Peaks linear in the batch sizes (base 1 + 0.3 p + 0.25 j GiB) against 20 GiB; OOMs at what they reached.
    def trial(accum, split, status, peak):
        p = 128 // accum
        return {"accum": str(accum), "split": str(split), "per_device_batch": str(p), "joint_batch": str(p // split),
                "global_batch_size": "128", "num_devices": "1", "status": status, "oom_phase": "joint" if status == "oom" else "",
                "peak_mem_gib": str(peak), "peak_reserved_gib": ""}

    rows = {}
    for accum in (2, 4, 8, 16, 32):
        for split in (1, 2, 4, 8):
            p = 128 // accum
            peak = 1 + 0.3 * p + 0.25 * (p // split)
            rows[(str(accum), str(split))] = trial(accum, split, "ok" if peak <= 20 else "oom", min(peak, 15.0))
    verdicts = leave_one_out(rows, 20.0)
    assert len(verdicts) == len(rows)
    said_oom = [truth for verdict, truth, _ in verdicts if verdict == "predicted OOM"]
    said_fit = [truth for verdict, truth, _ in verdicts if verdict == "predicted fit"]
    assert said_oom and set(said_oom) == {"oom"}
    assert said_fit and set(said_fit) == {"ok"}
