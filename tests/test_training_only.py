"""Only training counts (issue 50): steps of a preparation process that ended before the training, of a learning-rate
range test before the fit, and of a trial that changed pace mid-way are not the figure; Slurm's task count inherited
from an allocation is not the command's ranks; a caught OOM's row names the step the probe saw it in."""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

import pytest

from sweep.core.confidence import unsteady
from sweep.core.growth import late_oom_note
from sweep.core.probe_report import summarise
from sweep.core.schema import OK, OOM, TrialResult
from sweep.core.steady import changed_pace as regime_problem
from sweep.core.training_window import range_test_steps, training_sources
from sweep.core.validity import validated

GBS = 64
ATTACK = Path(__file__).parent / "attack_train.py"


def steps(first: int, count: int, start: float, seconds: float, lr=None) -> list[dict]:
    """Step records of one process: `count` steps from index `first`, ending `seconds` apart from wall time `start`."""
    return [{"kind": "step", "step": first + i, "rank": 0, "seconds": seconds, "end": start + seconds * (i + 1), "world_size": 1,
             "backwards": 1, "lr": None if lr is None else lr(first + i)} for i in range(count)]


START = {"kind": "start", "world_size": 1}
EXIT = {"kind": "exit", "steps": 40, "why": "exit"}


# ---------------------------------------------------------------- which processes train (pure)


def test_a_process_that_stepped_and_exited_while_the_command_runs_is_a_preparation_not_the_training():
    prep = [START, {"kind": "optimizer", "class": "SGD", "after_step": 0}, *steps(0, 40, 100.0, 0.001), EXIT]
    # The preparation is over, the training has not stepped yet: nothing is the training's (the sweep waits).
    running = summarise({"rank0-pid1.jsonl": prep}, running=True)
    assert running.steps == [] and "40 step(s) of a process that ended before the training ran" in running.left_out[0]
    train = [START, {"kind": "optimizer", "class": "SGD", "after_step": 0}, *steps(0, 12, 103.0, 0.08)]
    report = summarise({"rank0-pid1.jsonl": prep, "rank0-pid2.jsonl": train}, running=True)
    assert report.step_times_s == pytest.approx([0.08] * 12) and report.ranks == [0]
    # The command ended (its training exited too): the last process to step, and those beside it, are the training.
    ended = summarise({"rank0-pid1.jsonl": prep, "rank0-pid2.jsonl": [*train, EXIT]})
    assert ended.step_times_s == pytest.approx([0.08] * 12)
    # Two ranks side by side, one exiting a little before the other: both train.
    other = [dict(r, rank=1) for r in train] + [EXIT]
    assert training_sources({"a": {r["step"]: r for r in train[2:]}, "b": {r["step"]: r for r in other[2:-1]}}, {"b"}, True) == {"a", "b"}


def test_steps_before_a_fresh_optimizer_and_a_geometric_rise_of_the_learning_rate_are_a_range_test():
    test = steps(0, 40, 100.0, 0.02, lr=lambda i: 1e-7 * 1.2**i)
    fresh = {"kind": "optimizer", "class": "SGD", "after_step": 40}
    fit = steps(40, 12, 101.0, 0.08, lr=lambda i: 1e-3)
    report = summarise({"rank0.jsonl": [START, {"kind": "optimizer", "class": "SGD", "after_step": 0}, *test, fresh, *fit]})
    assert report.step_times_s == pytest.approx([0.08] * 12) and report.steps[0].index == 40
    # In flight, before the trainer resets: the range test's seven steps (six rises of 1.2x) are already not training.
    assert summarise({"rank0.jsonl": [START, *test[:7]]}).steps == []
    assert range_test_steps([(i, 1e-7 * 1.2**i) for i in range(7)]) == set(range(7))
    # A warm-up's ramp is training: linear from 0 or from a small rate, a cosine one, a constant rate.
    assert range_test_steps([(i, 1e-3 * i / 100) for i in range(100)]) == set()
    assert range_test_steps([(i, 1e-6 + 1e-3 * i / 30) for i in range(30)]) == set()
    assert range_test_steps([(i, 1e-3 * (1 - math.cos(math.pi * i / 50)) / 2) for i in range(50)]) == set()
    assert range_test_steps([(i, 1e-3) for i in range(50)]) == set()
    assert range_test_steps([(i, None) for i in range(50)]) == set()


def test_a_figure_that_changes_pace_mid_trial_is_not_one_steady_regime():
    fast, slow = [0.02 * (1 + 0.01 * (i % 3)) for i in range(8)], [0.08 * (1 + 0.01 * (i % 3)) for i in range(10)]
    why = regime_problem(fast + slow)
    assert "changed pace mid-trial: 8 at 20" in why and "then 10 at 80" in why
    r = TrialResult(accum=1, split=1, per_device_batch=GBS, joint_batch=GBS, global_batch_size=GBS, num_devices=1, status=OK,
                    step_times_s=fast + slow, throughput=GBS / 0.05, measured_by="probe")
    # Not rejected (a busy box's neighbour does this to a right figure), but no steady state: no 80 while it could lead.
    assert validated(r).status == OK and unsteady(r)
    # One regime's noise and stalls are not two regimes: a stall every third step, a box that got 1.6x quieter.
    assert regime_problem([0.05, 0.05, 0.21] * 6) == ""
    assert regime_problem([0.08] * 10 + [0.05] * 10) == ""
    assert regime_problem(slow) == "" and regime_problem(fast[:4] + slow[:2]) == ""
    assert "600 at 20 ms, then 600 at 50 ms" in regime_problem([0.02] * 600 + [0.05] * 600)  # a long run, judged in bins


def test_a_caught_oom_names_the_step_the_probe_saw_it_in():
    """The issue's row: "at step 25 after 25 steps had fitted: a late OOM" where the probe saw the OOM at step 0."""
    r = TrialResult(accum=1, split=1, per_device_batch=GBS, joint_batch=GBS, global_batch_size=GBS, num_devices=1, status=OK,
                    warmup_steps=2, step_times_s=[0.05] * 23, throughput=1280.0, measured_by="probe",
                    probe_oom="in joint during forward, step 0, rank 0: DefaultCPUAllocator: can't allocate memory", oom_module="joint")
    assert validated(r).status == OOM and late_oom_note(r) == ""
    r.probe_oom = r.probe_oom.replace("step 0,", "step 7,")
    assert late_oom_note(r) == "out of memory at step 7 (the probe's, from 0) after 7 steps had fitted: a late OOM"


@pytest.mark.slow
def test_slurms_task_count_counts_only_in_a_slurm_step_of_the_commands_own(tmp_path):
    """SLURM_NTASKS inherited from the sweep's own allocation (or the step its launcher ran in) is not the command's
    world size; one set by an `srun` inside the command (a step of its own) is."""
    import os
    import subprocess

    from sweep.probe import probe_env, read_probe

    launcher = {**os.environ, "SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}
    launcher.pop("SLURM_STEP_ID", None)
    for name, own in (("inherited", {}), ("own_step", {"SLURM_STEP_ID": "0"})):
        env = {**launcher, **probe_env(tmp_path / name, base_env=launcher, accum=1), "OMP_NUM_THREADS": "1", **own}
        subprocess.run([sys.executable, str(ATTACK), "--batch=2", "--accum=1", "--global-batch=2", "--steps=4", "--rates=1:1=100000"],
                       env=env, check=True, capture_output=True, timeout=120)
        assert read_probe(tmp_path / name).world_size == (1 if name == "inherited" else 4), name


# ---------------------------------------------------------------- sweeps (a real `python -m sweep`)


def _sweep(tmp_path: Path, name: str, argv_extra: str, *args: str, env: dict[str, str] | None = None):
    from support.sweep_run import run_sweep

    sweep_dir = tmp_path / name
    argv = (f'["{sys.executable}","{ATTACK}","--batch={{per_device_batch}}","--accum={{accum}}","--split={{split}}",'
            f'"--global-batch={{global_batch_size}}","--marker-dir={tmp_path}"{argv_extra}]')
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}", f"global_batch_size={GBS}",
                      "max_in_flight=1", "trial.time_limit_s=120", "live=false", "search=grid", "split=1", "search.drift_check=false",
                      "search.measure_to_decision=false", "search.racing=false", *args], cwd=tmp_path, timeout=300, env=env)
    rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    return proc, rows


def _figure(row: dict) -> float:
    return float(row["throughput_samples_per_s"] or "nan")


@pytest.mark.slow
@pytest.mark.e2e
def test_a_preparation_subprocess_stepping_an_optimizer_is_not_timed_as_the_training(tmp_path):
    """Before training, each trial runs a subprocess that steps an SGD optimizer 40 times (milliseconds each) and exits.
    Its steps were the figure (thousands of samples/s where training runs at 800 and 1000); they are left out now."""
    proc, rows = _sweep(tmp_path, "prep", ',"--attack=prep_subprocess","--steps=30","--rates=1:1=800,2:1=1000"', "accum=1,2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for accum, truth in ((1, 800.0), (2, 1000.0)):
        assert rows[(accum, 1)]["status"] == "ok", rows[(accum, 1)]
        assert abs(_figure(rows[(accum, 1)]) / truth - 1) < 0.2, rows[(accum, 1)]
    assert re.search(r"recommended accum=2 split=1", proc.stdout), proc.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_a_learning_rate_range_test_before_the_fit_is_not_timed_as_the_training(tmp_path):
    """Each trial first runs a range test (40 steps, the rate rising 1.3x a step, 4x faster than training), then restores
    the model, makes a fresh optimizer and trains. The range test's steps were the figure (4x the truth, and the
    recommendation rested on them); the figure is the training's now."""
    proc, rows = _sweep(tmp_path, "lr_find", ',"--attack=lr_find","--steps=30","--rates=1:1=1000,2:1=800"', "accum=1,2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for accum, truth in ((1, 1000.0), (2, 800.0)):
        assert rows[(accum, 1)]["status"] == "ok", rows[(accum, 1)]
        assert abs(_figure(rows[(accum, 1)]) / truth - 1) < 0.2, rows[(accum, 1)]
    assert re.search(r"recommended accum=1 split=1", proc.stdout), proc.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_slurm_ntasks_inherited_from_an_allocation_is_not_the_commands_world_size(tmp_path):
    """A sweep started inside a 4-task allocation: its one-process trainer inherits SLURM_NTASKS=4, which the probe read
    as the ranks' world size and every pair was rejected ("world size was 4 where machine.num_devices=1")."""
    proc, rows = _sweep(tmp_path, "slurm_env", ',"--steps=20","--rates=1:1=1000,2:1=800"', "accum=1,2",
                        env={"SLURM_NTASKS": "4", "SLURM_PROCID": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for accum in (1, 2):
        assert rows[(accum, 1)]["status"] == "ok", rows[(accum, 1)]
    assert re.search(r"recommended accum=1 split=1", proc.stdout), proc.stdout
