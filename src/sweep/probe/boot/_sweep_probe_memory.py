"""The probe's memory figures for the open step (a part of _sweep_probe.Probe, split off for size).

Peaks since the last sample are folded into the open step's: on the CPU from /proc/self/status
(VmHWM, reset after each read through /proc/self/clear_refs, and VmPeak), on CUDA from the
allocator's own max allocated / max reserved, reset after each read.

The trainer must not see those resets (coverage.py's rule: measuring changes nothing the program
observes). A trainer that logs torch.cuda.max_memory_allocated() once an epoch would otherwise log
the probe's last step. So torch.cuda.memory_stats and reset_peak_memory_stats (and with them
max_memory_allocated / max_memory_reserved, which read memory_stats) are wrapped: every ".peak"
figure a reader gets is the largest since the trainer's own last reset, folded from the probe's
samples. Stdlib and torch only.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any


class MemorySampling:
    """Reading and resetting memory peaks (mixed into Probe)."""

    real_memory_stats = real_reset_peaks = None  # torch.cuda's own, once the view is installed
    trainer_peaks: dict  # device index -> {memory_stats ".peak" key: bytes since the trainer's last reset}

    if TYPE_CHECKING:  # Probe's (_sweep_probe.py): the state and methods these share with it
        torch: Any
        undo: list[Callable[[], object]]
        _disabled: set[str]
        memory: dict[str, int]
        status_fd: int | None  # /proc/self/status and clear_refs, kept open
        clear_refs_fd: int | None
        fd_pid: int

        def problem(self, where: str, exc: BaseException) -> None: ...

    def _install_peak_view(self, torch) -> None:
        """Wrap torch.cuda's peak statistics so the trainer reads them as if no probe reset them."""
        memory_module, cuda = torch.cuda.memory, torch.cuda
        real_stats, real_reset = memory_module.memory_stats, memory_module.reset_peak_memory_stats
        self.real_memory_stats, self.real_reset_peaks = real_stats, real_reset
        probe = self

        def device_index(device):  # the key _sample_memory folds under
            return cuda.current_device() if device is None else cuda._utils._get_device_index(device, optional=True)

        @functools.wraps(real_stats)
        def memory_stats(device=None):
            stats = real_stats(device)
            folded = probe.trainer_peaks.get(device_index(device)) if stats else None
            for key, value in (folded or {}).items():
                if stats.get(key, value) < value:
                    stats[key] = value
            return stats

        @functools.wraps(real_reset)
        def reset_peak_memory_stats(device=None):
            probe._sample_memory()  # the open step keeps the peak the trainer is about to reset
            real_reset(device)
            probe.trainer_peaks.pop(device_index(device), None)

        for module in (memory_module, cuda):
            for name, wrapper in (("memory_stats", memory_stats), ("reset_peak_memory_stats", reset_peak_memory_stats)):
                original = getattr(module, name)
                setattr(module, name, wrapper)
                self.undo.append(functools.partial(setattr, module, name, original))

    def reset_peaks(self) -> None:
        """Memory peaks count from now (a caller whose start-up and warm-up must not count)."""
        self._sample_memory()
        self.memory = {}

    def open_step_memory(self) -> dict:
        """The open step's memory figures so far (a step an OOM cut short never closes)."""
        self._sample_memory()
        return dict(self.memory)

    def _proc_status(self) -> dict[str, int]:
        """Bytes of /proc/self/status's Vm* lines (resident and address-space, current and peak): one
        pread on a descriptor kept open (a fork's child opens its own)."""
        if self.status_fd is None or self.fd_pid != os.getpid():
            self.status_fd, self.clear_refs_fd, self.fd_pid = os.open("/proc/self/status", os.O_RDONLY), None, os.getpid()
        text = os.pread(self.status_fd, 8192, 0)
        out = {}
        for name in (b"VmPeak", b"VmSize", b"VmHWM", b"VmRSS"):
            at = text.find(name + b":")
            if at >= 0:
                at += len(name) + 1
                out[name.decode()] = int(text[at : text.find(b"kB", at)]) * 1024  # "VmRSS:	  123 kB"
        return out

    def _sample_memory(self) -> None:
        """Fold the peaks since the last sample into the open step's, then reset them."""
        memory = self.memory
        try:
            status = self._proc_status()
            memory["resident_peak"] = max(memory.get("resident_peak", 0), status.get("VmHWM", 0))
            memory["resident"] = status.get("VmRSS", 0)
            memory["address_peak"] = max(memory.get("address_peak", 0), status.get("VmPeak", 0))
            memory["address"] = status.get("VmSize", 0)
            if "clear_refs" not in self._disabled:
                try:
                    if self.clear_refs_fd is None or self.fd_pid != os.getpid():
                        self.clear_refs_fd = os.open("/proc/self/clear_refs", os.O_WRONLY)
                    os.write(self.clear_refs_fd, b"5")  # VmHWM back to the current resident size (Linux >= 4.0)
                except OSError as exc:
                    self.problem("clear_refs", exc)
        except Exception as exc:  # noqa: BLE001
            self.problem("CPU memory", exc)
        torch = self.torch
        try:
            if torch.cuda.is_initialized():
                device = torch.cuda.current_device()
                # The allocator's own figures (without the view, if it failed to install: the trainer then sees our resets).
                stats = (self.real_memory_stats or torch.cuda.memory_stats)(device)
                folded = self.trainer_peaks.setdefault(device, {})
                for key, value in stats.items():
                    if key.endswith(".peak") and folded.get(key, -1) < value:
                        folded[key] = value
                memory["allocated_peak"] = max(memory.get("allocated_peak", 0), stats.get("allocated_bytes.all.peak", 0))
                memory["reserved_peak"] = max(memory.get("reserved_peak", 0), stats.get("reserved_bytes.all.peak", 0))
                (self.real_reset_peaks or torch.cuda.reset_peak_memory_stats)(device)
        except Exception as exc:  # noqa: BLE001
            self.problem("CUDA memory", exc)

