"""Which Python processes of a command trial the probe could not reach, and why (issue 45).

The probe gets into a process only through its environment: SWEEP_PROBE_DIR, and the boot dir on
PYTHONPATH, whose sitecustomize.py the interpreter runs at start-up. Three things keep it out, and none
leaves a trace inside the process (nothing of sweep's runs there): an interpreter flag (`-I` and `-E`
ignore PYTHONPATH, `-S` and `-I` run no sitecustomize), a wrapper that replaced PYTHONPATH or cleared the
environment, or another sitecustomize ahead of the boot dir on PYTHONPATH. So they are read from outside,
by the trial's job process, which is a child subreaper and sees every descendant: each Python process of
the trial's tree, as it is first seen under a new command line (a fork that has not exec'd yet is looked
at again after it does), is judged from its command line and the environment it was started with
(/proc/PID/cmdline and /proc/PID/environ: what exec was given, whatever the process did with os.environ
since). Only processes that carry the trial's SWEEP_PROBE_DIR, or descend from one that does, are the
trial's, and so is a child of the job process started after the watch was made (before the command):
the command itself, which may have exec'd a wrapper that cleared its environment (`env -i python ...`), or
an orphan of it. A test or a worker running the trial in-process has children of its own, made before.

A scan every probed.READ_EVERY_S sees every process that lives longer than that; one that imports torch
(the only kind the probe measures) takes longer than that to import it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RECORD_DIR_ENV = "SWEEP_PROBE_DIR"  # sweep.probe.RECORD_DIR_ENV (not imported: this module stays free of it)
_PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)*)?[a-z]?$")  # python, python3, python3.11, python3.13t
SHOWN = 3  # unreached processes named in the failure line; more are counted


@dataclass(frozen=True)
class Unreached:
    pid: int
    command: str  # its command line, shortened
    why: str  # one clause: why the probe could not get in


def interpreter_flags(cmdline: list[str]) -> set[str]:
    """The interpreter's own -I, -E and -S among its options (`python -IS -X dev train.py`: {"I", "S"}).

    Options end at the script, `-`, `--`, `-c` or `-m` (what follows is the program's); `-W` and `-X`
    take a value, in the same word or the next."""
    flags: set[str] = set()
    words = iter(cmdline[1:])
    for word in words:
        if word in ("-", "--") or not word.startswith("-"):
            break
        if word.startswith("--"):
            if word == "--check-hash-based-pycs":
                next(words, None)
            continue
        for i, letter in enumerate(word[1:], start=1):
            if letter in "cm":
                return flags
            if letter in "WX":
                if i == len(word) - 1:
                    next(words, None)
                break
            if letter in "IES":
                flags.add(letter)
    return flags


def why_unreached(cmdline: list[str], environ: dict[str, str], record_dir: str, boot_dir: str, cwd: str = "") -> str:
    """Why a Python process started with this command line and environment cannot run the probe; "" if it can."""
    flags = interpreter_flags(cmdline)
    if "I" in flags:
        return "-I (isolated mode) ignores PYTHONPATH, which carries the probe"
    if "E" in flags:
        return "-E ignores PYTHONPATH, which carries the probe"
    if "S" in flags:
        return "-S runs no sitecustomize, where the probe starts"
    if environ.get(RECORD_DIR_ENV) != record_dir:
        return f"its environment has no {RECORD_DIR_ENV} (a wrapper cleared or replaced the environment)"
    entries = environ.get("PYTHONPATH", "").split(os.pathsep) if environ.get("PYTHONPATH") else []
    resolved = [os.path.normpath(os.path.join(cwd, entry or ".")) for entry in entries]
    if boot_dir not in resolved:
        shown = environ.get("PYTHONPATH", "")
        return f"its PYTHONPATH ({shown[:80]!r}) lacks the probe's boot dir: a wrapper replaced PYTHONPATH"
    for entry in resolved[: resolved.index(boot_dir)]:
        if os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            return f"{os.path.join(entry, 'sitecustomize.py')}, ahead of the probe's boot dir on PYTHONPATH, shadows it"
    return ""


@dataclass
class ReachWatch:
    """The Python processes of one trial (this process's descendants) that the probe could not reach."""

    record_dir: Path
    boot_dir: Path
    unreached: dict[tuple[int, float], Unreached] = field(default_factory=dict)
    _judged: dict[tuple[int, float], tuple[str, ...]] = field(default_factory=dict)  # the command line last judged
    _ours: dict[tuple[int, float], bool] = field(default_factory=dict)
    _before: set[tuple[int, float]] = field(default_factory=set)  # this process's children before the command

    def __post_init__(self) -> None:
        try:
            self._before = {(p.pid, p.create_time()) for p in psutil.Process().children()}
        except psutil.Error:
            pass

    def scan(self) -> None:
        """Judge every descendant not judged under its present command line; never raises."""
        try:
            descendants = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        by_pid = {p.pid: p for p in descendants}
        for proc in descendants:
            try:
                key = (proc.pid, proc.create_time())
                cmdline = tuple(proc.cmdline())
                if self._judged.get(key) == cmdline or not self._is_ours(proc, key, by_pid):
                    continue
                self._judged[key] = cmdline
                self.unreached.pop(key, None)
                if not _is_python(proc, cmdline):
                    continue
                why = why_unreached(list(cmdline), proc.environ(), str(self.record_dir), str(self.boot_dir), proc.cwd())
                if why:
                    self.unreached[key] = Unreached(proc.pid, _shorten(cmdline), why)
            except (psutil.Error, OSError):
                continue  # gone, a zombie, or another user's (a setuid helper): nothing to say about it

    def _is_ours(self, proc: psutil.Process, key: tuple[int, float], by_pid: dict[int, psutil.Process]) -> bool:
        """It was started with this trial's SWEEP_PROBE_DIR, or is a child of this process made since the watch
        was, or descends from one that is (remembered: an orphan whose parent is gone stays the trial's)."""
        if key not in self._ours:
            ours = proc.environ().get(RECORD_DIR_ENV) == str(self.record_dir)
            parent = by_pid.get(proc.ppid())
            if not ours and parent is not None:
                ours = self._is_ours(parent, (parent.pid, parent.create_time()), by_pid)
            elif not ours:
                ours = proc.ppid() == os.getpid() and key not in self._before
            self._ours[key] = ours
        return self._ours[key]

    def note(self) -> str:
        """The unreached processes as a clause of a failure line ("" for none)."""
        found = sorted(self.unreached.values(), key=lambda u: u.pid)
        if not found:
            return ""
        named = "; ".join(f"pid {u.pid} ({u.command}): {u.why}" for u in found[:SHOWN])
        more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        return f"the probe could not reach {len(found)} Python process(es) of the command: {named}{more}"


def _is_python(proc: psutil.Process, cmdline: tuple[str, ...]) -> bool:
    try:
        name = os.path.basename(proc.exe())
    except (psutil.Error, OSError):
        name = ""
    first = os.path.basename(cmdline[0]) if cmdline else ""
    return bool(_PYTHON.match(name) or _PYTHON.match(first))


def _shorten(cmdline: tuple[str, ...], limit: int = 100) -> str:
    """The command line for a one-line message: absolute paths by their last part (`python -I train.py --bs=8`)."""
    text = " ".join(os.path.basename(word) if word.startswith(os.sep) else word for word in cmdline)
    return text if len(text) <= limit else text[: limit - 3] + "..."
