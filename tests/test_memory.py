"""Memory budget, peak measurement and OOM classification, with real allocator failures."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch

from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.memory import DeviceOOM, MemoryBudget, PeakMemory, is_oom_error, oom_summary

CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 123456 bytes. Error code 12 (Cannot allocate memory)"
)
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 3.19 MiB is free. Including non-PyTorch memory, this process has 79.14 GiB memory in use."
)


@pytest.mark.parametrize(
    "exc,expected",
    [
        (torch.OutOfMemoryError(CUDA_OOM), True),
        (RuntimeError(CUDA_OOM), True),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
        (RuntimeError(CPU_OOM), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"), True),
        (RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"), True),
        (DeviceOOM("joint", "DefaultCPUAllocator: can't allocate memory in phase joint"), True),
        (RuntimeError("CUDA error: device-side assert triggered"), False),
        (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"), False),
        (RuntimeError("could not create a primitive"), False),  # oneDNN: an OOM only under a CPU budget
        (RuntimeError("Expected all tensors to be on the same device, but found cuda:0 and cpu"), False),
        (RuntimeError("NCCL error: unhandled system error"), False),
        (ValueError("CUDA out of memory"), False),  # not an allocator's exception type
        (KeyError("out of memory"), False),
        (ZeroDivisionError(), False),
    ],
)
def test_is_oom_error(exc, expected):
    assert is_oom_error(exc) is expected


@pytest.mark.parametrize(
    "message,summary",
    [
        (CPU_OOM, "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456 bytes"),
        (CUDA_OOM, "CUDA out of memory. Tried to allocate 20.00 MiB"),
        ("line one\nline two", "line one"),
    ],
)
def test_oom_summary_is_one_line(message, summary):
    assert oom_summary(RuntimeError(message)) == summary


def test_peak_memory_sees_a_touched_tensor_and_resets():
    meter = PeakMemory(torch.device("cpu"))
    big = torch.ones(16 * 2**20)  # 64 MiB, resident once written
    assert meter.peak_bytes() >= 60 * 2**20
    del big
    meter.reset()
    assert meter.peak_bytes() < 32 * 2**20


MAPPED_SCRIPT = r"""
import json, torch
from sweep.workloads.rnnt.memory import PeakMemory
meter = PeakMemory(torch.device("cpu"))
already = meter.reserved_peak_bytes()  # VmPeak cannot be reset: what start-up left above the baseline
mapped = torch.empty(already // 4 + 16 * 2**20)  # float32: past that by 64 MiB, never written
print(json.dumps([already, meter.reserved_peak_bytes(), meter.peak_bytes()]))
"""


def test_the_cpu_reserved_peak_counts_mapped_pages_that_the_resident_peak_misses():
    """The emulated cap counts address space: a tensor allocated but never written costs no resident
    memory, yet counts against the cap, so it is what headroom must count (as CUDA's reserved peak).
    In a fresh process, whose address-space peak no earlier test has raised."""
    proc = subprocess.run([sys.executable, "-c", MAPPED_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    already, reserved, resident = json.loads(proc.stdout)
    assert reserved >= already + 60 * 2**20
    assert resident < 16 * 2**20


def test_no_budget_is_a_no_op():
    budget = MemoryBudget(torch.device("cpu"), None)
    with budget:
        assert budget.budget_bytes is None


# One subprocess runs every case: the address-space cap is per process.
SCRIPT = r"""
import ctypes, json, resource, sys
import torch
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.launch.memory import address_space_bytes
from sweep.workloads.rnnt.memory import DeviceOOM, MemoryBudget, SmallObjectReserve, configure_cpu_allocator
from sweep.workloads.rnnt.model import RNNTWorkload

torch.set_num_threads(1)
configure_cpu_allocator()
limit_before = resource.getrlimit(resource.RLIMIT_AS)
out = {}

# First, while the process is fresh: how far 2 MiB of Python objects and 2 MiB of small C allocations
# move the address space, before a SmallObjectReserve and after one.
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
def grows_by():
    before = address_space_bytes()
    held = [[(i, j) for i in range(1024)] for j in range(32)], [libc.malloc(64 * 1024) for _ in range(32)]
    return address_space_bytes() - before, held
without, held = grows_by()
reserve = SmallObjectReserve()
out["reserve"] = [without, grows_by()[0]]
for name, cfg, pdb, split, budget_mib in json.loads(sys.argv[1]):
    w = RNNTWorkload(RNNTWorkloadConfig(**cfg), torch.device("cpu"))
    w.warm_up(pdb)
    with MemoryBudget(torch.device("cpu"), budget_mib / 1024):
        try:
            w.train_step(pdb, 1, split, step_index=0)
            out[name] = ["ok", ""]
        except DeviceOOM as exc:
            out[name] = [exc.phase, str(exc)]
    del w
    big = torch.ones(64 * 2**20)  # 256 MiB: fine again once the cap is lifted
    out[name].append(resource.getrlimit(resource.RLIMIT_AS) == limit_before)
print(json.dumps(out))
"""

SMALL = dict(feat_dim=4, frames=8, subsample=2, label_len=3, vocab=6, enc_hidden=8, enc_layers=2, pred_hidden=8, joint_hidden=8)
CASES = [
    # A 16 MiB joint output next to a tiny encoder.
    ("joint", dict(SMALL, frames=32, label_len=7, vocab=8192), 4, 1, 4),
    # 400 LSTM steps of activations, ~24 MiB, in front of a tiny joint, split as far as it goes.
    ("encoder", dict(SMALL, frames=800, enc_hidden=128, label_len=1), 4, 4, 4),
    # Tiny activations, 25 MiB of parameters: gradients fit, Adam's two state tensors per parameter do not.
    ("optimizer", dict(SMALL, frames=2, label_len=1, vocab=50000, pred_hidden=64, joint_hidden=64), 1, 1, 40),
    ("fits", SMALL, 4, 2, 64),
]


@pytest.fixture(scope="module")
def real_ooms():
    cases = [[name, asdict(RNNTWorkloadConfig(**cfg)), pdb, split, mib] for name, cfg, pdb, split, mib in CASES]
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("phase", ["joint", "encoder", "optimizer"])
def test_real_oom_is_attributed_to_its_phase(real_ooms, phase):
    got_phase, message, limit_restored = real_ooms[phase]
    assert got_phase == phase, message
    assert message.startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate ")
    assert message.endswith(f" bytes in phase {phase}")
    assert limit_restored


def test_a_step_within_budget_runs(real_ooms):
    assert real_ooms["fits"] == ["ok", "", True]


def test_a_reserve_keeps_a_steps_small_allocations_from_moving_the_address_space(real_ooms):
    """What the demo's counted peak varied by (docs/concepts.md): 1 MiB Python arenas and the C heap's growth."""
    without, within = real_ooms["reserve"]
    assert without >= 3 * 2**20  # arenas mapped and the heap grown: both would count against the budget
    assert within == 0
