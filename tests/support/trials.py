"""Built-in (RNN-T) trials at a test size: their spec, and a run in a process of its own (tests/test_trial.py,
test_probe_inprocess.py, test_racing.py)."""

from __future__ import annotations

import os
import pickle
import subprocess
from dataclasses import asdict
from pathlib import Path

from support.sweep_run import forked_python
from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.spec import TrialSpec
from sweep.workloads.rnnt.config import RNNTWorkloadConfig

SMALL = RNNTWorkloadConfig(
    feat_dim=4, frames=8, subsample=2, label_len=3, vocab=6, enc_hidden=8, enc_layers=2, pred_hidden=8, joint_hidden=8
)


def make_spec(tmp_path: Path, accum=2, split=2, global_batch=8, memory_gib=2.0, workload=SMALL, **machine) -> TrialSpec:
    per_device = global_batch // accum
    key = f"accum{accum}_split{split}"
    return TrialSpec(
        accum=accum,
        split=split,
        per_device_batch=per_device,
        joint_batch=per_device // split,
        global_batch_size=global_batch,
        num_devices=1,
        machine=MachineConfig(memory_gib=memory_gib, **machine),
        workload=workload,
        trial=TrialConfig(warmup_steps=1, measure_steps=4, max_measure_steps=4, seed=0),
        trial_dir=str(tmp_path / "trials" / key),
    )


def run_in_own_process(tmp_path: Path, code: str, spec: TrialSpec) -> subprocess.CompletedProcess:
    """`python JOB.PY SPEC.PKL`, the spec pickled as submitit hands it to the job, in a process of its own: forked from
    the test fork server that has imported torch (tests/support/sweep_run.py), as a fresh job process would have imported it."""
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    script = tmp_path / "job.py"
    script.write_text(code)
    return forked_python(str(script), [str(spec_file)], tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)


# A real OOM needs its own process: the address-space cap is per process.
JOINT_HOG = RNNTWorkloadConfig(**{**asdict(SMALL), "frames": 32, "label_len": 7, "vocab": 8192})


ENCODER_HOG = RNNTWorkloadConfig(**{**asdict(SMALL), "frames": 800, "enc_hidden": 128, "label_len": 1})
