"""The submitit edge: executors from `hydra.launcher`, and ended jobs turned into results.

submitit already is the backend abstraction (local processes or Slurm jobs behind one
Job API), so this module only maps hydra-submitit-launcher's parameters onto an
executor, remembers each job on disk so a restarted orchestrator can find it again,
and converts a job that ended without writing its own record into a failure record.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from sweep.errors import SweepError
from sweep.core.schema import (
    CANCELLED,
    FAILED,
    OOM,
    TIMEOUT,
    ResultError,
    TrialResult,
    atomic_write_text,
    now_iso,
    read_log_tail,
    read_result,
    RESULT_FILE,
    write_result,
)

JOB_FILE = "job.json"
# sacct is asked about unfinished Slurm jobs at most this often. submitit's own default backs
# off to 10 minutes, and a trial that ends without a result file (scancel, node failure, the
# OOM killer) is only seen through sacct, so it would land that late.
SLURM_POLL_S = 15
# How long an ended Slurm job may take to show its final state in sacct (COMPLETING first).
_FINAL_STATE_WAIT_S = 10
# Slurm states of a job that may still run (or run again) its trial. submitit's own list
# lacks SUSPENDED and the requeue/hold states, so a suspended or held trial looked ended:
# it was recorded as failed, and a resumed sweep submitted it a second time.
SLURM_UNFINISHED = frozenset(
    "UNKNOWN PENDING CONFIGURING RUNNING COMPLETING SUSPENDED STOPPED SIGNALING RESIZING STAGE_OUT "
    "REQUEUED REQUEUE_FED REQUEUE_HOLD SPECIAL_EXIT RESV_DEL_HOLD PREEMPTED READY".split()
)
# hydra-submitit-launcher parameters shared by every executor; the rest get the cluster prefix.
_BASE_PARAMS = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name", "stderr_to_stdout"}
# Read by the executor's constructor, or meaningless for single submissions.
_NOT_PARAMS = {"_target_", "submitit_folder", "max_num_timeout", "array_parallelism"}


def cluster_of(launcher: dict[str, Any]) -> str:
    """'local' or 'slurm', from hydra/launcher=submitit_local|submitit_slurm."""
    target = str(launcher.get("_target_", ""))
    if target.endswith("SlurmLauncher"):
        return "slurm"
    if target.endswith("LocalLauncher"):
        return "local"
    raise SweepError(
        f"hydra/launcher target {target!r} is not supported: use hydra/launcher=submitit_local or hydra/launcher=submitit_slurm"
    )


def executor_parameters(launcher: dict[str, Any], time_limit_s: float) -> dict[str, Any]:
    """submitit update_parameters() kwargs, as hydra-submitit-launcher maps them."""
    cluster = cluster_of(launcher)
    params: dict[str, Any] = {}
    for key, value in launcher.items():
        if key in _NOT_PARAMS or value is None:
            continue
        params[key if key in _BASE_PARAMS else f"{cluster}_{key}"] = value
    # The orchestrator stops a trial at time_limit_s; the executor's limit is only the backstop.
    params["timeout_min"] = max(int(params.get("timeout_min") or 0), math.ceil(time_limit_s / 60) + 1)
    return params


def make_executor(launcher: dict[str, Any], time_limit_s: float, folder: str | None = None) -> Any:
    import submitit

    cluster = cluster_of(launcher)
    init: dict[str, Any] = {"folder": folder or launcher["submitit_folder"]}
    if launcher.get("max_num_timeout") is not None:
        init[f"{cluster}_max_num_timeout"] = launcher["max_num_timeout"]
    executor = submitit.AutoExecutor(cluster=cluster, **init)
    executor.update_parameters(**executor_parameters(launcher, time_limit_s))
    if cluster == "slurm":
        executor._executor.job_class = slurm_job_class()  # submitit has no public hook for it
    return executor


def slurm_unfinished(state: str) -> bool:
    """Whether a sacct state ("RUNNING", "CANCELLED by 0", ...) leaves the job able to run on."""
    words = state.upper().split()
    return not words or words[0] in SLURM_UNFINISHED


@functools.lru_cache(maxsize=None)
def slurm_job_class() -> type:
    """submitit's SlurmJob, polling sacct every SLURM_POLL_S and knowing every unfinished state."""
    import submitit
    from submitit.slurm.slurm import SlurmInfoWatcher

    class SweepSlurmWatcher(SlurmInfoWatcher):  # type: ignore[misc, valid-type]
        def is_done(self, job_id: str, mode: str = "standard") -> bool:
            return not slurm_unfinished(self.get_state(job_id, mode=mode))

    class SweepSlurmJob(submitit.SlurmJob):  # type: ignore[misc, valid-type]
        watcher = SweepSlurmWatcher(delay_s=SLURM_POLL_S)

    return SweepSlurmJob


def check_task_layout(launcher: dict[str, Any], machine: dict[str, Any]) -> None:
    """A trial is one job with one task per device: tasks_per_node x nodes must be num_devices.

    Anything else would start too few ranks (the trial measures part of the machine) or
    too many (the trial refuses to start), only once the job runs on the cluster.
    """
    tasks, nodes = int(launcher.get("tasks_per_node") or 1), int(launcher.get("nodes") or 1)
    devices = int(machine["num_devices"])
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


def _job_stderr(job: Any) -> str:
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
        job = slurm_job_class()(folder=executor_folder, job_id=job_id, tasks=tasks)
        # Queued, running, or requeued after a preemption: still this trial's job.
        return None if job.done(force_check=True) else job
    if cluster == "local" and job_id.isdigit() and _local_job_alive(int(job_id)):
        return _LocalOrphan(job_id, record.get("log", ""))
    # An orchestrator killed between submitting a local job and writing its job.json leaves a
    # running job that only the submitit folder knows: follow it rather than run the trial twice.
    return _unrecorded_local_job(Path(trial_dir), executor_folder)


def _unrecorded_local_job(trial_dir: Path, executor_folder: str) -> Any | None:
    import glob

    from submitit.core.utils import DelayedSubmission

    suffix = "_submitted.pkl"
    for pickle in glob.glob(os.path.join(executor_folder.replace("%j", "*"), "*" + suffix)):
        job_id = os.path.basename(pickle)[: -len(suffix)]
        if not job_id.isdigit() or not _local_job_alive(int(job_id)):
            continue
        try:
            spec = DelayedSubmission.load(pickle).args[0]
            same = Path(spec["trial_dir"]).resolve() == trial_dir.resolve()
        except Exception:  # noqa: BLE001 - not a trial of this sweep, or half-written
            continue
        if same:
            job = _LocalOrphan(job_id, os.path.join(os.path.dirname(pickle), f"{job_id}_0_log.out"))
            remember_job(trial_dir, job, "local")
            return job
    return None


class _LocalOrphan:
    """A local job whose parent orchestrator died: followed through its pid and result file."""

    def __init__(self, job_id: str, log: str) -> None:
        self.job_id = job_id
        self._log = log
        self.state = "RUNNING"

    @property
    def paths(self) -> Any:
        return type("Paths", (), {"stdout": self._log})()

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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended even though the pid exists
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _local_job_alive(pid: int) -> bool:
    """A live submitit local job (its controller), not some process that got the pid later."""
    if not _pid_alive(pid):
        return False
    try:
        return b"submitit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid


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

    tasks, groups = _local_tree(int(job.job_id))
    for pid in tasks:
        try:
            os.kill(pid, signal.SIGINT)
        except OSError:
            pass
    if not tasks:
        job.cancel(check=False)
    if groups:
        _signal_groups(groups, signal.SIGTERM)
        timer = threading.Timer(5.0, _signal_groups, (groups, signal.SIGKILL))
        timer.daemon = True
        timer.start()


def _signal_groups(groups: list[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def _local_tree(root: int) -> tuple[list[int], list[int]]:
    """(root's children, the process groups led by root's descendants that left its group). Linux only."""
    parent_group: dict[int, tuple[int, int]] = {}
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return [], []
    for name in names:
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            parent_group[int(name)] = (int(fields[1]), int(fields[2]))  # ppid, pgrp
        except (OSError, IndexError, ValueError):
            continue
    if root not in parent_group:
        return [], []
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in parent_group.items():
        children.setdefault(ppid, []).append(pid)
    own = {parent_group[root][1], os.getpgrp()}
    groups, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        pgid = parent_group[pid][1]
        if pgid == pid and pgid not in own:
            groups.add(pgid)
    return sorted(children.get(root, [])), sorted(groups)


def ended_job_result(
    job: Any,
    spec: dict[str, Any],
    trial_dir: Path,
    *,
    timed_out: bool,
    cancelled: bool,
    wall_s: float,
) -> TrialResult:
    """The record for a job that has ended: the trial's own, else one built from the job's state and log."""
    log = job_log(job)
    path = Path(trial_dir) / RESULT_FILE
    if path.exists():
        try:
            res = read_result(path)
            if not res.log or not res.job_id:
                res.log, res.job_id = res.log or log, res.job_id or str(job.job_id)
                write_result(res, trial_dir)
            return res
        except ResultError as e:
            broken = str(e)
    else:
        broken = ""
    status, phase, reason = _classify_ended(job, log, timed_out=timed_out, cancelled=cancelled, spec=spec)
    if broken:
        reason = f"{broken}; {reason}"
    res = TrialResult(
        accum=spec["accum"],
        split=spec["split"],
        per_device_batch=spec["per_device_batch"],
        joint_batch=spec["joint_batch"],
        global_batch_size=spec["global_batch_size"],
        num_devices=spec["num_devices"],
        status=status,
        oom_phase=phase,
        error=reason,
        wall_s=round(wall_s, 3),
        log=log,
        job_id=str(job.job_id),
        device=str(spec["machine"].get("device", "")),
        finished_at=now_iso(),
    )
    write_result(res, trial_dir)
    return res


def _final_state(job: Any) -> str:
    """The job's state once it has ended, as sacct gives it ("CANCELLED by 0", "OUT_OF_MEMORY", ...).

    A Slurm job that ended by writing its result pickle may still be RUNNING or COMPLETING
    in submitit's cached sacct answer, so sacct is asked again until the state is final.
    """
    import submitit

    if not isinstance(job, submitit.SlurmJob):
        return str(getattr(job, "state", ""))
    deadline = time.monotonic() + _FINAL_STATE_WAIT_S
    while True:
        try:
            state = str(job.get_info(mode="force").get("State", ""))
        except Exception:  # noqa: BLE001 - sacct trouble: classify from the log alone
            return ""
        if not slurm_unfinished(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _classify_ended(job: Any, log: str, *, timed_out: bool, cancelled: bool, spec: dict[str, Any]) -> tuple[str, str | None, str]:
    if timed_out:
        return TIMEOUT, None, f"stopped after trial.time_limit_s={spec['trial']['time_limit_s']}s; see {log}"
    if cancelled:
        return CANCELLED, None, f"cancelled by the sweep; see {log}"
    raw_state = _final_state(job)
    state = raw_state.upper()
    if state.startswith("CANCELLED"):
        return CANCELLED, None, f"cancelled on the cluster (sacct: {raw_state}); see {log}"
    if state == "TIMEOUT":
        return TIMEOUT, None, f"Slurm time limit reached; raise hydra.launcher.timeout_min; see {log}"
    if state == "NODE_FAIL":
        return FAILED, None, f"the node failed (NODE_FAIL) and Slurm did not requeue the job; see {log}"
    from sweep.parsers import classify_failure

    tail = read_log_tail(log)
    stderr = _job_stderr(job)
    if stderr:
        tail += "\n" + read_log_tail(stderr)
    verdict = classify_failure(tail, exit_code=None)
    if state == "OUT_OF_MEMORY" and verdict.status != OOM:
        return OOM, verdict.oom_phase, f"Slurm killed the job for exceeding its memory (OUT_OF_MEMORY); see {log}"
    if verdict.status in (OOM, FAILED):
        return verdict.status, verdict.oom_phase, f"{verdict.reason}; see {log}"
    return FAILED, None, f"the job ended ({state or 'unknown state'}) without writing a result; see {log}"


def gpu_groups(host_gpus: int, per_trial: int) -> list[tuple[int, ...]]:
    """Disjoint device groups for local trials, so side-by-side trials never share a GPU
    (submitit's local executor would otherwise give every job devices 0..k-1)."""
    if per_trial < 1:
        return []
    return [tuple(range(i * per_trial, (i + 1) * per_trial)) for i in range(host_gpus // per_trial)]
