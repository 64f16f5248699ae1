"""The probe's memory figures for the open step (a part of _sweep_probe.Probe, split off for size).

Peaks since the last sample are folded into the open step's: on the CPU from /proc/self/status
(VmHWM, reset after each read through /proc/self/clear_refs, and VmPeak), on CUDA from the
allocator's own max allocated / max reserved, reset after each read. Stdlib and torch only.
"""

from __future__ import annotations

import os


class MemorySampling:
    """Reading and resetting memory peaks (mixed into Probe)."""

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
                memory["allocated_peak"] = max(memory.get("allocated_peak", 0), torch.cuda.max_memory_allocated(device))
                memory["reserved_peak"] = max(memory.get("reserved_peak", 0), torch.cuda.max_memory_reserved(device))
                torch.cuda.reset_peak_memory_stats(device)
        except Exception as exc:  # noqa: BLE001
            self.problem("CUDA memory", exc)

