"""Warm workers, the worker's side: one process per device group runs built-in trials in turn.

The worker knows no workload: it is handed the workload's warm runner (sweep.workloads.base.Workload.warm_runner),
calls it once to pay the heavy imports, and runs every trial with the function it returns.

Start-up is most of a short GPU trial: on an H100 an OOM at step 0 cost 14-15 s of wall, nearly
all of it interpreter start, imports, the CUDA context and the model build. A warm worker is a
submitit job (sweep.launch.warm_pool starts it) that pays the interpreter and imports once, and
on CUDA the context too, then runs each trial the orchestrator hands it:

* CUDA: in its own process (`run_trial`, which counts start-up only for a process's first trial).
  Afterwards it frees the allocator (garbage, torch.cuda.empty_cache, cuBLAS workspaces) and resets
  the peak statistics, and it stays only if it can prove a clean state: nothing allocated or
  reserved beyond what it held before its first trial.
* CPU: in a child forked for the trial. What a CPU trial records as its reserved peak is the
  address-space peak (VmPeak), which no call resets, so a process that ran one trial could only
  ever record the larger of two trials' peaks; a forked child starts with the worker's VmPeak, the
  size of a process that imported torch and ran nothing, as a fresh trial process has it. The
  worker itself never runs a trial, and proves it by its VmPeak, unchanged since it started.

After a fatal error (a trial that raised rather than recorded ok or oom, or a child that did not
exit cleanly) the worker always retires, and the orchestrator starts a fresh one. Command trials
keep their own processes: their memory is the user's program's.

The worker's directory is its handshake with the orchestrator, one writer per file:
  task.pkl    the orchestrator's: {"seq": n, "spec": TrialSpec}, the n-th trial handed to it
  retire      the orchestrator's: exit when idle
  state.json  the worker's: {"state": ready|running|retiring|retired, "seq": the last trial taken, ...}; "raised"
              when an exception ends it mid-trial, so a worker that ended "running" without one was killed
Each trial still writes its own result.json, as in a fresh process.
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK_FILE = "task.pkl"
RETIRE_FILE = "retire"
STATE_FILE = "state.json"
READY, RUNNING, RETIRING, RETIRED = "ready", "running", "retiring", "retired"
POLL_S = 0.05  # how often an idle worker looks for its next trial
OWNER_CHECK_S = 1.0  # how often it checks that the orchestrator that started it is still there
CHILD_GRACE_S = 3.0  # a forked trial's time to end on SIGINT before it is killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h
BACKSTOP_S = 60.0  # past a trial's time limit, what a fresh trial's submitit limit allowed (its minute of rounding)


@dataclass(frozen=True)
class Baseline:
    """What the worker held before its first trial: what a clean state is measured against."""

    device: str
    allocated: int = 0  # CUDA bytes allocated
    reserved: int = 0  # CUDA bytes reserved
    address_peak: int = 0  # CPU: this process's VmPeak


def baseline(device: str) -> Baseline:
    if device == "cuda":
        import torch

        return Baseline(device, torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    from sweep.launch.memory import address_space_peak_bytes

    return Baseline(device, address_peak=address_space_peak_bytes())


def free_and_reset(device: str) -> None:
    """Give back what the last trial left in the allocator and start the peak statistics afresh."""
    gc.collect()
    if device != "cuda":
        return  # the trial ran in a child that has exited: nothing of it is left here
    import torch

    # cuBLAS keeps a workspace per handle in the caching allocator; a fresh process has none until its
    # first matmul, so a worker that kept them would start each later trial with memory a fresh one lacks.
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()  # after the collection above: what the trial's garbage held goes back too
    torch.cuda.reset_peak_memory_stats()


def dirty_reason(before: Baseline) -> str | None:
    """Why this process cannot prove it is as clean as before its first trial, or None when it is."""
    now = baseline(before.device)
    if before.device == "cuda":
        if now.allocated > before.allocated or now.reserved > before.reserved:
            return (f"CUDA memory still held after freeing: {now.allocated} B allocated, {now.reserved} B reserved "
                    f"(before its first trial: {before.allocated}, {before.reserved})")
        return None
    if now.address_peak > before.address_peak:
        return (f"its address-space peak (VmPeak, what a CPU trial's reserved peak counts) rose from {before.address_peak} B "
                f"to {now.address_peak} B and cannot be reset")
    return None


def _write_state(worker_dir: Path, state: str, seq: int, **extra: Any) -> None:
    from sweep.records import atomic_write_text

    record = {"state": state, "seq": seq, "pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES"), **extra}
    atomic_write_text(worker_dir / STATE_FILE, json.dumps(record) + "\n")


def _next_task(worker_dir: Path, after: int) -> tuple[int, Any] | None:
    """(seq, spec) of a trial handed after trial `after`, or None while there is none."""
    try:
        task = pickle.loads((worker_dir / TASK_FILE).read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        return None  # none yet (the orchestrator replaces the file atomically, so never half of one)
    return (int(task["seq"]), task["spec"]) if int(task["seq"]) > after else None


def _owner_alive(pid: int, started: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _run_forked(run_trial: Callable[..., Any], spec: Any, extra_startup_s: float) -> str | None:
    """Run one trial in a forked child (CPU); why it did not end cleanly, or None when it did."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: the trial, then out, without the parent's submitit job ending behind it
        code = 1
        try:
            _die_with(parent)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            run_trial(spec, extra_startup_s=extra_startup_s)
            code = 0
        except BaseException:  # noqa: BLE001 - its record is written (failed) where it could be; the parent hears the code
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
    except KeyboardInterrupt:  # the orchestrator stopped this worker (cancel, timeout): the trial first
        _end_child(pid)
        raise
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        return f"its trial process was killed by {name}"
    code = os.WEXITSTATUS(status)
    return f"its trial process exited with status {code}" if code else None


def _die_with(parent: int) -> None:
    """A forked trial ends when its worker does (Linux PR_SET_PDEATHSIG): killed, the worker must not leave
    a trial behind that writes its record after the orchestrator recorded it as ended."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the worker died before the request took effect
        os._exit(1)


def _end_child(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + CHILD_GRACE_S
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _run_here(run_trial: Callable[..., Any], spec: Any) -> str | None:
    """Run one trial in this process (CUDA); why it did not end cleanly, or None when it did."""
    try:
        run_trial(spec)
    except Exception as exc:  # noqa: BLE001 - its record is written (failed); this process is not to be trusted
        return f"fatal error: {type(exc).__name__}"
    return None


def _backstop(limit_s: float | None) -> None:
    """End a trial that runs past its time limit plus BACKSTOP_S, as a fresh trial's submitit time limit would:
    the orchestrator stops it at its limit, so this acts only where no orchestrator follows it. An alarm, not
    a watchdog thread: a thread's stack and malloc arena would stay in the address space every forked trial
    inherits, which a fresh trial process does not have."""
    signal.alarm(0 if limit_s is None else math.ceil(limit_s + BACKSTOP_S))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"past its time limit and {BACKSTOP_S:g} s more (signal {signum})")


def serve_worker(worker_dir: str, device: str, owner_pid: int, owner_started: float, warm_runner: Callable[[], Callable[..., Any]]) -> None:
    """The warm worker's job: run the trials handed to `worker_dir` in turn until told to retire,
    until its state cannot be proved clean, or once the orchestrator that started it (owner) is gone.
    warm_runner: the workload's (Workload.warm_runner), called once here: torch and the model, the imports paid once."""
    from sweep.launch.job import leave_the_terminal
    from sweep.launch.tree import process_age_s

    run_trial = warm_runner()
    leave_the_terminal()
    where = Path(worker_dir)
    signal.signal(signal.SIGALRM, _interrupt)
    before = baseline(device)
    done, trials = 0, 0
    _write_state(where, READY, done, trials=trials)
    owner_checked = time.monotonic()
    while True:
        task = _next_task(where, done)
        if task is None:
            if (where / RETIRE_FILE).exists():
                _write_state(where, RETIRED, done, trials=trials, why="asked to retire")
                return
            if time.monotonic() - owner_checked > OWNER_CHECK_S:
                if not _owner_alive(owner_pid, owner_started):
                    _write_state(where, RETIRED, done, trials=trials, why="its orchestrator has ended")
                    return
                owner_checked = time.monotonic()
            time.sleep(POLL_S)
            continue
        seq, spec = task
        _write_state(where, RUNNING, seq, trials=trials, trial_dir=spec.trial_dir)
        print(f"sweep worker {os.getpid()}: trial {trials + 1}, accum={spec.accum} split={spec.split}", flush=True)
        _backstop(float(spec.trial.time_limit_s))
        try:
            if device == "cuda":
                why = _run_here(run_trial, spec)
            else:
                # The worker's own start-up (interpreter, imports) belongs to its first trial, as in a fresh process.
                why = _run_forked(run_trial, spec, extra_startup_s=(process_age_s() or 0.0) if trials == 0 else 0.0)
        except BaseException as exc:
            # Said before it ends this worker (still "running": the orchestrator waits for its job to end, as before), so
            # one that ended without "raised" was killed by a signal, no handler of its having run (warm_pool.trial_end).
            _write_state(where, RUNNING, seq, trials=trials, trial_dir=spec.trial_dir, raised=f"{type(exc).__name__}: {exc}".removesuffix(": "))
            raise
        _backstop(None)
        done, trials = seq, trials + 1
        if why is None:
            free_and_reset(device)
            why = dirty_reason(before)
        if why:
            print(f"sweep worker {os.getpid()}: retiring after accum={spec.accum} split={spec.split}: {why}", flush=True)
            _write_state(where, RETIRING, done, trials=trials, why=why)
            return
        _write_state(where, READY, done, trials=trials)
