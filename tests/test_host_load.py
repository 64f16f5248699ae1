"""An oversubscribed CPU host scores with the busy host's run-to-run noise (issue 43, point 6): the sampled load, the
threshold, the line, and a resume that scores as the run that measured. The real thing, default sweeps beside two
and four busy loops, is bench/reliability_validity.py's busy_box cases."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sweep.core.run_to_run import BUSY_HOST_NOISE, BUSY_LOAD_PER_CPU, busy_load
from sweep.orchestration.host_load import HostLoad, busy_host_note, runnable_tasks


def test_the_median_load_per_cpu_decides_not_a_spike():
    assert busy_load([], 2) is None  # nothing sampled: nothing known, nothing changes
    assert busy_load([1.0] * 9 + [12.0], 2) is None  # a quiet box's trial (0.5 a CPU), one spike
    assert busy_load([3.0] * 10, 2) == pytest.approx(1.5)  # beside two busy loops
    assert busy_load([2 * BUSY_LOAD_PER_CPU] * 5, 2) is None  # at the threshold: not above it


def _machine(device: str = "cpu", noise: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(device=device, run_to_run_noise=noise)


def test_a_busy_cpu_host_is_scored_noisier_unless_the_user_set_the_noise(tmp_path: Path):
    busy = HostLoad(tmp_path, read_load=lambda: 3.0, cpus=2)
    for _ in range(8):
        busy.sample()
    line = busy_host_note(_machine(), busy, 0.07)
    assert line.startswith("the host was busy while trials ran (1.5 runnable tasks per CPU on 2 CPU(s)): confidence scored with 25%")
    assert busy_host_note(_machine(noise=0.07), busy, 0.07) == ""  # machine.run_to_run_noise set: the user's word stands
    assert busy_host_note(_machine("cuda"), busy, 0.01) == ""  # a GPU's step is not the host CPU's to share
    assert busy_host_note(_machine(), busy, BUSY_HOST_NOISE + 0.1) == ""  # the drift check already saw more
    quiet = HostLoad(tmp_path / "q", read_load=lambda: 1.0, cpus=2)
    quiet.sample()
    assert busy_host_note(_machine(), quiet, 0.07) == ""


def test_a_resume_that_runs_nothing_scores_with_the_load_the_first_run_saw(tmp_path: Path):
    first = HostLoad(tmp_path, read_load=lambda: 5.0, cpus=2)
    first.sample()
    first.save()
    resumed = HostLoad(tmp_path, read_load=lambda: 0.0, cpus=2)  # the resume samples nothing: no trial runs
    assert resumed.samples == [5.0] and busy_host_note(_machine(), resumed, 0.07)
    (tmp_path / "host_load.json").write_text("not json")
    assert HostLoad(tmp_path, cpus=2).samples == []  # unreadable: measured afresh, never a crash


def test_the_runnable_count_leaves_out_its_reader():
    assert runnable_tasks() >= 0.0
