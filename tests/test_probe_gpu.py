"""The probe on a real CUDA device: `python -m pytest -m gpu`. Skipped, with the reason, without CUDA.

What a CPU host cannot show: the allocator's per-step figures (max allocated, max reserved, retries)
beside torch's own, and an OOM the trainer catches recorded by the allocator's OOM observer, in forward
(from the failing call's frames) and in backward (from the autograd node the engine's device thread runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sweep.probe import oom_phase_of, probe_env, read_probe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False on this host"),
]

# Each step allocates a known activation on top of the model; step 3 one four times larger. The script
# reads torch's own peaks for the same windows (between optimizer steps) into its own file.
SCRIPT = r"""
import json, sys, torch
from torch import nn
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
own = []
for step in range(6):
    batch = 16384 if step == 3 else 4096
    loss = model(torch.randn(batch, 1024, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    own.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    torch.cuda.reset_peak_memory_stats()
    opt.zero_grad()
json.dump(own, open(sys.argv[1], "w"))
"""

# An OOM inside `encoder.1` that the script catches, then it carries on with a batch that fits.
RECOVER = r"""
import torch
from torch import nn
model = nn.Module()
model.encoder = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
free, total = torch.cuda.mem_get_info()
for step in range(4):
    rows = int(total // 256) if step == 1 else 64  # step 1: an activation larger than the card
    try:
        # A view of one row: the first allocation the size of the card is encoder.0's output.
        loss = model.encoder(torch.randn(1, 64, device="cuda").expand(rows, 64)).sum()
    except torch.OutOfMemoryError:
        loss = model.encoder(torch.randn(64, 64, device="cuda")).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""

# An OOM in backward after the first step (no module is tracked live then), in an autograd node that
# follows `joint` (a Function applied to its output); the script catches it and carries on.
BACKWARD = r"""
import torch
from torch import nn
class Huge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, grad):
        free, total = torch.cuda.mem_get_info()
        torch.empty(2 * total, dtype=torch.uint8, device=grad.device)
        return grad * 2
model = nn.Module()
model.encoder = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
model.joint = nn.Linear(64, 8)
model.cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(4):
    out = model.joint(model.encoder(torch.randn(64, 64, device="cuda")))
    loss = (Huge.apply(out) if step == 2 else out).sum()
    try:
        loss.backward()
    except torch.OutOfMemoryError:
        pass
    opt.step()
    opt.zero_grad()
"""


def run(tmp_path, code, *argv):
    env = {**os.environ, **probe_env(tmp_path / "probe", base_env=os.environ)}
    proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_probe(tmp_path / "probe")


def test_cuda_memory_per_step_is_the_allocators(tmp_path):
    report = run(tmp_path, SCRIPT, str(tmp_path / "own.json"))
    own = json.loads((tmp_path / "own.json").read_text())
    assert report.device == "cuda" and len(report.steps) == 6
    # The probe's window for step k is the script's (optimizer step to optimizer step), so the figures agree.
    for probe_step, (allocated, reserved) in zip(report.steps[1:], own[1:]):
        assert probe_step.peak_bytes == allocated
        assert probe_step.peak_reserved_bytes == reserved
        assert probe_step.retries == 0
    assert report.peak_step == 3 and report.peak_bytes == own[3][0]


def test_a_cuda_oom_the_trainer_recovers_from_is_recorded_by_the_observer(tmp_path):
    report = run(tmp_path, RECOVER)
    assert len(report.steps) == 4
    oom = report.oom
    assert oom is not None and (oom.module, oom.step, oom.where) == ("encoder.0", 1, "forward")
    assert "out of memory" in oom.message
    assert oom_phase_of(oom.module, None) == "encoder"


def test_a_cuda_oom_in_backward_is_named_by_its_autograd_node(tmp_path):
    report = run(tmp_path, BACKWARD)
    assert len(report.steps) == 4
    oom = report.oom
    assert oom is not None and (oom.module, oom.step, oom.where, oom.via) == ("joint", 2, "backward", "autograd node")
    assert oom_phase_of(oom.module, None) == "joint"
