"""What the bad-input tests share (tests/test_bad_input.py, tests/test_bad_input_more.py): the fast fake command, the
environment and arguments each case runs with, and every case of a table run at once, a few per core."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sweep_run import sweep_process

FAULT = Path(__file__).with_name("fake_train.py")


def argv(*parts: str) -> str:
    """A workload.argv override: a quoted list, as the shell would pass it."""
    return "workload.argv=[" + ",".join(f'"{p}"' for p in parts) + "]"


FAKE = argv(sys.executable, str(FAULT), "--accum={accum}", "--split={split}", "--global_batch_size={global_batch_size}")


def cmd(*extra: str, command: str = FAKE) -> list[str]:
    """The fast fake command as the workload: a case that wrongly passes runs seconds, not minutes."""
    return ["workload=command", command, "global_batch_size=64", "search=grid", "trial.time_limit_s=20", *extra]


def case_env(env_extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "HYDRA_FULL_ERROR")}
    env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
    return env


def full_args(args: list[str], cwd: Path, searchpath: Path) -> list[str]:
    return [f"hydra.sweep.dir={cwd / 'sweep_dir'}", *(a.replace("{SEARCHPATH}", str(searchpath)) for a in args)]


def run_all(cases: list[tuple[str, list[str], list[str]]], dirs: dict[str, Path], searchpath: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case run once, a few at a time: {case id: (process, its working dir)}."""

    def one(case_args: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess]:
        case, args = case_args
        return case, sweep_process(full_args(args, dirs[case], searchpath), dirs[case], case_env(), timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, 2 * (os.cpu_count() or 1))) as pool:
        done = dict(pool.map(one, [(case, args) for case, args, _ in cases]))
    return {case: (done[case], dirs[case]) for case in done}
