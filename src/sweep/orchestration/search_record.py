"""Where a sweep's search runs: `search.json` in the sweep dir, written by the search alone when it starts.

`python -m sweep.status` and `python -m sweep.cancel` read it from any shell that sees the sweep dir: which
process (host, pid and its start time, so a later process given the same pid is not taken for it) or Slurm
job runs the search, whether it was detached, and where its output goes. Whether that search is still alive
is asked of the host or the scheduler when someone looks (search_alive), never stored.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from sweep.core.schema import now_iso
from sweep.records import atomic_write_text

SEARCH_FILE = "search.json"
SEARCH_LOG = "search.log"  # a detached search's stdout and stderr
DETACHED_ENV = "SWEEP_DETACHED"  # set to 1 in a detached search's environment (orchestration/detach.py)


@dataclass(frozen=True)
class SearchRecord:
    pid: int  # the search's process
    create_time: float  # its start, as psutil gives it: a later process with the same pid is not the search
    host: str  # where that pid lives
    slurm_job_id: str | None  # the Slurm job the search runs in, if any
    detached: bool  # started by detach=true: no terminal waits on it
    log: str | None  # a detached search's output (SEARCH_LOG), else None: the terminal had it
    started_at: str  # ISO time


def write_search_record(sweep_dir: Path) -> SearchRecord:
    """This process is the sweep's search: say so in search.json (its one writer)."""
    me = psutil.Process()
    detached = os.environ.get(DETACHED_ENV) == "1"
    record = SearchRecord(
        pid=me.pid, create_time=me.create_time(), host=socket.gethostname(), slurm_job_id=os.environ.get("SLURM_JOB_ID"),
        detached=detached, log=str(Path(sweep_dir) / SEARCH_LOG) if detached else None, started_at=now_iso(),
    )
    atomic_write_text(Path(sweep_dir) / SEARCH_FILE, json.dumps(asdict(record), indent=2) + "\n")
    return record


def read_search_record(sweep_dir: Path) -> SearchRecord | None:
    """search.json, or None where no search has started in this dir (or its record is unreadable)."""
    try:
        raw = json.loads((Path(sweep_dir) / SEARCH_FILE).read_text())
        return SearchRecord(**{k: raw.get(k) for k in SearchRecord.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def search_alive(record: SearchRecord) -> bool | None:
    """Whether the search still runs: its pid on this host (with its start time), else its Slurm job as squeue sees it;
    None where neither can be asked from here (another host, no squeue)."""
    if record.host == socket.gethostname():
        try:
            proc = psutil.Process(int(record.pid))
            return abs(proc.create_time() - float(record.create_time)) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, ValueError, TypeError):
            return False
    if record.slurm_job_id and shutil.which("squeue"):
        out = subprocess.run(["squeue", "-h", "-j", str(record.slurm_job_id), "-o", "%T"], capture_output=True, text=True, check=False)
        return bool(out.stdout.strip())
    return None
