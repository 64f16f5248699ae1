"""Local GPU sweeps, driven end to end on a CPU host: torch is made to report 4 CUDA devices in
the orchestrator's process, and trials in flight must get disjoint device groups through
submitit's LocalExecutor (its `visible_gpus`, which becomes each job's CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import csv
import itertools
import json
import sys
from pathlib import Path

import pytest
import torch
from support.in_process import pretend_four_gpus, run_in_process

pytestmark = pytest.mark.e2e

# Each trial records what it was given and when it ran, then reports a throughput the
# default (Myrtle) parser reads; the sleep makes the two trials in flight overlap.
SCRIPT = r'''
import json, os, sys, time
accum, ledger = int(sys.argv[1]), sys.argv[2]
start = time.time()
time.sleep(3)
with open(os.path.join(ledger, f"accum{accum}.json"), "w") as f:
    json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}, f)
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {1000.0 / accum:8.2f} | train_avg_took : {0.016 * accum:6.2f}", flush=True)
'''


def test_trials_in_flight_see_disjoint_device_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    pretend_four_gpus(monkeypatch)
    script, ledger, sweep_dir = tmp_path / "train.py", tmp_path / "ledger", tmp_path / "sweep"
    script.write_text(SCRIPT)
    ledger.mkdir()
    code = run_in_process(
        [
            "workload=command",
            f"workload.argv=[{sys.executable},{script},'{{accum}}',{ledger}]",
            "machine.name=fake4gpu",
            "machine.device=cuda",
            "machine.num_devices=1",
            "machine.memory_gib=80",
            "search=grid",
            "accum=1,2,4,8",
            "split=1",
            "max_in_flight=2",
            "trial.time_limit_s=60",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        monkeypatch,
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "warning" not in out.err  # machine.memory_gib=80 fits the reported 80 GiB cards

    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert {r["accum"]: r["status"] for r in rows} == {"1": "ok", "2": "ok", "4": "ok", "8": "ok"}, rows
    seen = {p.stem: json.loads(p.read_text()) for p in ledger.glob("*.json")}
    assert len(seen) == 4
    for record in seen.values():
        # One device each (num_devices=1), one of the four torch reported.
        assert record["visible"] in {"0", "1", "2", "3"}, record
    overlapping = [
        (a, b) for (a, ra), (b, rb) in itertools.combinations(seen.items(), 2) if ra["start"] < rb["end"] and rb["start"] < ra["end"]
    ]
    assert overlapping, seen  # max_in_flight=2: some trials ran side by side
    for a, b in overlapping:
        assert set(seen[a]["visible"].split(",")).isdisjoint(seen[b]["visible"].split(",")), (a, b, seen)


def test_a_gpu_profile_needs_the_devices_torch_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The runnable-here check counts the same devices: 4 reported, 8 needed, one line, exit 2."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    code = run_in_process(["+machine=a100x8", f"hydra.sweep.dir={tmp_path / 's'}"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2
    assert "machine=a100x8 needs 8 CUDA device(s) but this host has 4" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "host_gpus, per_trial, visible, groups",
    [
        (4, 1, None, [(0,), (1,), (2,), (3,)]),
        (4, 2, None, [(0, 1), (2, 3)]),
        (3, 2, None, [(0, 1)]),  # the odd device stays idle rather than split a trial
        (2, 1, "2,3", [(2,), (3,)]),  # one device out of many: the user's numbering reaches the jobs
        (2, 2, "5,7", [(5, 7)]),
        (2, 1, "GPU-1a2b,GPU-3c4d", [(0,), (1,)]),  # UUIDs cannot become submitit's visible_gpus
        (4, 1, "", [(0,), (1,), (2,), (3,)]),
        (1, 2, None, []),
    ],
)
def test_device_groups_follow_the_users_cuda_visible_devices(host_gpus, per_trial, visible, groups) -> None:
    from sweep.launch.backend import gpu_groups

    assert gpu_groups(host_gpus, per_trial, visible) == groups


def test_one_device_out_of_many_reaches_the_trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """CUDA_VISIBLE_DEVICES=3 for sweep (torch then counts one device): the trial must get device 3, not 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    script, ledger, sweep_dir = tmp_path / "train.py", tmp_path / "ledger", tmp_path / "sweep"
    script.write_text(SCRIPT.replace("time.sleep(3)", "time.sleep(0)"))
    ledger.mkdir()
    code = run_in_process(
        [
            "workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}',{ledger}]", "machine.device=cuda",
            "machine.num_devices=1", "machine.memory_gib=80", "search=grid", "accum=1", "split=1", "trial.time_limit_s=60",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        monkeypatch,
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert json.loads((ledger / "accum1.json").read_text())["visible"] == "3"
