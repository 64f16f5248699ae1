"""bench/bench_search.py's lower bound: the pairs no search can skip and still give the grid's answer."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_search import pairs_the_answer_needs  # noqa: E402


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
