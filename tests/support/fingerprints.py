"""Sweeps of the fake command that the fingerprint tests rerun and resume (tests/test_fingerprint.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.sweep_run import sweep_process

FAKE = Path(__file__).resolve().parents[1] / "fake_train.py"


COMMAND = [
    "workload=command",
    f'workload.argv=["{sys.executable}","{FAKE}","--accum={{accum}}","--split={{split}}","--global_batch_size={{global_batch_size}}"]',
    "search=grid", "accum=1,2", "split=1", "trial.time_limit_s=30",
]


def sweep(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "HYDRA_FULL_ERROR")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")
    return sweep_process(list(args), cwd, env, timeout=180)


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}
