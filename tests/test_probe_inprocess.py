"""The probe armed in this process (sweep.probe.install), and the built-in trial measured by it (issue 29 §2)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_trial import JOINT_HOG, make_spec

from sweep import probe
from sweep.core.schema import RESULT_FILE, Status, read_result
from sweep.workloads.rnnt.runner import PROBE_SUBDIR, run_trial


@pytest.fixture
def disarmed_after():
    yield probe.runtime().PROBE
    probe.runtime().PROBE.disarm()


def train(steps: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_install_arms_this_process_and_a_new_dir_starts_a_new_record(tmp_path, disarmed_after):
    original_backward = torch.autograd.backward
    probe.install(tmp_path / "a")
    train(4)
    probe.install(tmp_path / "b")  # the built-in's next trial in the same process
    train(3)
    a, b = probe.read_probe(tmp_path / "a"), probe.read_probe(tmp_path / "b")
    assert [s.index for s in a.steps] == [0, 1, 2, 3] and a.problems == []
    assert [s.index for s in b.steps] == [0, 1, 2]
    assert [r["step"] for r in disarmed_after.steps] == [0, 1, 2]  # kept in memory for the caller too
    disarmed_after.disarm()
    assert torch.autograd.backward is original_backward
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks
    train(2)
    assert len(probe.read_probe(tmp_path / "b").steps) == 3  # nothing more once disarmed


def test_the_builtin_trial_is_measured_by_the_probe(tmp_path, disarmed_after):
    spec = make_spec(tmp_path)
    result = run_trial(spec)
    report = probe.read_probe(Path(spec.trial_dir) / PROBE_SUBDIR)
    assert result.status == Status.OK and result.measured_by == "probe" and result.ranks_seen == 1
    # Warm-up (1 step) then 4 timed: the trial's step times are the probe's, warm-up left out.
    assert len(report.steps) == 5
    assert result.step_times_s == report.step_times_s[1:]
    assert len(result.step_peak_reserved_gib) == 5 and max(result.step_peak_reserved_gib) == pytest.approx(result.peak_reserved_gib)
    assert result.peak_step in range(5)
    assert read_result(Path(spec.trial_dir) / RESULT_FILE) == result


def test_the_builtin_ooms_module_is_the_probes(tmp_path):
    spec = make_spec(tmp_path, accum=1, split=1, global_batch=4, memory_gib=4 / 1024, workload=JOINT_HOG, cpu_threads=1)
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    code = "import pickle, sys; from sweep.workloads.rnnt.runner import run_trial; run_trial(pickle.load(open(sys.argv[1], 'rb')))"
    proc = subprocess.run([sys.executable, "-c", code, str(spec_file)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert (record.status, str(record.oom_phase), record.measured_by) == (Status.OOM, "joint", "probe")
    assert record.oom_module.startswith("joint_")  # the joint's layers: joint_enc, joint_pred, joint_out
    report = probe.read_probe(Path(spec.trial_dir) / PROBE_SUBDIR)
    assert report.oom is not None and report.oom.module == record.oom_module
    assert report.oom.message.startswith("DefaultCPUAllocator: can't allocate memory")
