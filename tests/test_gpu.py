"""The GPU path on a real CUDA device: `python -m pytest -m gpu`. Skipped, with the reason, without CUDA.

What a CPU host cannot show: real CUDA OOMs under machine.memory_gib (torch's per-process
memory fraction) classified by phase, a command trial's peak seen through NVML, and trials
in flight on disjoint physical GPUs.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import pickle
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.schema import RESULT_FILE, OomPhase, Status
from sweep.core.spec import TrialSpec
from sweep.records import read_result
from sweep.workloads.rnnt.config import RNNTWorkloadConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False on this host"),
]

GIB = 1024**3
BASE = RNNTWorkloadConfig(feat_dim=16, enc_hidden=64, enc_layers=2, pred_hidden=64, joint_hidden=64)
# B*T*U*V at split=1: 32 x 200 x 65 x 8192 floats is ~13 GiB, far above a 1.5 GiB cap.
JOINT_HOG = RNNTWorkloadConfig(**{**asdict(BASE), "frames": 400, "label_len": 64, "vocab": 8192})
# 30,000 frames through 4 LSTM layers of 1024 at batch 32: GiBs of encoder activations; the joint,
# split into one-sample chunks over U+1=2 and V=8, stays small.
ENCODER_HOG = RNNTWorkloadConfig(**{**asdict(BASE), "frames": 30000, "enc_hidden": 1024, "enc_layers": 4, "label_len": 1, "vocab": 8})


def spec_for(tmp_path: Path, workload: RNNTWorkloadConfig, accum: int, split: int, global_batch: int = 32, memory_gib: float = 1.5) -> TrialSpec:
    per_device = global_batch // accum
    return TrialSpec(
        accum=accum, split=split, per_device_batch=per_device, joint_batch=per_device // split, global_batch_size=global_batch,
        num_devices=1, machine=MachineConfig(name="gpu", device="cuda", memory_gib=memory_gib), workload=workload,
        trial=TrialConfig(warmup_steps=1, measure_steps=2), trial_dir=str(tmp_path / "trials" / f"accum{accum}_split{split}"),
    )


def run_in_own_process(spec: TrialSpec, tmp_path: Path) -> subprocess.CompletedProcess:
    """The memory fraction is per process: each trial gets a fresh one, as a submitit job would."""
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    code = "import pickle, sys; from sweep.workloads.rnnt.runner import run_trial; run_trial(pickle.load(open(sys.argv[1], 'rb')))"
    return subprocess.run([sys.executable, "-c", code, str(spec_file)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("phase, workload, split", [("joint", JOINT_HOG, 1), ("encoder", ENCODER_HOG, 32)])
def test_the_builtin_workload_gives_a_real_cuda_oom_in_each_phase(tmp_path, phase, workload, split):
    spec = spec_for(tmp_path, workload, accum=1, split=split)
    proc = run_in_own_process(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert (record.status, record.oom_phase) == (Status.OOM, OomPhase(phase)), record.error
    assert "CUDA out of memory" in record.error, record.error


def test_an_ok_builtin_trial_records_allocated_and_reserved_peaks_against_the_capped_card(tmp_path):
    spec = spec_for(tmp_path, BASE, accum=2, split=2, global_batch=8)
    proc = run_in_own_process(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert record.status == Status.OK, record.error
    assert 0 < record.peak_mem_gib <= record.peak_reserved_gib <= 1.5
    assert record.capacity_gib == 1.5
    assert record.headroom == pytest.approx(1 - record.peak_reserved_gib / 1.5)


def test_a_command_trial_records_its_nvml_peak(tmp_path, monkeypatch):
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    # One card, as a one-device trial gets: NVML's capacity is then that card's total.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible.split(",")[0] if visible else "0")
    from sweep.workloads.command.config import CommandWorkloadConfig
    from sweep.workloads.command.runner import run_command_trial

    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "block = torch.ones(512 * 1024**2 // 4, device='cuda')\n"
        "time.sleep(1.5)\n"
        "for e in (1, 2, 3):\n"
        "    print(f'DLL 2024-01-02 10:11:1{e}.123456 - epoch {e:4d} | train_avg_throughput-audio-samples-per-sec : 100.00 | train_avg_took : 0.16', flush=True)\n"
    )
    card_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    spec = TrialSpec(1, 1, 8, 8, 8, 1, MachineConfig(device="cuda", memory_gib=card_gib), CommandWorkloadConfig(argv=[sys.executable, str(script)]),
                     TrialConfig(), str(tmp_path / "t"))
    result = run_command_trial(spec)
    assert result.status == Status.OK, result.error
    assert 0.5 <= result.peak_mem_gib < card_gib, result  # the 512 MiB block plus the CUDA context
    assert result.capacity_gib == pytest.approx(card_gib, rel=0.05)  # NVML's total of the visible card
    assert result.headroom == pytest.approx(1 - result.peak_mem_gib / result.capacity_gib)


SCRIPT = r'''
import json, os, sys, time
import torch
accum, ledger = int(sys.argv[1]), sys.argv[2]
start = time.time()
torch.ones(1, device="cuda")
props = torch.cuda.get_device_properties(0)
time.sleep(3)
with open(os.path.join(ledger, f"accum{accum}.json"), "w") as f:
    json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "uuid": str(getattr(props, "uuid", "")), "start": start, "end": time.time()}, f)
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {1000.0 / accum:8.2f} | train_avg_took : 0.16", flush=True)
'''


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA devices")
def test_two_trials_in_flight_run_on_disjoint_gpus(tmp_path):
    script, ledger, sweep_dir = tmp_path / "train.py", tmp_path / "ledger", tmp_path / "sweep"
    script.write_text(SCRIPT)
    ledger.mkdir()
    args = ["workload=command", f"workload.argv=[{sys.executable},{script},'{{accum}}',{ledger}]", "machine.name=gpus", "machine.device=cuda",
            "machine.num_devices=1", f"machine.memory_gib={torch.cuda.get_device_properties(0).total_memory / GIB:.1f}",
            "search=grid", "accum=1,2,4,8", "split=1", "max_in_flight=2", "trial.time_limit_s=120", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run([sys.executable, "-m", "sweep", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert {r["status"] for r in rows} == {"ok"}, rows
    seen = {p.stem: json.loads(p.read_text()) for p in ledger.glob("*.json")}
    overlapping = [(a, b) for (a, ra), (b, rb) in itertools.combinations(seen.items(), 2) if ra["start"] < rb["end"] and rb["start"] < ra["end"]]
    assert overlapping, seen
    for a, b in overlapping:
        # Different physical cards, not only different index strings.
        assert seen[a]["uuid"] != seen[b]["uuid"] and seen[a]["visible"] != seen[b]["visible"], (a, b, seen)
