"""One owner of a trial's life: submit, poll, time limit, stop, re-attach and the record of its end.

The search's trials, a provisional pair's re-run in full, the drift check's re-timings and screening's cancels all
go through a TrialPool, as submitit's Executor.submit / Job.done() / Job.cancel() is one owner of a job's life: no
other module submits a job, watches one against its time limit or builds the record of one that ended. The pool
holds the executor, the warm workers and the free CUDA device groups; what to run and when to stop it stays with
the search (orchestrator.py, racing.py).

A re-timing is held apart from the search's trials (`retimings`): the drift check waits on it alone, and a new
trial ends it first, as it would share that trial's device.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sweep import workloads
from sweep.core.schema import TrialResult
from sweep.core.space import Candidate
from sweep.core.spec import TrialSpec
from sweep.launch import backend as jobs
from sweep.launch.clusters import Cluster, cluster_for
from sweep.launch.ended import ended_job_result, forget_ended
from sweep.orchestration.plan import SweepPlan
from sweep.orchestration.preflight import local_cuda_devices

if TYPE_CHECKING:
    import submitit

    from sweep.launch.warm_pool import WarmPool

END_WAIT_S = 10  # how long a stop waits for the jobs it ended (a second Ctrl-C cuts it short)


class Job(Protocol):
    """What the pool asks of a job: submitit's Job, a warm worker's WarmTrial and a re-attached orphan all answer it."""

    @property
    def job_id(self) -> str: ...

    def done(self, force_check: bool = False) -> bool: ...

    def cancel(self, check: bool = True) -> Any: ...


@dataclass
class Trial:
    """A submitted (or re-attached) job of one pair, until its record is built."""

    cand: Candidate  # the pair
    job: Job  # submitit's Job, a warm worker's WarmTrial, or a re-attached orphan
    spec: TrialSpec  # what the job runs
    started: float  # time.monotonic() at submit or re-attach
    timed_out: bool = False  # stopped by the pool at trial.time_limit_s
    cancelled: bool = False  # stopped by a cancel (a stop, an outranked screening trial)
    gpus: tuple[int, ...] | None = None  # the local device group it holds, given back when it ends

    @property
    def key(self) -> str:
        return self.cand.key

    @property
    def trial_dir(self) -> Path:
        return Path(self.spec.trial_dir)


class TrialPool:
    """The running jobs of one sweep dir's search, and how each starts and ends."""

    def __init__(self, plan: SweepPlan, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.log = log
        self.cluster: Cluster = cluster_for(plan.launcher)
        self.running: dict[str, Trial] = {}  # the search's trials (re-runs in full included), by pair key
        self.retimings: dict[str, Trial] = {}  # the drift check's re-timing jobs, by pair key
        self.executor: submitit.Executor | None = None  # made at open()
        self.workers: WarmPool | None = None  # where warm workers serve this sweep's trials
        self.free_gpus: list[tuple[int, ...]] | None = None  # local CUDA only: device groups not in use

    # -- life of the pool ----------------------------------------------------------------------
    def open(self, warm_runner: Callable[[], Callable[..., Any]] | None) -> None:
        """Make the executor; warm workers where the workload has a runner for them; the host's device groups."""
        plan = self.plan
        self.executor = jobs.make_executor(plan.launcher, plan.time_limit_s)
        if plan.warm_workers and self.cluster.on_this_host and warm_runner is not None:
            from sweep.launch.warm_pool import WarmPool

            self.workers = WarmPool(plan.launcher, plan.sweep_dir, plan.machine.device, warm_runner)
        if self.cluster.on_this_host and plan.machine.device == "cuda":
            self.free_gpus = jobs.gpu_groups(local_cuda_devices(), plan.meta.num_devices, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def close(self, wait: bool = False) -> None:
        """Retire the warm workers once idle (a busy one after its trial); wait: until the idle ones have exited."""
        if self.workers is not None:
            self.workers.close(wait)

    def slots(self) -> int:
        """How many more trials may start now: plan.max_in_flight, and on local CUDA the free device groups."""
        free = self.plan.max_in_flight - len(self.running)
        return free if self.free_gpus is None else min(free, len(self.free_gpus))

    def job_ids(self) -> list[str]:
        return [str(t.job.job_id) for t in [*self.running.values(), *self.retimings.values()]]

    # -- starting ------------------------------------------------------------------------------
    def submit(self, cand: Candidate, trial_dir: Path) -> Trial:
        """Start a trial of `cand` in `trial_dir` (in a warm worker where one serves it, else as a job of its own)."""
        if self.retimings:  # an earlier run's re-timing would share this trial's device; the check re-times after the trials
            self.end_retimings(why="trials run again first, and the drift check re-times after them")
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec = self.plan.spec(cand, trial_dir)
        forget_ended(trial_dir)  # an earlier job's end is no longer this trial's news
        workers = self.workers if self.workers is not None and self.workers.serves(spec, self.cluster.on_this_host) else None
        gpus = self.free_gpus.pop(workers.warm_group(self.free_gpus) if workers else 0) if self.free_gpus else None
        job: Job
        if workers is not None:
            job, how = workers.submit(spec, gpus), "warm worker job"  # writes job.json before handing it over
        else:
            job, how = self._submit(spec, gpus), "job"
            self.cluster.remember(trial_dir, job)
        trial = self.running[cand.key] = Trial(cand, job, spec, time.monotonic(), gpus=gpus)
        self.log(f"started accum={cand.accum} split={cand.split} ({how} {job.job_id}, log {jobs.job_log(job)})")
        return trial

    def submit_retiming(self, cand: Candidate, trial_dir: Path) -> Trial:
        """A brief fresh re-run of a finished pair (trial.measure_steps timed steps) for the drift check, on the first
        free device group; held in `retimings` before its job.json, so a stop or an error from here on ends it."""
        trial_dir.mkdir(parents=True, exist_ok=True)
        brief = replace(self.plan.trial, max_measure_steps=self.plan.trial.measure_steps)
        spec = replace(self.plan.spec(cand, trial_dir), trial=brief)
        forget_ended(trial_dir)
        job = self._submit(spec, self.free_gpus[0] if self.free_gpus else None)
        trial = self.retimings[cand.key] = Trial(cand, job, spec, time.monotonic())
        self.cluster.remember(trial_dir, job)
        return trial

    def _submit(self, spec: TrialSpec, gpus: tuple[int, ...] | None) -> Job:
        assert self.executor is not None, "open() the pool first"
        if gpus is not None:
            # LocalExecutor's documented parameters: the job's CUDA_VISIBLE_DEVICES is this group.
            self.executor.update_parameters(visible_gpus=gpus, gpus_per_node=len(gpus))
        return self.executor.submit(workloads.run_job, spec)

    def reattach(self, cand: Candidate, trial_dir: Path, *, retiming: bool = False) -> Trial | None:
        """The job an earlier run of this sweep left queued or running for this pair (job.json), held again."""
        if retiming and not (trial_dir / jobs.JOB_FILE).exists():
            return None
        job = jobs.reattach(trial_dir, str(self.plan.launcher["submitit_folder"]))
        if job is None:
            return None
        spec = self.plan.spec(cand, trial_dir)
        if retiming:
            spec = replace(spec, trial=replace(self.plan.trial, max_measure_steps=self.plan.trial.measure_steps))
        trial = Trial(cand, job, spec, time.monotonic())
        (self.retimings if retiming else self.running)[cand.key] = trial
        return trial

    # -- ending --------------------------------------------------------------------------------
    def poll(self) -> list[tuple[Trial, TrialResult]]:
        """The search's trials that have ended, with their records; a trial over trial.time_limit_s is stopped first."""
        ended = []
        for key, trial in list(self.running.items()):
            self._enforce_time_limit(trial)
            if trial.job.done():
                del self.running[key]
                if trial.gpus is not None and self.free_gpus is not None:
                    self.free_gpus.append(trial.gpus)
                ended.append((trial, self._record(trial)))
        return ended

    def wait_retiming(self, key: str, interrupted: Callable[[], bool], poll_s: float) -> TrialResult | None:
        """The record of re-timing `key` once it ends (its time limit applied); None where `interrupted()` came first."""
        trial = self.retimings[key]
        while not trial.job.done():
            if interrupted():
                return None
            self._enforce_time_limit(trial)
            time.sleep(poll_s)
        del self.retimings[key]
        return self._record(trial)

    def _enforce_time_limit(self, trial: Trial) -> None:
        # On a scheduler, queueing time is not trial time: its own --time limit (timeout_min) applies there.
        if self.cluster.on_this_host and not trial.timed_out and time.monotonic() - trial.started > self.plan.time_limit_s:
            trial.timed_out = True
            self.cluster.cancel(trial.job)
            self.log(f"accum={trial.cand.accum} split={trial.cand.split}: over trial.time_limit_s={self.plan.time_limit_s:g}, stopping it")

    def _record(self, trial: Trial) -> TrialResult:
        return ended_job_result(trial.job, trial.spec, trial.trial_dir, timed_out=trial.timed_out, cancelled=trial.cancelled,
                                wall_s=time.monotonic() - trial.started)

    def cancel(self, key: str) -> None:
        """Stop one of the search's trials; its record says `cancelled` once it has ended (poll)."""
        trial = self.running[key]
        trial.cancelled = True
        self.cluster.cancel(trial.job)

    def cancel_all(self, quietly: bool = False) -> None:
        """Stop every job this pool holds, the re-timings included (a full disk: the error is the news, so quietly)."""
        for key in list(self.running):
            try:
                self.cancel(key)
            except Exception:  # noqa: BLE001 - best effort where quietly: the caller's error is the news
                if not quietly:
                    raise
        self.end_retimings()

    def end_retimings(self, keep: Collection[str] = (), why: str = "", hurry: Callable[[], bool] = lambda: False) -> bool:
        """Stop the held re-timing jobs (but `keep`'s) and wait for them to end, END_WAIT_S at most or until `hurry()`;
        whether all did. why: the log line's reason (none: a stop, which the stop line reports)."""
        ending = {key: t for key, t in self.retimings.items() if key not in keep}
        for t in ending.values():
            self.cluster.cancel(t.job)
            if why:
                self.log(f"ending re-timing job {t.job.job_id} of accum={t.cand.accum} split={t.cand.split}: {why}")
        deadline = time.monotonic() + END_WAIT_S
        while any(not t.job.done() for t in ending.values()) and time.monotonic() < deadline and not hurry():
            time.sleep(0.1)
        for key in ending:
            del self.retimings[key]
        return all(t.job.done() for t in ending.values())
