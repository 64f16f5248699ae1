"""What each submitit job runs: one trial of the configured workload.

Kept tiny and import-light: it is pickled by reference into every job, and the
workload's heavy imports (torch) happen inside the job process only.

`run_job` is a submitit Checkpointable, so that on Slurm a trial that is preempted
(or signalled before its time limit) is requeued instead of lost: its checkpoint is
simply "run the same trial again". A trial is a measurement, not a training run, so
there is no state worth carrying over, and a half-measured trial must not be resumed:
its timings would mix two processes' warm-ups.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from submitit.core.utils import UncompletedJobError
from submitit.helpers import Checkpointable, DelayedSubmission


class TrialJob(Checkpointable):
    """The callable every trial job runs: `run_job(spec)`."""

    def __call__(self, spec: dict[str, Any]) -> dict[str, Any]:
        _threads_from_slurm()
        try:
            return _run_workload(spec)
        except UncompletedJobError as exc:
            # submitit raises this from its signal handler when it will not requeue: the job
            # reached its Slurm time limit more often than hydra.launcher.max_num_timeout allows.
            # The trial caught it as a crash; for the table it is a timeout.
            _record_slurm_timeout(spec, exc)
            raise

    def checkpoint(self, spec: dict[str, Any]) -> DelayedSubmission:
        # Called by submitit (task 0 only) on SIGUSR2; the requeued job reruns the trial from scratch.
        print(f"sweep: job signalled; requeueing accum={spec['accum']} split={spec['split']} to run again", flush=True)
        return DelayedSubmission(self, spec)


run_job = TrialJob()


def _threads_from_slurm() -> None:
    """Inside a Slurm task, intra-op threads default to the CPUs Slurm gave it, not every core.

    Where Slurm does not pin tasks to their CPUs (no task/affinity or cgroup plugin), torch
    sizes its thread pool from every core of the node; next to other jobs, or other ranks of
    this one, that oversubscribes the CPUs and the trial measures contention, not its step.
    Set before the workload imports torch; an explicit OMP_NUM_THREADS or machine.cpu_threads wins.
    """
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        os.environ.setdefault("OMP_NUM_THREADS", cpus)


def _run_workload(spec: dict[str, Any]) -> dict[str, Any]:
    name = spec["workload"].get("name")
    if name == "rnnt":
        from sweep.workloads.rnnt.runner import run_trial

        return run_trial(spec)
    if name == "command":
        from sweep.workloads.command.runner import run_command_trial

        return run_command_trial(spec)
    raise ValueError(f"workload.name={name!r} is not valid: expected rnnt or command")


def _record_slurm_timeout(spec: dict[str, Any], exc: BaseException) -> None:
    from sweep.core.schema import RESULT_FILE, TIMEOUT, ResultError, read_result, write_result

    trial_dir = Path(spec["trial_dir"])
    try:
        res = read_result(trial_dir / RESULT_FILE)
    except (OSError, ResultError):
        return  # not task 0, or nothing written: the sweep classifies the job from its Slurm state
    if res.job_id != _current_job_id():
        return  # an earlier job's record (a cancelled trial being rerun), not this one's
    res.status, res.oom_phase = TIMEOUT, None
    why = str(exc).removeprefix("Job not requeued because: ").rstrip(".")
    res.error = f"Slurm time limit reached (signalled before --time ran out; not requeued: {why}); raise hydra.launcher.timeout_min"
    write_result(res, trial_dir)


def _current_job_id() -> str:
    import submitit

    try:
        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:
        return ""
