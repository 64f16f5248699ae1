"""Warm workers, the orchestrator's side: built-in trials handed to a worker per device group.

A worker is a submitit job (submitit's public API: an executor's submit, a job's done and cancel)
running sweep.launch.worker.serve_worker; it runs the trials handed to it in turn, paying its
interpreter, imports and (on CUDA) context once. The orchestrator follows each handed trial as
it follows a job: `WarmTrial` has a job's id (the worker's), log, done(), cancel() and state, so
timeouts, cancels, records of trials that ended without their own (ended.json) and re-attaching
after a restart (job.json names the worker's job) work unchanged. Cancelling a trial in a worker
ends the worker: what it was doing cannot be proved clean, and the next trial gets a fresh one.

Only what a worker can run goes there: built-in trials of one task (a trial of several ranks has
one task per rank, each its own process), on the local launcher. Everything else, command trials
included, keeps a process of its own (`serves`).
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from sweep.launch import backend as backends
from sweep.launch.worker import POLL_S, READY, RETIRE_FILE, RETIRING, RUNNING, STATE_FILE, TASK_FILE, serve_worker

WORKERS_DIR = ".workers"  # under the sweep dir: one dir per worker, its handshake with the orchestrator
# A worker's submitit time limit: its trials' own limits are the orchestrator's (trial.time_limit_s), and
# with its orchestrator gone a worker retires once its trial ends; this only ends a worker nobody follows.
WORKER_TIME_LIMIT_S = 7 * 24 * 3600.0
# How long a sweep that has ended waits for its idle workers to exit (an exit takes well under a second on CPU; on
# CUDA the context's teardown too). Past it the sweep goes on: a worker exits by itself once its orchestrator is gone.
RETIRE_WAIT_S = 30.0


def _read_state(worker_dir: Path) -> dict[str, Any]:
    """A worker's state.json (written by the worker alone); {} before it wrote one."""
    try:
        record = json.loads((Path(worker_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _size(path: Any) -> int:
    try:
        return os.path.getsize(path)
    except (OSError, TypeError):
        return 0


class Worker:
    """One warm worker: its job, its dir, its device group and how many trials it was handed."""

    def __init__(self, job: Any, where: Path, gpus: tuple[int, ...] | None) -> None:
        self.job, self.dir, self.gpus = job, where, gpus
        self.handed = 0

    def state(self) -> dict[str, Any]:
        return _read_state(self.dir)

    def idle(self) -> bool:
        """Ready for another trial: it finished all it was handed and proved a clean state."""
        state = self.state()
        return state.get("state") == READY and int(state.get("seq", -1)) == self.handed and not self.job.done()

    def hand(self, spec: Any) -> int:
        """Hand it the next trial; that trial's number."""
        self.handed += 1
        data = pickle.dumps({"seq": self.handed, "spec": spec})
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{TASK_FILE}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self.dir / TASK_FILE)  # the worker sees the old task or the new one, never half
        return self.handed

    def retire(self) -> None:
        (self.dir / RETIRE_FILE).touch()


class WarmTrial:
    """A trial handed to a warm worker, followed as a job: the worker's job id, log and state."""

    def __init__(self, worker: Worker, seq: int) -> None:
        self.worker, self.seq = worker, seq
        self.job_id = str(worker.job.job_id)
        self.paths = worker.job.paths
        self.num_tasks = 1
        # The worker's log holds every earlier trial's lines, an OOM's traceback among them: a trial that ends without
        # its record is classified from its own lines only, those after the byte where it was handed over (the worker
        # is idle then, so all its earlier output is written). In job.json too (remember_job), for a re-attached sweep.
        self.warm = {"worker_dir": str(worker.dir), "seq": seq, "stdout_from": _size(self.paths.stdout), "stderr_from": _size(self.paths.stderr)}

    def done(self, force_check: bool = False) -> bool:
        state = self.worker.state()
        if int(state.get("seq", 0)) >= self.seq and state.get("state") != RUNNING:
            return True  # the worker has moved on: this trial ended, its record (if it wrote one) is there
        return bool(self.worker.job.done())

    @property
    def state(self) -> str:
        """Why the trial ended without a clean finish when the worker said so, else the worker job's state."""
        state = self.worker.state()
        if int(state.get("seq", 0)) == self.seq and state.get("why"):
            return str(state["why"])
        return str(getattr(self.worker.job, "state", ""))

    def cancel(self, check: bool = True) -> None:
        self.worker.job.cancel(check=False)


def trial_end(warm: dict[str, Any]) -> str:
    """How the trial a worker was handed (WarmTrial.warm, or job.json's "warm") ended without its record, by the worker's
    state; "" where the state says nothing of it. Asked once the trial's job has ended."""
    state = _read_state(Path(str(warm.get("worker_dir", ""))))
    seq, handed = int(state.get("seq", -1)), int(warm.get("seq", 0))
    worker = f"its warm worker (pid {state['pid']})" if state.get("pid") else "its warm worker"
    if seq < handed:
        return f"{worker} ended before it took the trial"
    if seq > handed:
        return ""
    if state.get("state") == RUNNING and state.get("raised"):
        return f"{worker} ended on {state['raised']} while running it"
    if state.get("state") == RUNNING:
        # The worker records any exception that ends it (worker.serve_worker, "raised"): without one, no handler of
        # its ran, so a signal ended it (SIGKILL, the kernel's OOM killer, a signal whose default is to terminate).
        return f"{worker} was killed while running it"
    if state.get("state") == RETIRING and state.get("why"):
        return f"{worker}: {state['why']}"  # e.g. "its trial process was killed by SIGKILL"
    return ""


class WarmPool:
    """The warm workers of one sweep: at most one idle worker per device group, started as trials need them."""

    def __init__(self, launcher: dict[str, Any], sweep_dir: Path, device: str, warm_runner: Callable[[], Callable[..., Any]]) -> None:
        self.warm_runner = warm_runner  # the workload's (Workload.warm_runner): what each worker runs its trials with
        self.executor = backends.make_executor(launcher, WORKER_TIME_LIMIT_S)
        self.root = Path(sweep_dir) / WORKERS_DIR
        self.device = device
        me = psutil.Process()
        self.owner = (me.pid, me.create_time())  # a worker retires once this process has ended
        self.workers: list[Worker] = []

    @staticmethod
    def serves(spec: Any, on_this_host: bool) -> bool:
        """Whether a warm worker may run this trial of a workload that has a warm runner (the pool's): a trial of one
        task, launched on this host (launch/clusters.Cluster.on_this_host)."""
        return on_this_host and int(spec.num_devices) == 1

    def warm_group(self, groups: list[tuple[int, ...]]) -> int:
        """Which of the free device groups to give the next trial: the first whose worker is idle, so a host
        with more groups than trials in flight reuses its workers instead of starting one on every group."""
        return next((i for i, g in enumerate(groups) if any(w.gpus == g and w.idle() for w in self.workers)), 0)

    def submit(self, spec: Any, gpus: tuple[int, ...] | None) -> WarmTrial:
        """Hand the trial to an idle worker of this device group, or to a new one; job.json is written
        first, so a restarted orchestrator finds the trial's worker whenever the worker may have it."""
        self.workers = [w for w in self.workers if not w.job.done()]
        worker = next((w for w in self.workers if w.gpus == gpus and w.idle()), None) or self._start(gpus)
        trial = WarmTrial(worker, worker.handed + 1)
        backends.remember_job(Path(spec.trial_dir), trial, "local")
        worker.hand(spec)
        return trial

    def _start(self, gpus: tuple[int, ...] | None) -> Worker:
        self.root.mkdir(parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(dir=self.root, prefix="gpus" + "-".join(map(str, gpus)) + "-" if gpus else "cpu-"))
        if gpus is not None:
            # LocalExecutor's documented parameters: the worker's CUDA_VISIBLE_DEVICES is this group, for all its trials.
            self.executor.update_parameters(visible_gpus=gpus, gpus_per_node=len(gpus))
        job = self.executor.submit(serve_worker, str(where), self.device, *self.owner, self.warm_runner)
        worker = Worker(job, where, gpus)
        self.workers.append(worker)
        return worker

    def close(self, wait: bool = False) -> None:
        """Ask every worker to retire once idle (a busy one finishes its trial first). wait: until the idle ones have
        exited (RETIRE_WAIT_S at most), since until then a worker holds its memory (on CUDA, its context), which
        whatever runs next on its devices (the drift check's fresh processes, the user's next sweep) would find taken."""
        idle = [w for w in self.workers if w.idle()] if wait else []
        for worker in self.workers:
            worker.retire()
        deadline = time.monotonic() + RETIRE_WAIT_S
        for worker in idle:
            while not worker.job.done() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        self.workers = []
