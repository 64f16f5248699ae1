"""A trial's whole process tree: found as it grows, and ended every way a trial ends.

A command may fork children that outlive it (a data-loader daemon, a `setsid` child that leaves
the command's session), and on a GPU such a child holds memory during later trials. The trial's
job process becomes a child subreaper (Linux prctl), so orphans of its command are re-parented to
it rather than to init and stay visible as its descendants; a background thread records every
descendant with its start time as it appears, into the trial dir, so that even when the job
process itself is killed the orchestrator can end what it left. A pid is only ever signalled
while its start time is still the recorded one: a pid reused by another process is left alone.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

import psutil

from sweep.records import atomic_write_text

PROCESSES_FILE = "processes.json"
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# How long each step of ending a process tree waits: SIGTERM's grace, then SIGKILL's.
GRACE_S = 3.0
POLL_S = 0.2


def process_age_s() -> float | None:
    """Seconds since this process started, so a trial's wall_s includes its interpreter and torch start-up.
    From /proc's clock ticks and uptime: psutil's create_time adds the boot time in whole seconds, a second's
    error on a start-up of a few."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of stat(5); the first two were split off
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux); False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


Identity = tuple[int, float]  # (pid, psutil create_time)


def identity(proc: psutil.Process) -> Identity | None:
    try:
        return proc.pid, proc.create_time()
    except psutil.Error:
        return None


def same_process(pid: int, create_time: float) -> psutil.Process | None:
    """The live process with this pid if it is still the one that started at create_time."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


class TreeTracker:
    """Every descendant this process has had, recorded as it appears (in memory and in record_path)."""

    def __init__(self, record_path: Path | None, interval_s: float = POLL_S) -> None:
        self.record_path = record_path
        self.interval_s = interval_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-tree", daemon=True)

    def start(self) -> TreeTracker:
        self.poll()
        self._thread.start()
        return self

    def poll(self) -> None:
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        new = [i for i in map(identity, children) if i is not None and self.seen.get(i[0]) != i[1]]
        if not new:
            return
        self.seen.update(new)
        if self.record_path is not None:
            try:
                atomic_write_text(self.record_path, json.dumps(sorted(self.seen.items())) + "\n")
            except OSError:
                pass  # a full disk: the in-memory record still ends the tree from here

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self.poll()

    def end_all(self, grace_s: float = GRACE_S) -> list[int]:
        """End every descendant seen, and any new ones; the pids that had to be ended."""
        self.poll()
        return end_processes(self.seen.items(), grace_s)


def end_processes(identities: Iterable[tuple[int, float]], grace_s: float = GRACE_S, first: int = signal.SIGTERM) -> list[int]:
    """SIGCONT (a stopped process cannot act on anything else), then `first`, then SIGKILL after grace_s;
    only to processes that are still the recorded ones. Returns the pids that were alive."""
    procs = [p for pid, t in identities if (p := same_process(int(pid), float(t))) is not None]
    if not procs:
        return []
    for sig in (signal.SIGCONT, first):
        _send(procs, sig)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if alive and first != signal.SIGTERM:
        _send(alive, signal.SIGTERM)
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
    if alive:
        _send(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def _send(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil checks the pid was not reused before signalling
        except psutil.Error:
            pass


def recorded(trial_dir: Path) -> list[tuple[int, float]]:
    """The processes a trial's job recorded (PROCESSES_FILE); [] if none or unreadable."""
    try:
        data = json.loads((Path(trial_dir) / PROCESSES_FILE).read_text())
        return [(int(pid), float(t)) for pid, t in data]
    except (OSError, ValueError, TypeError):
        return []


def end_recorded(trial_dir: Path, grace_s: float = GRACE_S) -> list[int]:
    """End what a trial's job left running (its job was killed before it could); the pids ended."""
    return end_processes(recorded(trial_dir), grace_s)


def end_in_background(identities: list[tuple[int, float]], first: int, grace_s: float = GRACE_S) -> threading.Thread:
    """end_processes without blocking the caller (the orchestrator's loop keeps polling meanwhile)."""
    thread = threading.Thread(target=end_processes, args=(identities, grace_s, first), name="sweep-end-tree", daemon=True)
    thread.start()
    return thread


def os_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
