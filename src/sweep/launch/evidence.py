"""Evidence about a SIGKILL: was it the kernel's OOM killer?

A SIGKILL says nothing by itself (a user's `kill -9`, a cluster's preemption, a watchdog), so a
trial is an OOM only on evidence: the cgroup's oom_kill count rising while it ran (cgroup v2
memory.events), the kernel log naming the killed pid, or a sampled peak near the capacity.
Each source that cannot be read here is None (unknown), never a guess.
"""

from __future__ import annotations

import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_events_path() -> Path | None:
    """This process's cgroup v2 memory.events file, if there is one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # the v2 unified hierarchy
            candidate = CGROUP_ROOT / path.lstrip("/") / "memory.events"
            return candidate if candidate.is_file() else None
    return None


def oom_kill_count(path: Path | None = None) -> int | None:
    """The cgroup's oom_kill counter; None where it cannot be read."""
    path = path if path is not None else memory_events_path()
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def kernel_log_names_oom(pids: set[int]) -> bool | None:
    """Whether the kernel log says the OOM killer killed one of pids; None where the log cannot be read."""
    text = _kernel_log()
    if text is None:
        return None
    for match in re.finditer(r"(?:Out of memory|oom-kill|Killed process)[^\n]*?(?:pid[ =]|process )(\d+)", text, re.IGNORECASE):
        if int(match.group(1)) in pids:
            return True
    return False


def _kernel_log() -> str | None:
    """The kernel ring buffer through /dev/kmsg (non-blocking), else None (often not readable unprivileged)."""
    import os

    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on with the next
                continue
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunks) > 20000:
                break
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", errors="replace")
