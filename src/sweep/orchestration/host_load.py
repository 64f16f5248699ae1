"""How busy the host was while the sweep's trials ran: the tasks runnable on it, sampled at each poll.

On a CPU host an oversubscribed machine moves a pair's figure between processes by far more than the quiet
machine's run-to-run noise (core/run_to_run.py's BUSY_HOST_NOISE); the confidence score then assumes the busy
host's noise, unless machine.run_to_run_noise was set. The samples are kept in the sweep dir, so a resume that
runs nothing scores as the run that measured did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from sweep.core.run_to_run import BUSY_HOST_NOISE, busy_load
from sweep.records import atomic_write_text

LOAD_FILE = "host_load.json"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as a Slurm or taskset cgroup sets it), else every CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runnable_tasks() -> float:
    """Tasks runnable on the host now, this reader aside (/proc/loadavg's running count): how many want a CPU at
    this instant. The 1-minute load average lags by a minute, longer than a short sweep's trials, so it is only the
    fallback where /proc is not there."""
    try:
        with open("/proc/loadavg") as f:
            return max(0.0, float(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return os.getloadavg()[0]


class HostLoad:
    """The load samples of this sweep (an earlier run's included), one writer: the orchestrator."""

    def __init__(self, sweep_dir: Path, read_load: Callable[[], float] = runnable_tasks, cpus: int | None = None) -> None:
        self.path = Path(sweep_dir) / LOAD_FILE
        self.read_load = read_load
        self.cpus = cpus or usable_cpus()
        self.samples: list[float] = []
        self.saved = 0
        try:
            kept = json.loads(self.path.read_text())
            self.samples = [float(x) for x in kept.get("loads", []) if isinstance(x, (int, float))]
            self.saved = len(self.samples)
        except (OSError, ValueError, AttributeError):
            pass  # none yet, or not ours to trust: measured afresh

    def sample(self) -> None:
        try:
            self.samples.append(float(self.read_load()))
        except OSError:
            pass  # no load average on this platform: nothing is known, and nothing changes

    def save(self) -> None:
        if len(self.samples) != self.saved:
            atomic_write_text(self.path, json.dumps({"cpus": self.cpus, "loads": [round(x, 2) for x in self.samples]}) + "\n")
            self.saved = len(self.samples)


def busy_host_note(machine: object, load: HostLoad, noise: float) -> str:
    """One line where a CPU host was oversubscribed while trials ran and the score must assume the busy host's noise
    (machine.run_to_run_noise unset, and less than BUSY_HOST_NOISE assumed); "" where it need not."""
    if getattr(machine, "device", "") != "cpu" or getattr(machine, "run_to_run_noise", None) is not None or noise >= BUSY_HOST_NOISE:
        return ""
    per_cpu = busy_load(load.samples, load.cpus)
    if per_cpu is None:
        return ""
    return (f"the host was busy while trials ran ({per_cpu:.1f} runnable tasks per CPU on {load.cpus} CPU(s)): confidence scored with "
            f"{BUSY_HOST_NOISE:.0%} run-to-run noise, not the {noise:.1%} of a quiet one (machine.run_to_run_noise=X sets it)")
