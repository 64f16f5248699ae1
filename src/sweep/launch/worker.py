"""Warm workers: one process per device group runs built-in trials in turn.

Start-up is most of a short GPU trial: on an H100 an OOM at step 0 cost 14-15 s of wall, nearly
all of it interpreter start, imports, the CUDA context and the model build. A warm worker pays
the interpreter, imports and context once and runs each built-in trial's `run_trial` in turn
(which already counts start-up only for the first trial of a process).

Between trials the worker frees the allocator (garbage, then torch.cuda.empty_cache or glibc's
malloc_trim) and resets the peak statistics, then must prove a clean state, or hand the rest of
its trials back for a fresh worker:

* CUDA: nothing allocated or reserved beyond what the worker held before its first trial;
* CPU: the emulated budget caps the address space, and what a trial records as its reserved peak
  is the address-space peak (VmPeak), which cannot be reset; so a CPU worker is clean only while
  no trial has raised VmPeak above the worker's own before its first trial. In practice every
  built-in trial does, so on CPU a worker runs one trial and hands the rest back: the same
  records as fresh processes, and no start-up saved;
* after a fatal error (run_trial raised: neither a measurement nor a recorded OOM): never.

Command trials keep their own processes: their memory is the user's program's.

    python -m sweep.launch.worker SPECS.pkl REPORT.pkl   # what run_warm starts for each worker
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER_MODULE = "sweep.launch.worker"


@dataclass
class WorkerRun:
    """What one worker process did: its trials' records and what it handed back."""

    pid: int
    results: list[Any] = field(default_factory=list)  # TrialResult, in the order run
    handed_back: list[Any] = field(default_factory=list)  # TrialSpec: for a fresh worker
    why: str = ""  # why it handed them back; empty when it ran them all


@dataclass(frozen=True)
class _Baseline:
    device: str
    allocated: int = 0  # CUDA bytes allocated before the first trial
    reserved: int = 0  # CUDA bytes reserved before the first trial
    address_peak: int = 0  # CPU: VmPeak before the first trial


def _device_of(spec: Any) -> str:
    return str(spec.machine.device)


def _free_and_reset(device: str) -> None:
    import torch

    from sweep.workloads.rnnt.memory import free_device_memory, reset_resident_peak

    gc.collect()
    if device == "cuda":
        free_device_memory(torch.device("cuda"))
        torch.cuda.reset_peak_memory_stats()
    else:
        free_device_memory(torch.device("cpu"))
        reset_resident_peak()


def _baseline(device: str) -> _Baseline:
    if device == "cuda":
        import torch

        return _Baseline(device, torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    from sweep.workloads.rnnt.memory import address_space_peak_bytes

    return _Baseline(device, address_peak=address_space_peak_bytes())


def dirty_reason(before: _Baseline) -> str | None:
    """Why this process cannot prove it is as clean as before its first trial, or None when it is."""
    if before.device == "cuda":
        import torch

        allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        if allocated > before.allocated or reserved > before.reserved:
            return f"CUDA memory still held after freeing: {allocated} B allocated, {reserved} B reserved (before: {before.allocated}, {before.reserved})"
        return None
    from sweep.workloads.rnnt.memory import address_space_peak_bytes

    peak = address_space_peak_bytes()
    if peak > before.address_peak:
        return (f"the address-space peak (VmPeak, what a CPU trial's reserved peak counts) rose from {before.address_peak} B to {peak} B "
                f"and cannot be reset")
    return None


def serve(specs: list[Any]) -> WorkerRun:
    """Run the built-in trials `specs` in turn in this process, as long as it can prove a clean state."""
    from sweep.workloads.rnnt.config import RNNTWorkloadConfig
    from sweep.workloads.rnnt.runner import run_trial

    foreign = [s for s in specs if not isinstance(s.workload, RNNTWorkloadConfig)]
    if foreign:
        raise ValueError(f"a warm worker runs built-in trials only; {len(foreign)} command trial(s) keep their own processes")
    run = WorkerRun(os.getpid())
    if not specs:
        return run
    before = _baseline(_device_of(specs[0]))
    for i, spec in enumerate(specs):
        if i:
            _free_and_reset(before.device)
            why = dirty_reason(before)
            if why:
                run.handed_back, run.why = list(specs[i:]), why
                return run
        try:
            run.results.append(run_trial(spec))
        except Exception as exc:  # noqa: BLE001 - its record is written (failed); this process is not to be trusted
            run.handed_back, run.why = list(specs[i + 1 :]), f"fatal error in accum={spec.accum} split={spec.split}: {type(exc).__name__}"
            return run
    return run


def run_warm(specs: list[Any], timeout_s: float = 600.0) -> list[WorkerRun]:
    """Run `specs` in warm worker processes, one after another, a fresh one whenever a worker hands trials back."""
    import tempfile

    runs: list[WorkerRun] = []
    left = list(specs)
    with tempfile.TemporaryDirectory(prefix="sweep-worker-") as tmp:
        while left:
            inbox, report = Path(tmp) / f"specs{len(runs)}.pkl", Path(tmp) / f"report{len(runs)}.pkl"
            inbox.write_bytes(pickle.dumps(left))
            subprocess.run([sys.executable, "-m", WORKER_MODULE, str(inbox), str(report)], check=True, timeout=timeout_s)
            run = pickle.loads(report.read_bytes())
            runs.append(run)
            if len(run.handed_back) >= len(left):  # nothing ran: do not loop
                raise RuntimeError(f"a fresh warm worker ran none of {len(left)} trial(s): {run.why}")
            left = run.handed_back
    return runs


def main(argv: list[str]) -> int:
    specs = pickle.loads(Path(argv[0]).read_bytes())
    run = serve(specs)
    Path(argv[1]).write_bytes(pickle.dumps(run))
    return 0


if __name__ == "__main__":
    # Through the module's own name, so the pickled report names sweep.launch.worker.WorkerRun, not __main__'s.
    from sweep.launch.worker import main as _main

    sys.exit(_main(sys.argv[1:]))
