"""bench/bench_caiman.py's rules: each row's sweep composes and plans as the GPU and CPU runs give it
(dry run, nothing launched), and how ours is judged against the published pair."""

import os
import sys
from pathlib import Path

import pytest
from support.sweep_run import sweep_process

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from bench_caiman import ROWS, cpu_overrides, gpu_overrides, verdict  # noqa: E402


@pytest.mark.e2e
@pytest.mark.parametrize("row", ROWS, ids=[f"{r.machine}-{r.model}" for r in ROWS])
def test_each_row_plans_with_the_published_pair_a_candidate(tmp_path, row):
    for overrides, device in ((gpu_overrides(row), "cuda"), (cpu_overrides(row), "cpu")):
        proc = sweep_process(["dry_run=true", *overrides], tmp_path, dict(os.environ), timeout=120)
        assert proc.returncode == 0, proc.stderr
        first = proc.stdout.splitlines()[0]
        assert f"(1 x {device}, " in first and f"global_batch_size={row.global_batch}" in first
        accum, split = row.published
        pair = [line.split() for line in proc.stdout.splitlines() if line.split()[:2] == [str(accum), str(split)]]
        assert pair and pair[0][-1] == "pending", proc.stdout  # a valid candidate


def rec(accum, split, low=90.0, high=110.0):
    return {"accum": accum, "split": split, "throughput_interval_samples_per_s": [low, high]}


def csv_row(status="ok", low="", high=""):
    return {"status": status, "throughput_low_samples_per_s": low, "throughput_high_samples_per_s": high}


@pytest.mark.parametrize(
    "ours, rows, judged",
    [
        (rec(1, 8), {}, "the published pair"),
        (rec(2, 4), {(1, 8): csv_row(low="100", high="120")}, "inside the noise of the published pair"),
        (rec(2, 4), {(1, 8): csv_row(low="50", high="60")}, "differs beyond the noise"),
        (rec(2, 4), {(1, 8): csv_row("oom")}, "differs; published pair oom"),
        (rec(2, 4), {(1, 8): csv_row("skipped")}, "differs; published pair not measured"),
        (rec(2, 4), {}, "differs; published pair not measured"),
        (None, {}, "no answer"),
    ],
)
def test_verdict(ours, rows, judged):
    assert verdict(ours, rows, (1, 8)) == judged
