"""The trial pool owns a trial's life (orchestration/trial_pool.py), tried with real submitit jobs on this host:
a trial's own record when it ends, the time limit, a cancel, a re-attach from job.json by a second pool (a restarted
sweep), the device groups handed out and back, and a drift check's re-timing held apart from the search's trials."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.sbatch_golden import compose_plan

from sweep.core.schema import RESULT_FILE, Status, trial_dir
from sweep.launch.backend import JOB_FILE
from sweep.orchestration.trial_pool import TrialPool

# A command trial that sleeps: long enough to be stopped, re-attached or timed out while it runs.
SLEEPER = ["workload=command", "workload.argv=[python,-c,'import time; time.sleep(float(30))','--batch={per_device_batch}']"]


def pool_for(tmp_path: Path, overrides: list[str], lines: list[str] | None = None) -> TrialPool:
    plan = compose_plan(overrides, str(tmp_path / "s"))
    pool = TrialPool(plan, (lines if lines is not None else []).append)
    pool.open(None)
    return pool


def first_pair(pool: TrialPool):
    return next(c for c in pool.plan.candidates if c.valid)


def until_ended(pool: TrialPool, seconds: float = 120.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ended = pool.poll()
        if ended:
            return ended
        time.sleep(0.1)
    raise AssertionError(f"no trial ended in {seconds:g} s")


def test_a_trial_ends_with_its_own_record_and_gives_its_device_group_back(tmp_path):
    pool = pool_for(tmp_path, [])
    pool.free_gpus = [(0,), (1,)]  # as a 2-GPU host's (torch made to report devices is not needed: the pool hands groups out)
    cand = first_pair(pool)
    trial = pool.submit(cand, trial_dir(pool.plan.sweep_dir, cand.key))
    assert pool.free_gpus == [(1,)] and trial.gpus == (0,) and pool.slots() == min(pool.plan.max_in_flight - 1, 1)
    assert (trial.trial_dir / JOB_FILE).exists()  # a restarted sweep finds it
    [(ended, res)] = until_ended(pool)
    assert ended is trial and not pool.running and sorted(pool.free_gpus) == [(0,), (1,)]
    assert res.status in (Status.OK, Status.OOM) and (trial.trial_dir / RESULT_FILE).exists() and res.job_id == str(trial.job.job_id)


def test_the_pool_stops_a_trial_over_its_time_limit_and_records_the_timeout(tmp_path):
    lines: list[str] = []
    pool = pool_for(tmp_path, [*SLEEPER, "trial.time_limit_s=2"], lines)
    cand = first_pair(pool)
    pool.submit(cand, trial_dir(pool.plan.sweep_dir, cand.key))
    [(trial, res)] = until_ended(pool, 60)
    assert trial.timed_out and res.status == Status.TIMEOUT, res
    assert any("over trial.time_limit_s=2, stopping it" in line for line in lines)


def test_a_cancelled_trial_is_recorded_cancelled(tmp_path):
    pool = pool_for(tmp_path, SLEEPER)
    cand = first_pair(pool)
    pool.submit(cand, trial_dir(pool.plan.sweep_dir, cand.key))
    time.sleep(1.0)
    pool.cancel(cand.key)
    [(trial, res)] = until_ended(pool, 60)
    assert trial.cancelled and res.status == Status.CANCELLED, res


def test_a_second_pool_re_attaches_a_running_trial_and_sees_it_end(tmp_path):
    first = pool_for(tmp_path, SLEEPER)
    cand = first_pair(first)
    job_id = str(first.submit(cand, trial_dir(first.plan.sweep_dir, cand.key)).job.job_id)
    # A restarted sweep: a new pool over the same sweep dir finds the job by its job.json, and does not run it twice.
    second = pool_for(tmp_path, SLEEPER)
    again = second.reattach(cand, trial_dir(second.plan.sweep_dir, cand.key))
    assert again is not None and str(again.job.job_id) == job_id and list(second.running) == [cand.key]
    second.cancel(cand.key)
    [(_, res)] = until_ended(second, 60)
    assert res.status == Status.CANCELLED and res.job_id == job_id


def test_a_re_timing_is_held_apart_and_a_new_trial_ends_it_first(tmp_path):
    lines: list[str] = []
    pool = pool_for(tmp_path, SLEEPER, lines)
    cand = first_pair(pool)
    retiming = pool.submit_retiming(cand, tmp_path / "s" / "retime" / cand.key)
    assert list(pool.retimings) == [cand.key] and not pool.running and retiming.spec.trial.max_measure_steps == pool.plan.trial.measure_steps
    assert str(retiming.job.job_id) in pool.job_ids()
    # It would share the next trial's device: the trial's start ends it.
    other = next(c for c in pool.plan.candidates if c.valid and c.key != cand.key)
    pool.submit(other, trial_dir(pool.plan.sweep_dir, other.key))
    assert not pool.retimings and retiming.job.done()
    assert any("ending re-timing job" in line and "trials run again first" in line for line in lines)
    pool.cancel_all()
    until_ended(pool, 60)


@pytest.mark.parametrize("interrupt_after_s", [0.5])
def test_waiting_on_a_re_timing_returns_none_on_a_stop_and_keeps_it_held(tmp_path, interrupt_after_s):
    pool = pool_for(tmp_path, SLEEPER)
    cand = first_pair(pool)
    pool.submit_retiming(cand, tmp_path / "s" / "retime" / cand.key)
    t0 = time.monotonic()
    assert pool.wait_retiming(cand.key, lambda: time.monotonic() - t0 > interrupt_after_s, 0.05) is None
    assert list(pool.retimings) == [cand.key]  # held: the stop line names it, and the stop ends it
    assert pool.end_retimings() and not pool.retimings
