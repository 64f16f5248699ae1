"""Device memory: the per-device budget, peak measurement, and OOM handling.

On CUDA the budget is the card (or a fraction of it). On CPU it is emulated so
that the allocator itself fails, as a GPU's would: the process's address
space is capped (RLIMIT_AS) at its size after start-up plus the budget, and
torch raises "DefaultCPUAllocator: can't allocate memory". Only the soft
limit is lowered, so it can be lifted again after an OOM, before the result
is written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import traceback

import torch

# Substrings of the messages allocators give when memory runs out: the probe's tuple, the one list (the
# probe keeps it in a stdlib-only module, since it runs where sweep may not be importable). Anything else
# is a bug and must surface, not be recorded as "too big" (Lightning's rule).
from sweep.launch.memory import address_space_bytes, address_space_peak_bytes, reset_resident_peak, resident_bytes, resident_peak_bytes
from sweep.probe.boot._sweep_probe_oom import OOM_MESSAGES

GIB = 1024**3


# oneDNN (the CPU LSTM) reports a failed allocation this way; it is an OOM only
# while an emulated CPU budget is in force, otherwise a real error.
ONEDNN_ALLOC_MESSAGES = ("could not create a primitive", "could not execute a primitive")
_cpu_budget_active = False


class DeviceOOM(RuntimeError):
    """An OOM attributed to a phase of the step, raised alike on every rank."""

    def __init__(self, phase: str, message: str, rank: int = 0, traceback_text: str = "") -> None:
        super().__init__(message)
        self.phase = phase
        self.rank = rank  # the rank that ran out first
        self.traceback_text = traceback_text  # the original traceback, on the rank that ran out


def is_oom_error(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, DeviceOOM, torch.OutOfMemoryError)):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    if _cpu_budget_active and any(m in text for m in ONEDNN_ALLOC_MESSAGES):
        return True
    return any(m in text for m in OOM_MESSAGES)


def oom_summary(exc: BaseException) -> str:
    """One line naming the failed allocation, without allocator boilerplate."""
    text = str(exc) or type(exc).__name__
    for marker in OOM_MESSAGES + ONEDNN_ALLOC_MESSAGES:
        at = text.find(marker)
        if at >= 0:
            text = text[at:]
            if marker in ONEDNN_ALLOC_MESSAGES:
                text = f"oneDNN {text} (allocation failed under the memory budget)"
            break
    line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    # "...you tried to allocate 123 bytes. Error code 12 (Cannot allocate memory)": keep the first part.
    line = line.split(". Error code")[0].split(". GPU ")[0].rstrip(". ")
    return line[:300]


def drop_exception(exc: BaseException) -> None:
    """Release what an exception pins: its traceback's frames hold the step's big tensors."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def free_device_memory(device: torch.device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()


# ---------------------------------------------------------------- CPU allocator

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_NEVER_TRIM = 1 << 30  # the heap's free top is given back only by an explicit malloc_trim
_libc = None


def _get_libc():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            _libc = False
    return _libc


def configure_cpu_allocator(mmap_threshold: int = 256 * 1024, arena_max: int = 1) -> None:
    """Make the address-space size track live tensors on glibc; call before the model is built.

    A fixed mmap threshold sends every tensor over 256 KiB to its own mapping,
    unmapped on free. With glibc's sliding threshold, freed blocks stay in the
    heap and fragment it, and a pair's peak came to depend on allocation order
    (a smaller joint batch could need more than a larger one). The price is
    fresh, page-faulted memory for each big tensor: steps run slower, alike for
    every pair. One arena stops each new thread reserving 64 MiB of address space.
    The heap is never trimmed on its own, so room a SmallObjectReserve made stays.
    """
    libc = _get_libc()
    if libc and hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_ARENA_MAX, arena_max)
        libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)


class SmallObjectReserve:
    """Room for a step's small allocations, mapped before the baseline is taken (CPU only).

    Tensors of 256 KiB and more get mappings of their own (configure_cpu_allocator), sized exactly.
    Python objects come from 1 MiB pymalloc arenas, and C++ objects and small tensors from glibc's
    heap. Whether a step mapped a new arena or grew the heap depended on what the process did before
    the baseline (a warm worker forks its trial after an idle poll of load-dependent length): the
    demo's accum=4 split=2 counted 15.9-18.1 MiB across busy runs, and one sweep in 25 marked it
    tight. With room mapped first it counted 13.5-14.5 MiB in 35 sweeps (docs/concepts.md).

    An arena stays mapped while any object in it lives, so a few kept objects hold each one; the
    heap's room is malloc'd and freed, and stays because the trim threshold is raised.
    """

    def __init__(self, python_mib: int = 12, heap_mib: int = 4) -> None:
        objects = [(i, i) for i in range(python_mib * 2**20 // 96)]  # a 2-tuple and its int: about 96 B
        self.pinned = objects[::4096]  # about 3 per arena: its other pools stay free for the step
        del objects
        libc = _get_libc()
        if libc and hasattr(libc, "malloc"):
            libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
            libc.free.argtypes = [ctypes.c_void_p]
            blocks = [libc.malloc(64 * 1024) for _ in range(heap_mib * 16)]  # under the mmap threshold: from the heap
            for block in blocks:
                libc.free(block)


def _malloc_trim() -> None:
    libc = _get_libc()
    if libc and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


# ---------------------------------------------------------------- budget and peak


class MemoryBudget:
    """Caps what this process may allocate on `device` at `memory_gib` (None: no cap).

    Call enforce() after start-up (torch imported, model built, one warm-up pass
    run so that threads and lazily loaded kernels are in the baseline).
    """

    def __init__(self, device: torch.device, memory_gib: float | None) -> None:
        self.device = torch.device(device)
        self.budget_bytes = None if memory_gib is None else int(float(memory_gib) * GIB)
        self.baseline_bytes = 0
        self._saved_limit: tuple[int, int] | None = None

    def enforce(self) -> None:
        if self.budget_bytes is None:
            return
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            total = torch.cuda.get_device_properties(index).total_memory
            if self.budget_bytes < total:
                torch.cuda.set_per_process_memory_fraction(self.budget_bytes / total, index)
            self.baseline_bytes = torch.cuda.memory_allocated(index)
            return
        global _cpu_budget_active
        self.baseline_bytes = address_space_bytes()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        self._saved_limit = (soft, hard)
        limit = self.baseline_bytes + self.budget_bytes
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        _cpu_budget_active = True

    def lift(self) -> None:
        """Undo enforce() on CPU, so writing results after an OOM cannot fail for memory."""
        global _cpu_budget_active
        if self._saved_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, self._saved_limit)
            self._saved_limit = None
            _cpu_budget_active = False

    def __enter__(self) -> MemoryBudget:
        self.enforce()
        return self

    def __exit__(self, *exc_info) -> None:
        self.lift()


class MemoryBaseline:
    """What a trial's memory figures are counted above: the device's use once start-up and warm-up are done.

    The peaks themselves are the probe's (sweep.probe, per step); this is only where they start from.
    Used memory: CUDA allocated bytes, CPU resident bytes. Counted memory (what the budget counts): on
    CUDA the allocator's reserved bytes as they are (the card loses all of them); on CPU the address
    space above its size here, which is what the emulated cap (RLIMIT_AS) adds to."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.used_bytes, self.address_bytes = torch.cuda.memory_allocated(self.device), 0
        else:
            self.used_bytes, self.address_bytes = resident_bytes(), address_space_bytes()

    def used_above(self, peak_bytes: int) -> int:
        return max(0, int(peak_bytes) - self.used_bytes)

    def counted_above(self, peak_bytes: int) -> int:
        """VmPeak cannot be reset: on CPU it also holds start-up's and the warm-up's peak, so for a small pair
        this is an upper bound of the steps' own, never an understatement."""
        return int(peak_bytes) if self.device.type == "cuda" else max(0, int(peak_bytes) - self.address_bytes)


class PeakMemory:
    """Peak device memory above a baseline taken at construction (or rebase()): a meter for tests that
    look inside a step (per phase); trials take their peaks from the probe (MemoryBaseline).

    CPU: resident high-water mark (VmHWM) above the baseline resident size.
    CUDA: torch's max_memory_allocated above the baseline allocated bytes.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.address_baseline_bytes = 0
        self.rebase()

    def _current(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        return resident_bytes()

    def rebase(self) -> None:
        self.baseline_bytes = self._current()
        if self.device.type != "cuda":
            self.address_baseline_bytes = address_space_bytes()
        self.reset()

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_resident_peak()

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = resident_peak_bytes()
        return max(0, peak - self.baseline_bytes)

    def reserved_peak_bytes(self) -> int | None:
        """What the budget counts at the peak: the caching allocator's reserved peak on CUDA (what the
        card really loses); on CPU, the address-space peak (VmPeak) above the baseline address space,
        what the emulated cap (RLIMIT_AS) counts. Mapped pages a step never touches are not resident,
        so the resident peak alone left a pair that OOMs now and then looking roomy.

        VmPeak cannot be reset: it also holds start-up's and the warm-up's peak, so for a small pair
        this is an upper bound of the steps' own, never an understatement."""
        if self.device.type != "cuda":
            return max(0, address_space_peak_bytes() - self.address_baseline_bytes)
        return torch.cuda.max_memory_reserved(self.device)

    def peak_gib(self) -> float:
        return self.peak_bytes() / GIB
