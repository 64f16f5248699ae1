"""Sweeps of the fake command for the sweep-dir tests (tests/test_sweep_dir.py): a whole run, and a Ctrl-C while
`python -m sweep` starts up."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.sweep_run import sweep_process

FAKE = Path(__file__).resolve().parents[1] / "fake_train.py"


COMMAND = [
    "workload=command",
    'workload.argv=["' + sys.executable + '","' + str(FAKE) + '","--accum={accum}","--split={split}",'
    '"--global_batch_size={global_batch_size}"]',
    "global_batch_size=16", "search=grid", "accum=1", "split=1", "trial.time_limit_s=60",
]


def sweep(cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    env.pop("SWEEP_DEBUG", None)
    return sweep_process(list(args), cwd, env, timeout)


def interrupt_while_starting(cwd: Path, delay_s: float) -> subprocess.CompletedProcess:
    """Start `python -m sweep`, and send Ctrl-C (to its process group, as a terminal does) `delay_s` after
    sweep's own package is imported. Counted from there: a Ctrl-C inside Python's own start-up (its
    site module, before any of sweep runs) is Python's to report. -X importtime says when that is."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    env.pop("SWEEP_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "sweep", "hydra.sweep.dir=s", *COMMAND], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if line.rstrip().endswith("| sweep"):  # importtime's line for the package itself: sweep's code runs from here
            break
    time.sleep(delay_s)
    # What the kernel says of the child's SIGINT as it is sent (blocked, ignored, caught), for a failure's message.
    signal_state = _signal_lines(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = "".join(x for x in ("".join(seen) + err).splitlines(keepends=True) if not x.startswith("import time:"))
    shutil.rmtree(cwd / "s", ignore_errors=True)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err + f"\n[signal state when sent: {signal_state}]")


def _signal_lines(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as e:
        return f"unreadable: {e}"
    return " ".join(line.replace("\t", "") for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")))
