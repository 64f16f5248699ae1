"""The submitit edge without a cluster: hydra.launcher mapped onto executors from the plugin's own
config dataclasses, process trees through psutil, and which record a reader takes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import submitit
from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
from support.results import trial_result

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.schema import ENDED_FILE, RESULT_FILE, Status, TrialResult
from sweep.core.spec import TrialSpec
from sweep.errors import ResultError, SweepError
from sweep.launch import backend
from sweep.records import read_trial_record, write_ended, write_result
from sweep.workloads.command.config import CommandWorkloadConfig


def launcher(conf: type, **changes) -> dict:
    return {**asdict(conf()), "submitit_folder": "/tmp/sweep-test/.submitit/%j", "name": "sweep", **changes}


def test_local_launcher_keys_map_onto_local_executor():
    cls, init, shared, own = backend.executor_settings(launcher(LocalQueueConf, python="/opt/py/bin/python"), time_limit_s=300)
    assert cls is backend.SweepLocalExecutor and issubclass(cls, submitit.LocalExecutor)  # controllers in their own session
    # `python` is a constructor argument of the executor: it passes through, whatever the plugin's version.
    assert init == {"folder": "/tmp/sweep-test/.submitit/%j", "python": "/opt/py/bin/python"}
    assert shared == {"timeout_min": 60, "tasks_per_node": 1, "nodes": 1, "name": "sweep", "stderr_to_stdout": False}
    assert own == {}


def test_slurm_launcher_keys_map_onto_the_sweeps_slurm_executor():
    cls, init, shared, own = backend.executor_settings(launcher(SlurmQueueConf, partition="gpu", max_num_timeout=2), time_limit_s=7200)
    assert cls is backend.SweepSlurmExecutor and cls.job_class is backend.SweepSlurmJob
    assert init["max_num_timeout"] == 2
    assert own["partition"] == "gpu" and own["signal_delay_s"] == 120 and "max_num_timeout" not in own
    assert shared["timeout_min"] == 121  # the backstop outlives trial.time_limit_s
    assert backend.SweepSlurmJob.watcher._delay_s == backend.SLURM_POLL_S


def test_an_unknown_launcher_key_is_named():
    with pytest.raises(SweepError, match=r"hydra.launcher.partitoin is not a parameter of SlurmQueueConf"):
        backend.executor_settings(launcher(SlurmQueueConf, partitoin="gpu"), time_limit_s=60)


def test_local_executor_takes_the_device_group(tmp_path):
    executor = backend.make_executor(launcher(LocalQueueConf), 60, folder=str(tmp_path / "%j"))
    executor.update_parameters(visible_gpus=(2, 3), gpus_per_node=2)  # the orchestrator's call
    assert executor.parameters["visible_gpus"] == (2, 3)


def test_local_tree_finds_the_children_and_their_own_sessions():
    # A parent with one child that leaves the group (as a command trial's training does).
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], start_new_session=True); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code])
    children: list[int] = []
    groups: list[int] = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children, groups = backend.local_tree(parent.pid)
            if children and groups:
                break
            time.sleep(0.05)
        assert len(children) == 1 and groups == children  # the child leads its own session
        assert os.getpgid(groups[0]) == groups[0] != os.getpgrp()
    finally:
        for pgid in groups:
            os.killpg(pgid, 9)
        parent.kill()
        parent.wait()
    assert backend.local_tree(parent.pid) == ([], [])  # reaped: no tree


def _record(status: Status, job_id: str) -> TrialResult:
    return trial_result(gbs=4, status=status, job_id=job_id)


@pytest.mark.parametrize(
    "own, ended, expected",
    [
        ("ok:7", None, (Status.OK, "7")),  # the trial's own record
        (None, "failed:7", (Status.FAILED, "7")),  # died without one: the sweep's
        ("torn", "failed:7", (Status.FAILED, "7")),  # cut off mid-write: the sweep's says why
        ("ok:7", "failed:7", (Status.OK, "7")),  # the same job: the trial's own wins
        ("cancelled:6", "oom:7", (Status.OOM, "7")),  # an earlier job's record gives way to the newer job's end
        (None, None, None),  # not ended
    ],
)
def test_readers_take_result_json_first_else_ended_json(tmp_path: Path, own, ended, expected):
    if own == "torn":
        (tmp_path / RESULT_FILE).write_text('{"accum": 1, "spl')
    elif own:
        status, job = own.split(":")
        write_result(_record(Status(status), job), tmp_path)
    if ended:
        status, job = ended.split(":")
        write_ended(_record(Status(status), job), tmp_path)
    res = read_trial_record(tmp_path)
    assert (None if res is None else (res.status, res.job_id)) == expected


def test_a_torn_result_without_the_sweeps_record_is_an_error(tmp_path: Path):
    (tmp_path / RESULT_FILE).write_text('{"accum": 1, "spl')
    with pytest.raises(ResultError, match="not valid JSON"):
        read_trial_record(tmp_path)
    assert not (tmp_path / ENDED_FILE).exists()


def test_status_is_a_str_enum_and_stays_a_plain_string_on_disk(tmp_path: Path):
    import json

    write_result(_record(Status.OOM, "1"), tmp_path)
    data = json.loads((tmp_path / RESULT_FILE).read_text())
    assert data["status"] == "oom" and Status.OOM == "oom" and f"{Status.OOM}" == "oom"


def test_a_spec_is_typed_and_frozen(tmp_path: Path):
    import dataclasses
    import pickle

    spec = TrialSpec(1, 1, 4, 4, 4, 1, MachineConfig(), CommandWorkloadConfig(argv=["true"]), TrialConfig(), str(tmp_path))
    assert pickle.loads(pickle.dumps(spec)) == spec  # as submitit hands it to the job
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.accum = 2  # type: ignore[misc]
