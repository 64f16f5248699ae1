"""run_trial end to end at tiny size: the record it writes for ok, oom and failed trials."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from support.trials import ENCODER_HOG, JOINT_HOG, SMALL, make_spec, run_in_own_process

from sweep.core.schema import RESULT_FILE, OomPhase, Status
from sweep.records import read_result
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.runner import run_trial


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two cores shared with other test runs: a second intra-op thread mostly waits for a core.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_ok_trial_writes_a_complete_record(tmp_path, capsys):
    spec = make_spec(tmp_path)
    returned = run_trial(spec)
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)

    assert record == returned
    assert (record.status, record.oom_phase, record.error) == (Status.OK, None, "")
    assert (record.accum, record.split, record.per_device_batch, record.joint_batch) == (2, 2, 4, 2)
    # 1 warm-up step and 4 timed, less any leading timed step core/steady.py judged still warming up.
    assert record.warmup_steps == 1 + record.transient_steps and len(record.step_times_s) == 4 - record.transient_steps
    assert record.throughput == pytest.approx(8 * len(record.step_times_s) / sum(record.step_times_s))  # over wall time
    assert record.throughput_low <= record.throughput <= record.throughput_high
    assert record.peak_mem_gib is not None and record.peak_mem_gib >= 0
    # On CPU, headroom counts the address-space peak, what the emulated cap counts.
    assert record.peak_reserved_gib is not None and record.capacity_gib == 2.0
    assert record.headroom == pytest.approx(1 - record.peak_reserved_gib / 2.0)
    assert record.wall_s > 0 and record.started_at <= record.finished_at
    # Outside a submitit job there is no job log or id; inside one, submitit's JobEnvironment gives them.
    assert (record.log, record.job_id, record.device) == ("", "", "cpu")
    out = capsys.readouterr().out
    assert "accum=2 split=2 per_device_batch=4 joint_batch=2" in out
    assert "step 5/5" in out and "result ok:" in out


def test_failed_trial_is_recorded_then_raised(tmp_path):
    spec = make_spec(tmp_path, workload=RNNTWorkloadConfig(**{**asdict(SMALL), "optimizer": "lion"}))
    with pytest.raises(ValueError, match="optimizer='lion'"):
        run_trial(spec)
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert record.status == Status.FAILED
    assert record.error.startswith("ValueError: workload.optimizer='lion' is not valid")
    assert "\n" not in record.error


def test_several_devices_outside_a_job_run_as_one_process_whose_figure_is_not_the_pairs(tmp_path, capsys):
    """Outside a multi-task job one process stands in for 2 devices: it trains, but its steps are one rank's share
    of the global batch, so its figure is not counted (core/validity.py): rejected, naming the ranks seen."""
    spec = replace(make_spec(tmp_path, accum=1, split=1, global_batch=4), num_devices=2, per_device_batch=2, joint_batch=2)
    record = run_trial(spec)
    assert record.status == Status.REJECTED and record.ranks_seen == 1 and record.world_size == 1 and record.throughput
    assert "world size was 1 where machine.num_devices=2: each step trained 0.5x the global batch" in record.error
    assert "not inside a multi-task job" in capsys.readouterr().out


@pytest.mark.parametrize(
    "phase,workload,accum,split",
    [("joint", JOINT_HOG, 1, 1), ("encoder", ENCODER_HOG, 1, 4)],
)
def test_oom_trial_in_a_subprocess_records_the_phase(tmp_path, phase, workload, accum, split):
    spec = make_spec(tmp_path, accum=accum, split=split, global_batch=4, memory_gib=4 / 1024, workload=workload, cpu_threads=1)
    code = "import pickle, sys; from sweep.workloads.rnnt.runner import run_trial; run_trial(pickle.load(open(sys.argv[1], 'rb')))"
    proc = run_in_own_process(tmp_path, code, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]  # an OOM is a result, not a crash

    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert (record.status, record.oom_phase) == (Status.OOM, OomPhase(phase))
    assert record.error.startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate ")
    assert record.error.endswith(f"in phase {phase}")
    assert record.throughput is None and record.wall_s > 0
    assert f"result oom in phase {phase}" in proc.stdout
    # The original traceback goes to the log, where log-based classifiers read function names.
    assert {"joint": "joint_and_loss", "encoder": "encode"}[phase] in proc.stderr


@pytest.mark.parametrize("optimizer,ends", [("adam", "ok"), ("lion", "ValueError")])
def test_the_job_leaves_the_process_frozen_for_its_exit_whether_the_trial_ended_or_raised(tmp_path, optimizer, ends):
    """The job process only exits after run_job: its shutdown collection would walk every object
    torch made (0.3-0.5 s a trial, between one trial and the next), so run_job freezes them first."""
    spec = make_spec(tmp_path, workload=RNNTWorkloadConfig(**{**asdict(SMALL), "optimizer": optimizer}), cpu_threads=1)
    code = (
        "import gc, pickle, sys; from sweep.workloads import run_job; spec = pickle.load(open(sys.argv[1], 'rb'))\n"
        "print('at start', gc.get_freeze_count())\n"
        "try:\n    print('ended', run_job(spec).status)\nexcept ValueError:\n    print('ended ValueError')\n"
        "print('frozen', gc.get_freeze_count())"
    )
    proc = run_in_own_process(tmp_path, code, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("ended ", "frozen ")))
    assert lines["ended"] == ends
    assert int(lines["frozen"]) > 10_000  # torch's modules and the trial's model, not a handful
    assert proc.stdout.startswith("at start 0\n"), proc.stdout  # run_job froze them, not the process it started in
