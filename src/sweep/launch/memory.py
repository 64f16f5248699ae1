"""Peak memory of a running trial's whole process tree, sampled from outside it.

A command trial is someone else's training script: the only way to see its memory
is to watch its processes. A background thread walks the tree (psutil, children
recursive: dataloader workers and ranks included) every ~0.2 s and sums, per
sample, each process's GPU memory through NVML (nvidia-ml-py) when NVML starts,
else each process's resident set. The peak of those sums is the trial's peak.

headroom = 1 - peak / capacity: the fraction of the device left at the peak.
A pair is tight when it ran ok but its headroom is below trial.memory_margin.

This process's own figures (address space, resident set and their peaks) come from
/proc/self/status: the built-in trial's CPU budget and peaks, and a warm worker's proof
that it is as clean as it started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

GIB = 1024**3
SAMPLE_INTERVAL_S = 0.2


def _proc_status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {field}: the CPU memory budget needs Linux")


def address_space_bytes() -> int:
    return _proc_status_bytes("VmSize")


def resident_bytes() -> int:
    return _proc_status_bytes("VmRSS")


def resident_peak_bytes() -> int:
    return _proc_status_bytes("VmHWM")


def address_space_peak_bytes() -> int:
    return _proc_status_bytes("VmPeak")


def reset_resident_peak() -> None:
    # "5" resets VmHWM to the current resident size (Linux >= 4.0).
    Path("/proc/self/clear_refs").write_text("5")


def headroom(peak_gib: float | None, capacity_gib: float | None) -> float | None:
    """Fraction of capacity left at the peak (negative: the peak exceeded it); None when either is unknown."""
    if peak_gib is None or not capacity_gib or capacity_gib <= 0:
        return None
    return 1.0 - float(peak_gib) / float(capacity_gib)


def is_tight(ok: bool, headroom_fraction: float | None, margin: float) -> bool:
    """An ok trial whose peak leaves less than `margin` of the device: may OOM in real training."""
    return bool(ok) and headroom_fraction is not None and headroom_fraction < float(margin)


@dataclass
class MemoryReading:
    peak_gib: float | None  # None: nothing could be sampled
    capacity_gib: float | None
    source: str  # "nvml" or "rss": what the peak counts

    @property
    def headroom(self) -> float | None:
        return headroom(self.peak_gib, self.capacity_gib)


class _Nvml:
    """NVML handles of the devices this process may use (CUDA_VISIBLE_DEVICES applied)."""

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py; absent or without a driver: the caller falls back to psutil

        pynvml.nvmlInit()
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in _visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), count)]
        if not self.handles:
            pynvml.nvmlShutdown()
            raise RuntimeError("no visible NVML device")
        self.baseline_bytes = self.device_used_bytes()

    def capacity_bytes(self) -> int:
        return sum(int(self.nvml.nvmlDeviceGetMemoryInfo(h).total) for h in self.handles)

    def device_used_bytes(self) -> int:
        return sum(int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles)

    def used_bytes(self, pids: set[int]) -> int:
        """GPU memory of these pids; in a container NVML may list host pids that match none of
        ours, and then the visible devices' use above what they held at start stands in."""
        used, matched = 0, False
        for h in self.handles:
            for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(h):
                if proc.pid in pids:
                    matched = True
                    used += int(proc.usedGpuMemory or 0)
        if matched:
            return used
        return max(0, self.device_used_bytes() - self.baseline_bytes)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass


def cuda_visible_numbers(visible: str | None) -> list[int] | None:
    """The device numbers a CUDA_VISIBLE_DEVICES value names ("" names none); None when it is unset
    or names devices by UUID, which cannot be mapped to numbers."""
    if visible is None:
        return None
    parts = [p.strip() for p in visible.split(",") if p.strip()]
    return [int(p) for p in parts] if all(p.isdigit() for p in parts) else None


def _visible_indices(visible: str | None, count: int) -> list[int]:
    """NVML indices named by CUDA_VISIBLE_DEVICES (numbers only; UUIDs or unset: all devices)."""
    numbers = cuda_visible_numbers(visible)
    return list(range(count)) if numbers is None else [n for n in numbers if n < count]


def start_nvml() -> _Nvml | None:
    """NVML when the library is installed, a driver answers and a device is visible; else None."""
    try:
        return _Nvml()
    except Exception:  # noqa: BLE001 - ImportError, NVMLError (no driver), no device: all mean "use psutil"
        return None


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants still alive."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def rss_bytes(processes: Iterable[psutil.Process]) -> int:
    total = 0
    for proc in processes:
        try:
            total += proc.memory_info().rss
        except psutil.Error:  # ended between listing and reading
            continue
    return total


class TreeMemorySampler:
    """Samples one process tree's memory on a thread until stop(); the peak is the largest sample.

    capacity_gib: what the peak is measured against when NVML is not there (the
    emulated machine.memory_gib; None: the host's total memory).
    """

    def __init__(self, pid: int, capacity_gib: float | None = None, interval_s: float = SAMPLE_INTERVAL_S,
                 nvml_factory: Callable[[], Any] = start_nvml) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.nvml = nvml_factory()
        if self.nvml is not None:
            self.source, self.capacity_gib = "nvml", self.nvml.capacity_bytes() / GIB
        else:
            self.source = "rss"
            self.capacity_gib = float(capacity_gib) if capacity_gib else psutil.virtual_memory().total / GIB
        self.peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memory-sampler-{pid}", daemon=True)

    def start(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        tree = process_tree(self.pid)
        if not tree:
            return
        used = self.nvml.used_bytes({p.pid for p in tree}) if self.nvml is not None else rss_bytes(tree)
        self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed sample must not end the trial; the next one may work
                pass
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> MemoryReading:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.nvml is not None:
            self.nvml.close()
        peak = None if self.peak_bytes is None else self.peak_bytes / GIB
        return MemoryReading(peak_gib=peak, capacity_gib=self.capacity_gib, source=self.source)
