"""What each submitit job runs: one trial, by the run function it is given (sweep.workloads.run_job).

Kept tiny and import-light: it is pickled into every job with its run function (by reference),
and the workload's heavy imports (torch) happen inside the job process only. It knows no
workload: launch/ sits below workloads/, which hands it the function.

`run_job` is a submitit Checkpointable, so that on Slurm a trial that is preempted
(or signalled before its time limit) is requeued instead of lost: its checkpoint is
simply "run the same trial again". A trial is a measurement, not a training run, so
there is no state worth carrying over, and a half-measured trial must not be resumed:
its timings would mix two processes' warm-ups.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path

from submitit.core.utils import UncompletedJobError
from submitit.helpers import Checkpointable, DelayedSubmission

from sweep.core.schema import TrialResult
from sweep.core.spec import TrialSpec


class TrialJob(Checkpointable):
    """The callable every trial job runs: `TrialJob(run)(spec)` runs `run(spec)` in the job's process."""

    def __init__(self, run: Callable[[TrialSpec], TrialResult]) -> None:
        self.run = run  # a module-level function: pickled by reference, imported in the job

    def __call__(self, spec: TrialSpec) -> TrialResult:
        leave_the_terminal()
        _threads_from_slurm()
        try:
            return self.run(spec)
        except UncompletedJobError as exc:
            # submitit raises this from its signal handler when it will not requeue: the job
            # reached its Slurm time limit more often than hydra.launcher.max_num_timeout allows.
            # The trial caught it as a crash; for the table it is a timeout, and the record is ours.
            _record_slurm_timeout(spec, exc)
            raise
        finally:
            # The job process exits right after this call. Python's shutdown collection would walk
            # every object torch made (0.3-0.5 s per trial on CPU, between one trial and the next);
            # frozen, it skips them. Nothing is left to collect that exit does not free anyway.
            gc.freeze()

    def checkpoint(self, spec: TrialSpec) -> DelayedSubmission:
        # Called by submitit (task 0 only) on SIGUSR2; the requeued job reruns the trial from scratch.
        print(f"sweep: job signalled; requeueing accum={spec.accum} split={spec.split} to run again", flush=True)
        return DelayedSubmission(self, spec)


def leave_the_terminal() -> None:
    """A local job's task leaves the terminal's session, then takes SIGINT again.

    SweepLocalExecutor starts controllers with SIGINT blocked, so a Ctrl-C on the terminal
    reaches the sweep alone; the task inherits that mask. In a session of its own it can take
    SIGINT again without the terminal's reaching it: the sweep's cancel_job stops it with one.
    A Ctrl-C that came while it was blocked was the terminal's, meant for the sweep: dropped.
    """
    import signal

    if os.environ.get("SUBMITIT_EXECUTOR") != "local" or signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set()):
        return
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader
    if signal.SIGINT in signal.sigpending():
        signal.sigtimedwait({signal.SIGINT}, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


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


def _record_slurm_timeout(spec: TrialSpec, exc: BaseException) -> None:
    """This job's result.json, written as a timeout (task 0 only; the file is the trial's own)."""
    import socket

    import submitit

    from sweep.core.schema import RESULT_FILE, Status, now_iso
    from sweep.errors import ResultError
    from sweep.records import read_result, write_result

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:
        return
    if env.global_rank != 0:
        return
    trial_dir = Path(spec.trial_dir)
    try:
        res = read_result(trial_dir / RESULT_FILE)
    except (OSError, ResultError):
        res = None
    if res is None or res.job_id != str(env.job_id):
        # Nothing written by this job yet (an earlier job's record is a cancelled run's): a fresh one.
        res = TrialResult(
            **spec.numbers(), fingerprint=spec.fingerprint, status=Status.TIMEOUT, log=str(env.paths.stdout), job_id=str(env.job_id),
            host=socket.gethostname(), device=spec.machine.device,
        )
    res.status, res.oom_phase = Status.TIMEOUT, None
    why = str(exc).removeprefix("Job not requeued because: ").rstrip(".")
    res.error = f"Slurm time limit reached (signalled before --time ran out; not requeued: {why}); raise hydra.launcher.timeout_min"
    res.finished_at = res.finished_at or now_iso()
    write_result(res, trial_dir)
