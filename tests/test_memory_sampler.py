"""The process-tree memory sampler (launch/memory.py), with real child processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sweep.launch import memory
from sweep.launch.memory import GIB, TreeMemorySampler, start_nvml

# A parent that starts a child, and the child (a grandchild of the test) holds ~200 MB: the
# sampler must walk the tree to see it.
HOLDER = "import sys, time; block = bytearray(200 * 1024 * 1024); block[::4096] = b'x' * len(block[::4096]); print('ready', flush=True); time.sleep(30)"
PARENT = f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', {HOLDER!r}]); child.wait()"


def no_nvml():
    return None


def test_the_rss_path_sees_a_grandchild_holding_200_mb() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT])
    sampler = TreeMemorySampler(proc.pid, capacity_gib=4.0, interval_s=0.05, nvml_factory=no_nvml).start()
    try:
        deadline = time.monotonic() + 20
        while (sampler.peak_bytes or 0) < 200 * 1024**2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.kill()
        for child in memory.process_tree(proc.pid)[1:]:
            child.kill()
        proc.wait()
    reading = sampler.stop()
    assert reading.source == "rss"
    assert reading.capacity_gib == 4.0
    assert 200 / 1024 <= reading.peak_gib < 1.0, reading
    assert reading.headroom == pytest.approx(1 - reading.peak_gib / 4.0)


def test_without_an_emulated_capacity_the_host_total_is_the_capacity() -> None:
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    sampler = TreeMemorySampler(proc.pid, capacity_gib=None, nvml_factory=no_nvml).start()
    proc.wait()
    reading = sampler.stop()
    assert reading.capacity_gib == pytest.approx(psutil.virtual_memory().total / GIB)


def test_a_process_gone_before_the_first_sample_records_no_peak() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    reading = TreeMemorySampler(proc.pid, capacity_gib=1.0, nvml_factory=no_nvml).start().stop()
    assert reading.peak_gib is None and reading.headroom is None


def test_nvml_absent_or_without_a_driver_falls_back_to_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", NoDriver())
    assert start_nvml() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert start_nvml() is None
    sampler = TreeMemorySampler(1, capacity_gib=2.0)
    assert sampler.source == "rss"


def test_the_nvml_path_counts_only_the_trees_processes_on_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in NVML with two 80 GiB cards; CUDA_VISIBLE_DEVICES=1 makes only the second one ours."""
    from types import SimpleNamespace

    me = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    cards = {
        0: [SimpleNamespace(pid=me.pid, usedGpuMemory=50 * GIB)],  # not visible: not counted
        1: [SimpleNamespace(pid=me.pid, usedGpuMemory=3 * GIB), SimpleNamespace(pid=1, usedGpuMemory=9 * GIB)],
    }
    used = {0: 60 * GIB, 1: 14 * GIB}
    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * GIB, used=used[h]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: cards[h],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    sampler = TreeMemorySampler(me.pid, capacity_gib=1.0, interval_s=0.05)
    sampler.sample()
    assert sampler.peak_bytes == 3 * GIB
    # In a container NVML lists host pids: none is ours, so the visible card's growth since start counts.
    cards[1] = [SimpleNamespace(pid=999_999_999, usedGpuMemory=5 * GIB)]
    used[1] = 19 * GIB
    sampler.sample()
    me.kill()
    me.wait()
    reading = sampler.stop()
    assert (reading.source, reading.capacity_gib, reading.peak_gib) == ("nvml", 80.0, 5.0)


@pytest.mark.parametrize(
    "visible, count, expected",
    [
        (None, 2, [0, 1]),
        ("", 4, []),
        ("1", 4, [1]),
        ("2,0", 4, [2, 0]),
        ("0,7", 4, [0]),
        ("GPU-3b2f", 2, [0, 1]),
    ],
)
def test_visible_indices(visible, count, expected) -> None:
    assert memory._visible_indices(visible, count) == expected


# A training script that holds ~200 MB in a dataloader-like child while it prints Myrtle epoch lines.
TRAINER = f"""
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, '-c', {HOLDER!r}], stdout=subprocess.PIPE)
worker.stdout.readline()
time.sleep(0.6)
for epoch in (1, 2, 3):
    print(f"DLL 2024-01-02 10:11:1{{epoch}}.123456 - epoch {{epoch:4d}} | train_avg_throughput-audio-samples-per-sec : 100.00 | train_avg_took : 0.16", flush=True)
worker.kill()
"""


@pytest.mark.parametrize("margin, tight", [(0.05, False), (0.49, True)])
def test_a_command_trial_records_peak_capacity_headroom_and_tight(tmp_path, monkeypatch, margin, tight) -> None:
    from sweep.core.config import MachineConfig, TrialConfig
    from sweep.core.schema import Status
    from sweep.core.spec import TrialSpec
    from sweep.workloads.command.config import CommandWorkloadConfig
    from sweep.workloads.command.runner import run_command_trial

    monkeypatch.setitem(sys.modules, "pynvml", None)  # the psutil path, on a GPU host too
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    # A GPU profile without NVML (this host): the emulated card, 2 devices x 0.15 GiB, is the capacity.
    machine = MachineConfig(device="cuda", num_devices=2, memory_gib=0.15)
    spec = TrialSpec(1, 1, 4, 4, 8, 2, machine, CommandWorkloadConfig(argv=[sys.executable, str(script)]), TrialConfig(memory_margin=margin), str(tmp_path / "t"))
    result = run_command_trial(spec)
    assert result.status == Status.OK, result.error
    assert result.capacity_gib == pytest.approx(0.3)
    assert 200 / 1024 <= result.peak_mem_gib < 0.3, result
    assert result.headroom == pytest.approx(1 - result.peak_mem_gib / 0.3)
    assert result.tight is tight


def test_a_cpu_profile_command_trial_counts_host_memory_even_where_nvml_answers(tmp_path, monkeypatch) -> None:
    from types import SimpleNamespace

    import psutil

    from sweep.core.config import MachineConfig, TrialConfig
    from sweep.core.spec import TrialSpec
    from sweep.workloads.command.config import CommandWorkloadConfig
    from sweep.workloads.command.runner import run_command_trial

    fake = SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * GIB, used=0), nvmlDeviceGetComputeRunningProcesses=lambda h: [],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # a GPU host: NVML would answer
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    spec = TrialSpec(1, 1, 8, 8, 8, 1, MachineConfig(device="cpu"), CommandWorkloadConfig(argv=[sys.executable, str(script)]), TrialConfig(), str(tmp_path / "t"))
    result = run_command_trial(spec)
    assert result.capacity_gib == pytest.approx(psutil.virtual_memory().total / GIB)
    assert result.peak_mem_gib >= 200 / 1024
