"""Run `python -m sweep` as a user would, in a subprocess, for the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# A workload small enough that one trial takes a few seconds on 2 cores.
TINY = [
    "global_batch_size=8",
    "workload.feat_dim=8",
    "workload.frames=16",
    "workload.label_len=4",
    "workload.vocab=8",
    "workload.enc_hidden=16",
    "workload.enc_layers=1",
    "workload.pred_hidden=16",
    "workload.joint_hidden=16",
    "trial.warmup_steps=1",
    "trial.measure_steps=3",
]


def run_sweep(args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("SWEEP_DEBUG", None)
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
