"""The submitit edge: executors from `hydra.launcher`, and the jobs they run, found and stopped.

submitit already is the backend abstraction (local processes or Slurm jobs behind one
Job API), so this module only maps hydra-submitit-launcher's parameters onto an
executor, remembers each job on disk so a restarted orchestrator can find it again, and
stops jobs and their process trees; sweep.launch.ended records a job that ended without
writing its own result.json.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
from dataclasses import fields
from pathlib import Path
from typing import Any

import psutil
import submitit
import submitit.local.local
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmInfoWatcher

from sweep.core.schema import (
    atomic_write_text,
    now_iso,
)
from sweep.errors import SweepError
from sweep.launch.memory import cuda_visible_numbers

JOB_FILE = "job.json"
# sacct is asked about unfinished Slurm jobs at most this often. submitit's own default backs
# off to 10 minutes, and a trial that ends without a result file (scancel, node failure, the
# OOM killer) is only seen through sacct, so it would land that late.
SLURM_POLL_S = 15
# How long an ended Slurm job may take to show its final state in sacct (COMPLETING first).
FINAL_STATE_WAIT_S = 10
# Slurm states of a job that may still run (or run again) its trial. submitit's own list
# lacks SUSPENDED and the requeue/hold states, so a suspended or held trial looked ended:
# it was recorded as failed, and a resumed sweep submitted it a second time.
SLURM_UNFINISHED = frozenset(
    "UNKNOWN PENDING CONFIGURING RUNNING COMPLETING SUSPENDED STOPPED SIGNALING RESIZING STAGE_OUT "
    "REQUEUED REQUEUE_FED REQUEUE_HOLD SPECIAL_EXIT RESV_DEL_HOLD PREEMPTED READY".split()
)


def slurm_unfinished(state: str) -> bool:
    """Whether a sacct state ("RUNNING", "CANCELLED by 0", ...) leaves the job able to run on."""
    words = state.upper().split()
    return not words or words[0] in SLURM_UNFINISHED


class SweepSlurmWatcher(SlurmInfoWatcher):
    """submitit's sacct watcher, knowing every unfinished Slurm state."""

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return not slurm_unfinished(self.get_state(job_id, mode=mode))


class SweepSlurmJob(submitit.SlurmJob):
    """A SlurmJob whose sacct polling (the documented `watcher` class attribute) runs every SLURM_POLL_S."""

    watcher = SweepSlurmWatcher(delay_s=SLURM_POLL_S)


class SweepSlurmExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor whose jobs are SweepSlurmJobs (its documented `job_class` attribute)."""

    job_class = SweepSlurmJob


class _SubprocessInNewSession:
    """What submitit's local module sees as `subprocess` while it starts a job controller:
    the same module, but Popen starts the controller in a session of its own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802 - stands in for subprocess.Popen
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(*args, **kwargs)


class SweepLocalExecutor(submitit.LocalExecutor):
    """A LocalExecutor whose job controllers run in a session of their own.

    In submitit's, they share the sweep's process group, so a Ctrl-C on the terminal reaches
    each controller too: each prints a KeyboardInterrupt traceback over the sweep's output and
    its trial dies before the sweep can record it. Here the terminal's signals reach the sweep
    alone, which stops its jobs itself (cancel_job) and prints its one-line resume hint.
    """

    def _submit_command(self, command: str) -> Any:
        local = submitit.local.local
        saved = local.subprocess
        local.subprocess = _SubprocessInNewSession()  # type: ignore[assignment]
        try:
            return super()._submit_command(command)
        finally:
            local.subprocess = saved


def _queue_confs() -> dict[str, Any]:
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

    return {"local": LocalQueueConf, "slurm": SlurmQueueConf}


def cluster_of(launcher: dict[str, Any]) -> str:
    """'local' or 'slurm', from hydra/launcher=submitit_local|submitit_slurm."""
    target = str(launcher.get("_target_", ""))
    for cluster, conf in _queue_confs().items():
        if target == conf._target_:
            return cluster
    raise SweepError(
        f"hydra/launcher target {target!r} is not supported: use hydra/launcher=submitit_local or hydra/launcher=submitit_slurm"
    )


def executor_settings(launcher: dict[str, Any], time_limit_s: float) -> tuple[type, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(executor class, constructor kwargs, shared parameters, cluster parameters) from hydra.launcher.

    The keys come from hydra-submitit-launcher's own config dataclasses: BaseQueueConf's are
    shared by every executor (submitit converts their names per cluster); the rest of the
    cluster's QueueConf belongs to that executor: its constructor takes the ones its signature
    names (max_num_timeout, python, ...), update_parameters the others. A key the plugin adds
    later thus passes through without a change here.
    """
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    cluster = cluster_of(launcher)
    conf = _queue_confs()[cluster]
    cls = SweepSlurmExecutor if cluster == "slurm" else SweepLocalExecutor
    shared_keys = {f.name for f in fields(BaseQueueConf)} - {"submitit_folder"}
    own_keys = {f.name for f in fields(conf)} - shared_keys - {"_target_", "submitit_folder"}
    init_keys = set(inspect.signature(cls.__init__).parameters) - {"self", "folder"}
    init: dict[str, Any] = {"folder": launcher["submitit_folder"]}
    shared: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in launcher.items():
        if key in ("_target_", "submitit_folder") or value is None:
            continue
        if key in init_keys:
            init[key] = value
        elif key in shared_keys:
            shared[key] = value
        elif key in own_keys:
            own[key] = value
        else:
            valid = ", ".join(sorted(shared_keys | own_keys | (init_keys & {f.name for f in fields(conf)})))
            raise SweepError(f"hydra.launcher.{key} is not a parameter of {conf.__name__}: valid keys: {valid}")
    # The orchestrator stops a trial at time_limit_s; the executor's limit is only the backstop.
    shared["timeout_min"] = max(int(shared.get("timeout_min") or 0), math.ceil(time_limit_s / 60) + 1)
    return cls, init, shared, own


def make_executor(launcher: dict[str, Any], time_limit_s: float, folder: str | None = None) -> Any:
    cls, init, shared, own = executor_settings(launcher, time_limit_s)
    if folder is not None:
        init["folder"] = folder
    executor = cls(**init)
    # Generic names (timeout_min, mem_gb, name) become the cluster's own (time, mem, job_name)
    # through the executor's conversion, which submitit runs before update_parameters.
    executor.update_parameters(**executor._convert_parameters(shared), **own)
    return executor


def check_task_layout(launcher: dict[str, Any], num_devices: int) -> None:
    """A trial is one job with one task per device: tasks_per_node x nodes must be num_devices.

    Anything else would start too few ranks (the trial measures part of the machine) or
    too many (the trial refuses to start), only once the job runs on the cluster.
    """
    tasks, nodes = int(launcher.get("tasks_per_node") or 1), int(launcher.get("nodes") or 1)
    devices = int(num_devices)
    if tasks * nodes != devices:
        hint = f"hydra.launcher.tasks_per_node={devices // nodes}" if devices % nodes == 0 else "machine.num_devices a multiple of machine.nodes"
        raise SweepError(
            f"hydra.launcher.tasks_per_node={tasks} x hydra.launcher.nodes={nodes} = {tasks * nodes} tasks, "
            f"but machine.num_devices={devices}: a trial runs one task per device; set {hint}"
        )


def job_log(job: Any) -> str:
    """The log to read first: task 0's stdout (stderr is merged into it by default)."""
    try:
        return str(job.paths.stdout)
    except Exception:  # noqa: BLE001 - a path is a convenience, never a reason to fail
        return ""


def job_stderr(job: Any) -> str:
    """Task 0's stderr when it is a file of its own (hydra.launcher.stderr_to_stdout=false)."""
    try:
        path = str(job.paths.stderr)
    except Exception:  # noqa: BLE001
        return ""
    return path if path != job_log(job) and os.path.exists(path) else ""


def remember_job(trial_dir: Path, job: Any, cluster: str) -> None:
    record = {
        "job_id": str(job.job_id),
        "cluster": cluster,
        "log": job_log(job),
        # A re-attached multi-task job is done only when every task is.
        "num_tasks": int(getattr(job, "num_tasks", 1) or 1),
        "submitted_at": now_iso(),
    }
    atomic_write_text(Path(trial_dir) / JOB_FILE, json.dumps(record) + "\n")


def reattach(trial_dir: Path, executor_folder: str) -> Any | None:
    """The job an earlier orchestrator started for this trial, if it is still queued or running."""
    path = Path(trial_dir) / JOB_FILE
    try:
        record = json.loads(path.read_text())
        job_id, cluster = str(record["job_id"]), record["cluster"]
    except (OSError, ValueError, KeyError, TypeError):
        record, job_id, cluster = None, "", ""
    if cluster == "slurm":
        tasks = range(max(1, int(record.get("num_tasks", 1))))
        job = SweepSlurmJob(folder=executor_folder, job_id=job_id, tasks=tasks)
        # Queued, running, or requeued after a preemption: still this trial's job.
        return None if job.done(force_check=True) else job
    if cluster == "local" and job_id.isdigit() and _local_job_alive(int(job_id)):
        return _LocalOrphan(executor_folder, job_id)
    # An orchestrator killed between submitting a local job and writing its job.json leaves a
    # running job that only the submitit folder knows: follow it rather than run the trial twice.
    return _unrecorded_local_job(Path(trial_dir), executor_folder)


def _unrecorded_local_job(trial_dir: Path, executor_folder: str) -> Any | None:
    """A live local submitit job (its id is its controller's pid) that was submitted for this trial."""
    from submitit.core.utils import DelayedSubmission

    for proc in psutil.process_iter(["pid"]):
        job_id = str(proc.info["pid"])
        pickle = JobPaths(executor_folder, job_id=job_id).submitted_pickle
        if not pickle.exists() or not _local_job_alive(proc.info["pid"]):
            continue
        try:
            spec = DelayedSubmission.load(pickle).args[0]
            same = Path(spec.trial_dir).resolve() == trial_dir.resolve()
        except Exception:  # noqa: BLE001 - not a trial of this sweep, or half-written
            continue
        if same:
            job = _LocalOrphan(executor_folder, job_id)
            remember_job(trial_dir, job, "local")
            return job
    return None


class _LocalOrphan:
    """A local job whose parent orchestrator died: followed through its pid and result file."""

    def __init__(self, folder: str, job_id: str) -> None:
        self.job_id = job_id
        self.paths = JobPaths(folder, job_id=job_id)
        self.state = "RUNNING"

    def done(self, force_check: bool = False) -> bool:
        if _local_job_alive(int(self.job_id)):
            return False
        self.state = "FINISHED"
        return True

    def cancel(self, check: bool = True) -> None:
        import signal

        try:
            os.kill(int(self.job_id), signal.SIGINT)
        except ProcessLookupError:
            pass


def _local_job_alive(pid: int) -> bool:
    """A live submitit local job (its controller), not some process that got the pid later."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # ended, though the pid exists
            return False
        return "submitit" in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # someone else's process we cannot inspect: trust the pid


def cancel_job(job: Any, cluster: str) -> None:
    """Stop a job; on this host, also every process group its trial started.

    A command trial runs the user's command in a session of its own (so that its own
    timeout can stop the whole tree); cancelling the job stops the trial's process but
    not that session, which would run on, holding its devices, after the sweep ended.
    A local job's tasks get the SIGINT (not the submitit controller above them, which
    would print its own KeyboardInterrupt traceback onto the sweep's terminal).
    """
    if cluster != "local" or not str(job.job_id).isdigit():
        job.cancel(check=False)
        return
    import signal
    import threading

    tasks, groups = local_tree(int(job.job_id))
    for pid in tasks:
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass
    if not tasks:
        _stop_controller_before_its_tasks(int(job.job_id), job)
    if groups:
        _signal_groups(groups, signal.SIGTERM)
        timer = threading.Timer(5.0, _signal_groups, (groups, signal.SIGKILL))
        timer.daemon = True
        timer.start()


def _stop_controller_before_its_tasks(pid: int, job: Any) -> None:
    """A controller still starting (no task yet) has nothing to hand a SIGINT on to: it would die
    with a KeyboardInterrupt traceback on the sweep's terminal, its inherited stderr. It leads a
    process group of its own (SweepLocalExecutor), so the group is killed: a task started in the
    meantime goes with it."""
    import signal

    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
            return
    except OSError:
        return  # already gone
    job.cancel(check=False)


def _signal_groups(groups: list[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def local_tree(root: int) -> tuple[list[int], list[int]]:
    """(root's children, the process groups led by root's descendants that left its group)."""
    try:
        proc = psutil.Process(root)
        children = proc.children()
        descendants = proc.children(recursive=True)
        own = {os.getpgid(root), os.getpgrp()}
    except (psutil.NoSuchProcess, ProcessLookupError):
        return [], []
    groups = set()
    for child in descendants:
        try:
            pgid = os.getpgid(child.pid)
        except ProcessLookupError:
            continue
        if pgid == child.pid and pgid not in own:
            groups.add(pgid)
    return sorted(c.pid for c in children), sorted(groups)


def gpu_groups(host_gpus: int, per_trial: int, visible: str | None = None) -> list[tuple[int, ...]]:
    """Disjoint device groups for local trials, so side-by-side trials never share a GPU
    (submitit's local executor would otherwise give every job devices 0..k-1).

    visible: sweep's own CUDA_VISIBLE_DEVICES. submitit sets each job's CUDA_VISIBLE_DEVICES
    from these numbers, replacing the user's, so `CUDA_VISIBLE_DEVICES=2,3` must give groups
    of devices 2 and 3, not 0 and 1. UUIDs cannot be passed on as numbers: then 0..k-1.
    """
    if per_trial < 1:
        return []
    numbers = cuda_visible_numbers(visible)
    ids = numbers if numbers and len(numbers) >= host_gpus else list(range(host_gpus))
    return [tuple(ids[i * per_trial : (i + 1) * per_trial]) for i in range(host_gpus // per_trial)]
