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
import shlex
import shutil
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import psutil
import submitit
from submitit.core.utils import JobPaths
from submitit.slurm.slurm import SlurmInfoWatcher

from sweep.core.schema import now_iso
from sweep.errors import SweepError
from sweep.launch.memory import cuda_visible_numbers
from sweep.records import atomic_write_text

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


class SweepLocalExecutor(submitit.LocalExecutor):
    """A LocalExecutor whose job controllers never see the terminal's Ctrl-C.

    In submitit's, they share the sweep's process group, so a Ctrl-C on the terminal reaches
    each controller too: each prints a KeyboardInterrupt traceback over the sweep's output and
    its trial dies before the sweep can record it. Here SIGINT is blocked (not ignored: a Ctrl-C
    landing meanwhile waits for the sweep) while a controller starts; the blocked mask is
    inherited by the controller and its task, and the task (sweep.launch.job) leaves the
    terminal's session before it unblocks SIGINT. The terminal's signals thus reach the sweep
    alone, which stops its jobs itself (cancel_job) and prints its one-line resume hint.
    """

    def _submit_command(self, command: str) -> Any:
        import signal

        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return super()._submit_command(command)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


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
    if cls is SweepLocalExecutor and "python" not in init and shutil.which("setsid"):
        # The executor's documented `python` command: each job's task starts in a session of its own
        # (util-linux setsid), out of the terminal's reach from its first instruction, and on a host
        # with scheduler autogroups, with its own CPU share rather than one shared by every trial.
        init["python"] = f"setsid {shlex.quote(sys.executable)}"
    executor = cls(**init)
    # Generic names (timeout_min, mem_gb, name) become the cluster's own (time, mem, job_name)
    # through the executor's conversion, which submitit runs before update_parameters.
    executor.update_parameters(**executor._convert_parameters(shared), **own)
    return executor


def check_task_layout(launcher: dict[str, Any], num_devices: int, nodes: int | None = None, *, one_launcher_per_node: bool = False) -> dict[str, Any]:
    """The launcher's task layout for a trial, checked before anything is submitted.

    The built-in workload runs one task per device: tasks_per_node x nodes must be num_devices, or
    the trial would measure part of the machine (too few ranks) or refuse to start (too many), only
    once the job runs on the cluster. A command runs one launcher per node (torchrun, deepspeed,
    accelerate start the ranks from {nproc_per_node}): the machine presets' one-task-per-device layout
    becomes one task per node, given the CPUs those tasks had between them; any other
    tasks_per_node is refused. Returns the launcher with that layout.
    """
    tasks, launcher_nodes = int(launcher.get("tasks_per_node") or 1), int(launcher.get("nodes") or 1)
    devices = int(num_devices)
    if one_launcher_per_node:
        per_node = max(1, devices // max(1, int(nodes or launcher_nodes)))
        if tasks not in (1, per_node):
            raise SweepError(
                f"hydra.launcher.tasks_per_node={tasks}: a command trial runs one launcher per node, which starts the "
                f"command's {per_node} rank(s) per node itself (e.g. torchrun --nproc_per_node={{nproc_per_node}}); set hydra.launcher.tasks_per_node=1"
            )
        layout = {**launcher, "tasks_per_node": 1}
        if tasks > 1 and launcher.get("cpus_per_task"):
            layout["cpus_per_task"] = int(launcher["cpus_per_task"]) * tasks
        return layout
    if tasks * launcher_nodes != devices:
        hint = (
            f"hydra.launcher.tasks_per_node={devices // launcher_nodes}"
            if devices % launcher_nodes == 0 else "machine.num_devices a multiple of machine.nodes"
        )
        raise SweepError(
            f"hydra.launcher.tasks_per_node={tasks} x hydra.launcher.nodes={launcher_nodes} = {tasks * launcher_nodes} tasks, "
            f"but machine.num_devices={devices}: a trial runs one task per device; set {hint}"
        )
    return launcher


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
        # A trial in a warm worker: which worker and trial, and where its lines start in the worker's log (launch/ended.py).
        **({"warm": job.warm} if isinstance(getattr(job, "warm", None), dict) else {}),
    }
    if cluster == "local" and str(job.job_id).isdigit():
        # Who the pid is: a later process that gets the same pid is not this trial's controller.
        record["create_time"] = _create_time(int(job.job_id))
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
    if cluster == "local" and job_id.isdigit() and _local_job_alive(int(job_id), executor_folder, record.get("create_time")):
        return _LocalOrphan(executor_folder, job_id, Path(trial_dir))
    # An orchestrator killed between submitting a local job and writing its job.json leaves a
    # running job that only the submitit folder knows: follow it rather than run the trial twice.
    return _unrecorded_local_job(Path(trial_dir), executor_folder)


def _unrecorded_local_job(trial_dir: Path, executor_folder: str) -> Any | None:
    """A live local submitit job (its id is its controller's pid) that was submitted for this trial."""
    from submitit.core.utils import DelayedSubmission

    for proc in psutil.process_iter(["pid"]):
        job_id = str(proc.info["pid"])
        pickle = JobPaths(executor_folder, job_id=job_id).submitted_pickle
        if not pickle.exists() or not _local_job_alive(proc.info["pid"], executor_folder):
            continue
        try:
            spec = DelayedSubmission.load(pickle).args[0]
            same = Path(spec.trial_dir).resolve() == trial_dir.resolve()
        except Exception:  # noqa: BLE001 - not a trial of this sweep, or half-written
            continue
        if same:
            job = _LocalOrphan(executor_folder, job_id, trial_dir)
            remember_job(trial_dir, job, "local")
            return job
    return None


class _LocalOrphan:
    """A local job whose parent orchestrator died: followed through its pid and result file."""

    def __init__(self, folder: str, job_id: str, trial_dir: Path | None = None) -> None:
        self.job_id = job_id
        # The executor's folder as its controllers were started with it ("%j" unexpanded): what their
        # command line names. paths.folder has the job id filled in, so it never matches one.
        self.executor_folder = folder
        self.paths = JobPaths(folder, job_id=job_id)
        self.trial_dir = trial_dir
        self.state = "RUNNING"

    def done(self, force_check: bool = False) -> bool:
        if _local_job_alive(int(self.job_id), self.executor_folder):
            return False
        # Without its controller the trial may still run: the processes it recorded (its command's tree)
        # are alive, and the trial writes its own record when they end. Calling it ended now would end
        # them and record a failure over a trial that goes on to finish (kill campaigns saw exactly that).
        if self.trial_dir is not None:
            from sweep.launch.tree import recorded, same_process

            if any(same_process(pid, started) is not None for pid, started in recorded(self.trial_dir)):
                return False
        self.state = "FINISHED"
        return True

    def cancel(self, check: bool = True) -> None:
        cancel_job(self, "local")


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _local_job_alive(pid: int, folder: str | None = None, create_time: float | None = None) -> bool:
    """A live submitit local job controller of this executor folder (and, when known, started at
    create_time), not some process that got the pid later: another sweep's controller included."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # ended, though the pid exists
            return False
        if create_time is not None and abs(proc.create_time() - float(create_time)) > 0.01:
            return False
        cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return create_time is not None  # someone else's process we cannot inspect: trust a recorded identity only
    if "submitit.local._local" not in cmdline:
        return False
    return folder is None or _same_path(cmdline[-1], folder)


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def cancel_job(job: Any, cluster: str) -> None:
    """Stop a job; on this host, its whole process tree, escalating until it has ended.

    A local job's task gets a SIGINT (its trial stops the command and everything the command
    started; not the controller, whose SIGINT stays blocked); a stopped (SIGSTOP) process
    cannot act on it, so everything first gets SIGCONT, and what is still there after a grace
    gets SIGTERM, then SIGKILL (sweep.launch.tree.end_processes, in the background so the
    sweep's loop goes on). A controller that has no task yet has nothing to hand a SIGINT on
    to and is killed outright.
    """
    if cluster != "local" or not str(job.job_id).isdigit():
        job.cancel(check=False)
        return
    import signal

    from sweep.launch.tree import end_in_background, identity

    root = int(job.job_id)
    try:
        controller = psutil.Process(root)
        tasks = controller.children()
        everything = [controller, *controller.children(recursive=True)]
    except psutil.Error:
        return
    if not tasks:
        try:
            controller.kill()
        except psutil.Error:
            pass
        return
    # Tasks first (they end their commands in order), the rest of the tree after a grace.
    end_in_background([i for i in map(identity, tasks) if i], signal.SIGINT)
    rest = [i for i in map(identity, everything) if i and i[0] not in {t.pid for t in tasks}]
    end_in_background(rest, signal.SIGCONT)


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
