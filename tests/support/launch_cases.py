"""Issue 30's process and launch faults, as scenarios with real processes: each returns what the user
now sees, for tests/test_faults.py to assert and bench/bench_reliability.py to count.

Each scenario takes a fresh root dir and leaves no process behind (what it started is killed at the end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from support import faultlib as F

FIGURES = (
    "for e in (1, 2, 3):\n"
    "    print(f'DLL 2024-01-02 10:11:1{e}.123456 - epoch {e:4d} | train_avg_throughput-audio-samples-per-sec : 400.00 | train_avg_took : 0.16', flush=True)\n"
)

# The trial's job process (the command's parent) is stopped; it used to hang the sweep for 600 s.
STOPS_ITS_JOB = "import os, signal, time\nopen('cmd.pid', 'w').write(str(os.getpid()))\nos.kill(os.getppid(), signal.SIGSTOP)\ntime.sleep(300)\n"

# The trial's job process is killed outright; the command, and a child that left its session, ran on.
KILLS_ITS_JOB = (
    "import os, signal, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
    "open('cmd.pid', 'w').write(f'{os.getpid()} {child.pid}')\n"
    "time.sleep(1.0)  # the trial has recorded its processes by now\n"
    "os.kill(os.getppid(), signal.SIGKILL)\n"
    "time.sleep(300)\n"
)

# The command forks a child that leaves its session, prints its figures and exits: the child ran on.
LEAVES_A_CHILD = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
    "open('cmd.pid', 'w').write(str(child.pid))\n" + FIGURES
)


def _sweep_with(root: Path, script: str, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, Path, float]:
    """A one-trial sweep of `script`, run from root (where it writes cmd.pid); (process, sweep dir, wall seconds)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(script)
    sweep_dir = root / "s"
    args = ["workload=command", f'workload.argv=["{sys.executable}","train.py","--accum={{accum}}"]', "global_batch_size=8",
            "accum=1", "split=1", "search=grid", "live=false", *extra]
    t0 = time.monotonic()
    proc = F.run(sweep_dir, args, F.sweep_env(), root, timeout=timeout)
    return proc, sweep_dir, time.monotonic() - t0


def _pids(root: Path) -> list[int]:
    try:
        return [int(p) for p in (root / "cmd.pid").read_text().split()]
    except (OSError, ValueError):
        return []


def _alive_then_kill(pids: list[int]) -> list[int]:
    """The pids still running (zombies aside); each is killed, so nothing is left behind either way."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
                os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return alive


def _row(sweep_dir: Path) -> dict[str, str]:
    return F.table(sweep_dir).get((1, 1), {})


def stopped_job(root: Path) -> dict[str, Any]:
    """A SIGSTOPped trial job past trial.time_limit_s=6: how long the sweep took, the trial's status, leftovers."""
    proc, sweep_dir, wall = _sweep_with(root, STOPS_ITS_JOB, "trial.time_limit_s=6")
    time.sleep(0.5)
    return {"exit": proc.returncode, "wall_s": wall, "row": _row(sweep_dir), "left_running": _alive_then_kill(_pids(root)), "stderr": proc.stderr}


def killed_job(root: Path) -> dict[str, Any]:
    """The trial's job process is SIGKILLed mid-trial: the trial's status, and whether its command ran on."""
    proc, sweep_dir, wall = _sweep_with(root, KILLS_ITS_JOB, "trial.time_limit_s=60")
    deadline = time.monotonic() + 8  # the sweep ends them in the background: allow its grace
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in _pids(root)):
        time.sleep(0.2)
    return {"exit": proc.returncode, "wall_s": wall, "row": _row(sweep_dir), "left_running": _alive_then_kill(_pids(root)), "stderr": proc.stderr}


def escaping_child(root: Path) -> dict[str, Any]:
    """A command that starts a child in a session of its own and exits: the trial's status, and the child."""
    proc, sweep_dir, wall = _sweep_with(root, LEAVES_A_CHILD, "trial.time_limit_s=60")
    return {"exit": proc.returncode, "wall_s": wall, "row": _row(sweep_dir), "left_running": _alive_then_kill(_pids(root)), "stderr": proc.stderr}


def reused_pid(root: Path) -> dict[str, Any]:
    """A stale job.json whose pid now belongs to another sweep's controller: re-attached or not."""
    from sweep.launch import backend

    root.mkdir(parents=True, exist_ok=True)
    ours, theirs = root / "ours" / ".submitit", root / "theirs" / ".submitit"
    ours.mkdir(parents=True)
    theirs.mkdir(parents=True)
    # Another sweep's job controller, for real: submitit's own local controller process of a job there.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "submitit.local._local", str(theirs)])
    try:
        trial = root / "ours" / "trial"
        trial.mkdir()
        record = {"job_id": str(other.pid), "cluster": "local", "log": "", "num_tasks": 1, "submitted_at": "", "create_time": 1.0}
        (trial / backend.JOB_FILE).write_text(json.dumps(record))
        attached = backend.reattach(trial, str(ours)) is not None
        record.pop("create_time")  # a job.json from before identities were recorded: the folder still tells
        (trial / backend.JOB_FILE).write_text(json.dumps(record))
        attached_without_time = backend.reattach(trial, str(ours)) is not None
    finally:
        other.kill()
        other.wait()
    return {"attached": attached, "attached_without_time": attached_without_time}


def rerun_reads_its_own_log(root: Path) -> dict[str, Any]:
    """A trial cancelled after printing 1600 samples/s, rerun with the trainer at 4800: what the rerun records."""
    from sweep.core.config import MachineConfig, TrialConfig
    from sweep.core.spec import TrialSpec
    from sweep.workloads.command.config import CommandWorkloadConfig
    from sweep.workloads.command.runner import run_command_trial

    root.mkdir(parents=True, exist_ok=True)
    results = []
    for rate in (1600, 4800):
        script = root / f"train{rate}.py"
        script.write_text(FIGURES.replace("400.00", f"{rate}.00"))
        workload = CommandWorkloadConfig(argv=[sys.executable, str(script), "--accum={accum}"], cwd=str(root), parser={"type": "myrtle"})
        results.append(run_command_trial(TrialSpec(1, 1, 8, 8, 8, 1, MachineConfig(device="cpu"), workload, TrialConfig(), str(root / "trial"))))
    return {"first": results[0], "rerun": results[1]}


def large_log(root: Path, noise_mib: int, warmup: bool) -> dict[str, Any]:
    """noise_mib MiB of output, then 12 steps at 1600 samples/s (after 3 slow warm-up steps if warmup)."""
    from sweep.core.config import MachineConfig, TrialConfig
    from sweep.core.spec import TrialSpec
    from sweep.workloads.command.config import CommandWorkloadConfig
    from sweep.workloads.command.runner import run_command_trial

    root.mkdir(parents=True, exist_ok=True)
    script = root / "train.py"
    script.write_text(
        "import sys\n"
        f"for e in range({3 if warmup else 0}):\n    print(f'step {{e}} 50.000 ms/step 160.0 samples/s', flush=True)\n"
        f"sys.stdout.write(('x' * 1023 + '\\n') * {noise_mib} * 1024)\nsys.stdout.flush()\n"
        "for e in range(3, 15):\n    print(f'step {e} 5.000 ms/step 1600.0 samples/s', flush=True)\n"
    )
    parser = {"type": "regex", "pattern": r"step (?P<step>\d+) (?P<step_time>[\d.]+) ms/step (?P<throughput>[\d.]+) samples/s", "step_time_unit": "ms"}
    workload = CommandWorkloadConfig(argv=[sys.executable, str(script), "--accum={accum}"], cwd=str(root), parser=parser)
    result = run_command_trial(TrialSpec(1, 1, 8, 8, 8, 1, MachineConfig(device="cpu"), workload, TrialConfig(), str(root / "trial")))
    return {"result": result}
