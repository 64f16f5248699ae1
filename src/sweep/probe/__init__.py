"""The probe: step times, allocator memory and OOMs measured inside a trial's own Python processes.

How it gets in: probe_env() gives a command the variables that put boot/ first on PYTHONPATH and name
the record dir (SWEEP_PROBE_DIR). Every interpreter then runs boot/sitecustomize.py at start-up, which
arms boot/_sweep_probe.py once the process imports torch (inert otherwise). install() arms it in the
calling process (the built-in workload). read_probe() reads what the processes wrote; the summary is
core/probe_report.py's.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from sweep.core.probe_report import (
    DEFAULT_MODULE_PHASE_PATTERNS,
    ProbeOom,
    ProbeReport,
    ProbeStep,
    compile_module_phase_patterns,
    oom_phase_of,
    parse_records,
    summarise,
)

BOOT_DIR = Path(__file__).resolve().parent / "boot"
RECORD_DIR_ENV = "SWEEP_PROBE_DIR"
RECORD_GLOB = "*.jsonl"

__all__ = [
    "BOOT_DIR",
    "DEFAULT_MODULE_PHASE_PATTERNS",
    "RECORD_DIR_ENV",
    "ProbeOom",
    "ProbeReport",
    "ProbeStep",
    "compile_module_phase_patterns",
    "install",
    "oom_phase_of",
    "probe_env",
    "read_probe",
    "runtime",
]


def probe_env(record_dir: str | Path, *, base_env: Mapping[str, str], accum: int = 0) -> dict[str, str]:
    """The variables to add to a command's environment so that its Python processes are probed.

    accum (the pair's accumulation) tells a probe timing backward passes which of them end a step, so it waits
    for the device at those alone. The launcher's own Slurm step is named so that the probe takes Slurm's task
    variables it inherits from there (an allocation's SLURM_NTASKS) for the launcher's, not the command's ranks.

    PYTHONPATH gets the boot dir first, ahead of base_env's own entries, kept in order and as written: an
    empty entry is the current dir to Python (what `export PYTHONPATH=$PYTHONPATH:/x` leaves when it was
    unset), so it stays, or a script importing from where it starts would not find its modules. A PYTHONPATH
    set but empty is no entry at all to Python, and adds none here."""
    given = base_env.get("PYTHONPATH", "")
    rest = [p for p in given.split(os.pathsep) if not p or os.path.abspath(p) != str(BOOT_DIR)] if given else []
    env = {RECORD_DIR_ENV: str(Path(record_dir).resolve()), "PYTHONPATH": os.pathsep.join([str(BOOT_DIR), *rest]),
           "SWEEP_PROBE_LAUNCHER_STEP": f"{base_env.get('SLURM_JOB_ID', '')}.{base_env.get('SLURM_STEP_ID', '')}"}
    if accum > 0:
        env["SWEEP_PROBE_ACCUM"] = str(int(accum))
    return env


def runtime() -> ModuleType:
    """The in-process probe module, the same one boot/sitecustomize.py arms (never a second copy)."""
    if str(BOOT_DIR) not in sys.path:
        sys.path.append(str(BOOT_DIR))
    return importlib.import_module("_sweep_probe")


def install(record_dir: str | Path) -> None:
    """Arm the probe in this process, writing to record_dir (a new dir: a new record from step 0).

    It keeps this process's step records in memory too (runtime().PROBE.steps), for a caller that
    needs each step's figures as it goes (the built-in workload's adaptive stopping)."""
    import torch  # noqa: F401 - the probe's hooks are torch's

    runtime().PROBE.arm(str(record_dir), keep_steps=True)


def read_probe(record_dir: str | Path, *more_dirs: str | Path, running: bool = False) -> ProbeReport:
    """The summary of every process's records in record_dir and more_dirs (a multi-node trial's other nodes
    write beside node 0's dir: every node's ranks are read); none there: an empty, unarmed report. running: the
    command is still running (a process that stepped and exited since is no part of its training)."""
    dirs = [Path(record_dir), *map(Path, more_dirs)]
    records, problems = {}, []
    for folder in dirs:
        files = sorted(folder.glob(RECORD_GLOB)) if folder.is_dir() else []
        for path in files:
            # Named with its dir beyond the first: every node numbers its files by its own pids.
            source = path.name if folder == dirs[0] else f"{folder.name}/{path.name}"
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                problems.append(f"{source}: {exc.strerror or exc}")
                continue
            records[source], found = parse_records(text, source)
            problems.extend(found)
    return summarise(records, problems, running=running)
