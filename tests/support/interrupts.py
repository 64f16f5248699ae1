"""The fake command sweeps that tests stop (Ctrl-C, SIGTERM, kills), and what a stopped sweep leaves: its resume
hint, no trial process left (tests/test_interrupts.py, test_drift.py, test_screening.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().parents[1] / "fake_train.py"


ARGV = (
    'workload.argv=["' + sys.executable + '","' + str(FAKE) + '","--accum={accum}","--split={split}",'
    '"--global_batch_size={global_batch_size}","--behaviours=2:slow,4:slow"]'
)


def hint(sweep_dir: Path) -> str:
    import shlex

    return f"resume with: python -m sweep {shlex.quote(f'resume={sweep_dir}')}"


def no_trial_left(sweep_dir: Path, timeout_s: float = 15) -> bool:
    """No process of this sweep's trials is still running (the fake command has the dir in its cwd)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for p in psutil.process_iter(["cmdline", "cwd"]):
            try:
                if str(sweep_dir) in " ".join(p.info["cmdline"] or []) + (p.info["cwd"] or ""):
                    alive.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not alive:
            return True
        time.sleep(0.2)
    return False


def start(tmp_path: Path, stdout: int | None = subprocess.PIPE) -> tuple[subprocess.Popen, Path]:
    sweep_dir = tmp_path / "sweep dir é"  # a space and a non-ASCII letter: the hint must still work
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    env.pop("SWEEP_DEBUG", None)
    args = [
        sys.executable, "-m", "sweep", f"hydra.sweep.dir='{sweep_dir}'", "workload=command", ARGV,
        "global_batch_size=16", "search=grid", "accum=1,2,4", "split=1", "trial.time_limit_s=60",
    ]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )
    return proc, sweep_dir


def wait_for_second_trial(proc: subprocess.Popen, sweep_dir: Path, timeout_s: float = 60) -> None:
    """Until accum=1 has its result and another trial's job was submitted."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = (sweep_dir / "trials" / "accum1_split1" / "result.json").exists()
        running = any((sweep_dir / "trials" / k / "job.json").exists() for k in ("accum2_split1", "accum4_split1"))
        if done and running:
            time.sleep(0.5)  # the job's controller and trial are up
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the sweep did not reach its second trial: rc={proc.returncode}\n{out}\n{err}")


def state(sweep_dir: Path) -> str:
    return json.loads((sweep_dir / "sweep.json").read_text())["state"]


def kept(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "trials" / "accum1_split1" / "result.json").read_text())
