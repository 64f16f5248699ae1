"""What the orchestrator records about a job that ended without the trial's own record.

A trial writes result.json itself; when its job was killed, cancelled, timed out or crashed
before writing one, the orchestrator classifies the end from the job's state and log and
writes ended.json (a file of its own, so that each file has one writer).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import submitit

from sweep.core.schema import ENDED_FILE, RESULT_FILE, OomPhase, Status, TrialResult, now_iso
from sweep.core.spec import TrialSpec
from sweep.errors import ResultError
from sweep.launch.backend import FINAL_STATE_WAIT_S, JOB_FILE, job_log, job_stderr, slurm_unfinished
from sweep.launch.warm_pool import trial_end
from sweep.parsers.classify import one_line
from sweep.parsers.tail import read_tail
from sweep.records import read_result, write_ended


def ended_job_result(job: Any, spec: TrialSpec, trial_dir: Path, *, timed_out: bool, cancelled: bool, wall_s: float) -> TrialResult:
    """The record of a job that has ended: the trial's own result.json, else one built from the
    job's state and log, which goes to ended.json (the trial's file is the trial's alone)."""
    leftovers = 0 if isinstance(job, submitit.SlurmJob) else _end_leftovers(Path(trial_dir))
    log = job_log(job)
    path = Path(trial_dir) / RESULT_FILE
    broken = ""
    if path.exists():
        try:
            res = read_result(path)
            # A record another job of this trial left (a cancelled run now rerun) is not this job's.
            if not res.job_id or res.job_id == str(job.job_id):
                return res
        except ResultError as e:
            broken = str(e)
    status, phase, reason = _classify_ended(job, log, timed_out=timed_out, cancelled=cancelled, spec=spec, warm=_warm(job, trial_dir))
    if broken:
        reason = f"{broken}; {reason}"
    if leftovers and not (timed_out or cancelled):
        reason = f"the trial's job ended without its record (killed?) with {leftovers} process(es) of its command still running, now ended; {reason}"
    res = TrialResult(
        **spec.numbers(),
        fingerprint=spec.fingerprint,
        status=status,
        oom_phase=phase,
        error=reason,
        wall_s=round(wall_s, 3),
        log=log,
        job_id=str(job.job_id),
        device=spec.machine.device,
        finished_at=now_iso(),
    )
    write_ended(res, trial_dir)
    return res


def _end_leftovers(trial_dir: Path) -> int:
    """A local job killed outright (its trial could not end its command) leaves the command's processes
    running beside the next trial: end every one the trial recorded that is still the same process
    (in the background: the loop goes on). How many there were."""
    import signal

    from sweep.launch.tree import end_in_background, recorded, same_process

    alive = [(pid, t) for pid, t in recorded(trial_dir) if same_process(pid, t) is not None]
    if alive:
        end_in_background(alive, signal.SIGTERM)
    return len(alive)


def forget_ended(trial_dir: Path) -> None:
    """Before a trial runs again: the orchestrator's record of its earlier job no longer applies."""
    (Path(trial_dir) / ENDED_FILE).unlink(missing_ok=True)


def _final_state(job: Any) -> str:
    """The job's state once it has ended, as sacct gives it ("CANCELLED by 0", "OUT_OF_MEMORY", ...).

    A Slurm job that ended by writing its result pickle may still be RUNNING or COMPLETING
    in submitit's cached sacct answer, so sacct is asked again until the state is final.
    """
    if not isinstance(job, submitit.SlurmJob):
        return str(getattr(job, "state", ""))
    deadline = time.monotonic() + FINAL_STATE_WAIT_S
    while True:
        try:
            state = str(job.get_info(mode="force").get("State", ""))
        except Exception:  # noqa: BLE001 - sacct trouble: classify from the log alone
            return ""
        if not slurm_unfinished(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _warm(job: Any, trial_dir: Path) -> dict[str, Any]:
    """For a trial handed to a warm worker: the worker's dir, the trial's number there and where its lines start in the
    worker's logs. The WarmTrial's own, or job.json's when it names this job (a sweep that re-attached to the worker)."""
    warm = getattr(job, "warm", None)
    if isinstance(warm, dict):
        return warm
    try:
        record = json.loads((Path(trial_dir) / JOB_FILE).read_text())
    except (OSError, ValueError):
        return {}
    warm = record.get("warm") if isinstance(record, dict) and str(record.get("job_id")) == str(job.job_id) else None
    return warm if isinstance(warm, dict) else {}


def _last_line(tail: str) -> str:
    """The trial's last line: not its worker's about it (the account says what they say), nor submitit's as the worker exits."""
    lines = [line for line in tail.splitlines() if line.strip() and not line.startswith(("sweep worker ", "submitit "))]
    return f"its last line: {one_line(lines[-1], 200)}" if lines else "it printed nothing"


def _classify_ended(job: Any, log: str, *, timed_out: bool, cancelled: bool, spec: TrialSpec, warm: dict[str, Any]) -> tuple[Status, OomPhase | None, str]:
    offset = int(warm.get("stdout_from", 0))
    if offset:  # the lines before it are the warm worker's earlier trials'
        log = f"{log} from byte {offset}"
    if timed_out:
        return Status.TIMEOUT, None, f"stopped after trial.time_limit_s={spec.trial.time_limit_s}s; see {log}"
    if cancelled:
        return Status.CANCELLED, None, f"cancelled by the sweep; see {log}"
    raw_state = _final_state(job)
    state = raw_state.upper()
    if state.startswith("CANCELLED"):
        return Status.CANCELLED, None, f"cancelled on the cluster (sacct: {raw_state}); see {log}"
    if state == "TIMEOUT":
        return Status.TIMEOUT, None, f"Slurm time limit reached; raise hydra.launcher.timeout_min; see {log}"
    if state == "NODE_FAIL":
        return Status.FAILED, None, f"the node failed (NODE_FAIL) and Slurm did not requeue the job; see {log}"
    from sweep.parsers import classify_failure

    # Only this trial's lines: from where it was handed to its warm worker, else (a job of its own) the whole job's.
    tail = read_tail(job_log(job), start=offset)
    stderr = job_stderr(job)
    if stderr:
        tail += "\n" + read_tail(stderr, start=int(warm.get("stderr_from", 0)))
    verdict = classify_failure(tail, exit_code=None)
    if state == "OUT_OF_MEMORY" and verdict.status != Status.OOM:
        return Status.OOM, verdict.oom_phase, f"Slurm killed the job for exceeding its memory (OUT_OF_MEMORY); see {log}"
    end = trial_end(warm) if warm else ""
    if end and verdict.status != Status.OOM:
        # A kill is no evidence of memory (docs/reliability.md): only an OOM in the trial's own lines makes it an OOM.
        return Status.FAILED, None, f"{end}, with no sign of running out of memory in its own lines ({_last_line(tail)}); see {log}"
    if verdict.status in (Status.OOM, Status.FAILED):
        return verdict.status, verdict.oom_phase, f"{verdict.reason}; see {log}"
    return Status.FAILED, None, f"the job ended ({state or 'unknown state'}) without writing a result; see {log}"
