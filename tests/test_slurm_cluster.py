"""Smoke tests of the localhost Slurm cluster (tests/slurm/cluster.sh) and of
submitit's SlurmExecutor against it. They need the `slurm_cluster` fixture from
tests/support/slurm_cluster.py (imported by tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
from support.slurm_cluster import wait_until

pytestmark = pytest.mark.slurm

# The jobs unpickle the functions below in a fresh interpreter that cannot
# import this test module (tests/ is not on its sys.path): ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WAIT_S = 60


def _wait_until(what: str, check: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.5) -> Any:
    return wait_until(what, check, timeout, interval)


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-n", "-X", "-P", "-o", "State"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    return out.strip()


def _finished_state(job_id: str) -> str:
    state = _sacct_state(job_id)
    return "" if state in ("", "PENDING", "RUNNING", "COMPLETING") else state


def _executor(folder: Path, cluster, **params) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(slurm_partition=cluster.partition, timeout_min=2, **params)
    return executor


def test_sbatch_wrap_completes_and_is_accounted(slurm_cluster, tmp_path):
    out = subprocess.run(
        ["sbatch", "--parsable", "--chdir", str(tmp_path), "-o", "slurm-%j.out", "--wrap", "hostname"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    job_id = out.strip().split(";")[0]
    state = _wait_until(f"job {job_id} to finish in sacct", lambda: _finished_state(job_id))
    assert state == "COMPLETED"
    assert (tmp_path / f"slurm-{job_id}.out").read_text().strip()
    conf = Path(slurm_cluster.slurm_conf).read_text().splitlines()
    name = next(line.split("=", 1)[1] for line in conf if line.startswith("ClusterName="))
    clusters = subprocess.run(
        ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.split()
    assert name in clusters


def _add(a: int, b: int) -> int:
    return a + b


def test_submitit_job_returns_value(slurm_cluster, tmp_path):
    job = _executor(tmp_path, slurm_cluster).submit(_add, 2, 3)
    assert job.result() == 5
    # result() returns once the result pickle exists (submitit's done()); the job's process may still
    # be exiting, and the accounting records its end after that: wait for a finished state first.
    _wait_until(f"job {job.job_id} to finish in sacct", lambda: _finished_state(job.job_id))
    # submitit's own sacct polling (sacct -o JobID,State,NodeList --parsable2 -j ID)
    assert job.get_info(mode="force")["State"] == "COMPLETED"
    assert job.state == "COMPLETED"


def _rank() -> int:
    return submitit.JobEnvironment().global_rank


def test_submitit_two_tasks_run_both_ranks(slurm_cluster, tmp_path):
    executor = _executor(tmp_path, slurm_cluster, nodes=1, tasks_per_node=2, cpus_per_task=1)
    job = executor.submit(_rank)
    assert sorted(job.results()) == [0, 1]


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_scancel_reports_cancelled(slurm_cluster, tmp_path):
    job = _executor(tmp_path, slurm_cluster).submit(_sleep, 120)
    _wait_until(
        f"job {job.job_id} RUNNING",
        lambda: job.get_info(mode="force").get("State") == "RUNNING",
    )
    subprocess.run(["scancel", job.job_id], check=True, timeout=30)
    _wait_until(f"job {job.job_id} CANCELLED in sacct", lambda: _sacct_state(job.job_id).startswith("CANCELLED"))
    _wait_until(
        f"submitit state of job {job.job_id} CANCELLED",
        lambda: job.get_info(mode="force").get("State", "").startswith("CANCELLED"),
    )
    # sacct says "CANCELLED by 0"; submitit passes that through as the state.
    assert job.state.startswith("CANCELLED")
    assert job.done()
