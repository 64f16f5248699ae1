"""Stop a sweep from any shell: its search and every trial job it started, keeping all it measured.

    python -m sweep.cancel outputs/latest

Where the search still runs on this host, it gets SIGTERM, as a Ctrl-C in its terminal would: it cancels its own
trial jobs, records each as `cancelled` (their ended.json is the search's to write), rewrites the table and leaves
the dir resumable (`python -m sweep resume=DIR`). Where the search is gone (killed, its host rebooted), this command
takes the sweep dir's lock (so no search can start meanwhile) and cancels what the dir's job.json files still name
(Slurm jobs by id, local process trees by pid) itself, recording each as `cancelled`. A sweep that already ended is
left as it is (exit 0). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from sweep.core.schema import ENDED_FILE, RESULT_FILE, Status, TrialResult, now_iso
from sweep.core.space import make_candidate, pair_of_key
from sweep.errors import SweepError
from sweep.launch import backend as jobs
from sweep.launch.clusters import cluster_named
from sweep.orchestration.search_record import read_search_record, search_alive
from sweep.orchestration.sweep_dir import sweep_lock
from sweep.records import write_ended
from sweep.status import ENDED_STATES, sweep_dir_arg

SEARCH_EXIT_WAIT_S = 60  # the search cancels its jobs (10 s at most each way) and writes its records before it exits


def cancel(sweep_dir: Path, out: TextIO) -> int:
    try:
        meta = json.loads((sweep_dir / "sweep.json").read_text())
    except (OSError, ValueError):
        meta = {}  # the search has only just started: it has not written sweep.json yet
    record = read_search_record(sweep_dir)
    alive = search_alive(record) if record is not None else False
    if meta.get("state") in ENDED_STATES and not alive:
        print(f"sweep {sweep_dir} already ended ({meta.get('state')}): nothing to cancel", file=out)
        return 0
    if record is not None and alive:
        if record.slurm_job_id and record.host != socket.gethostname():
            # Slurm sends the job's processes SIGTERM (the search's own stop), and SIGKILL only after its KillWait.
            subprocess.run(["scancel", str(record.slurm_job_id)], check=False, capture_output=True)
        else:
            os.kill(int(record.pid), signal.SIGTERM)  # the search's own stop: it cancels and records its trials
        deadline = time.monotonic() + SEARCH_EXIT_WAIT_S
        while search_alive(record) and time.monotonic() < deadline:
            time.sleep(0.2)
        if search_alive(record):
            raise SweepError(f"the search (pid {record.pid}) did not stop within {SEARCH_EXIT_WAIT_S} s: run python -m sweep.cancel {sweep_dir} again")
        print(f"sweep {sweep_dir}: search stopped; its trial jobs were cancelled and recorded "
              f"(resume with python -m sweep resume={sweep_dir})", file=out)
        return 0
    if alive is None:
        raise SweepError(f"the search runs on {record.host if record else 'another host'}, which this host cannot signal: "
                         f"run python -m sweep.cancel {sweep_dir} there")
    with sweep_lock(sweep_dir):  # no search may start while its jobs are cancelled and recorded here
        ended = _cancel_jobs(sweep_dir, meta)
    print(f"sweep {sweep_dir}: the search was not running; cancelled {len(ended)} trial job(s)"
          + (f" ({', '.join(ended)})" if ended else "") + f"; resume with python -m sweep resume={sweep_dir}", file=out)
    return 0


def _cancel_jobs(sweep_dir: Path, meta: dict) -> list[str]:
    """Cancel each trial job the dir names that has no record yet, and record it as cancelled (the search is gone, and
    the lock is this process's: it is the records' one writer now)."""
    folder = str(sweep_dir / ".submitit" / "%j")
    ended = []
    for tdir in sorted([*(sweep_dir / "trials").glob("*"), *(sweep_dir / "retime").glob("*")]):
        if not (tdir / jobs.JOB_FILE).exists() or (tdir / RESULT_FILE).exists() or (tdir / ENDED_FILE).exists():
            continue
        job = jobs.reattach(tdir, folder)
        if job is None:
            continue
        cluster = json.loads((tdir / jobs.JOB_FILE).read_text()).get("cluster", "local")
        cluster_named(str(cluster)).cancel(job)
        gbs, devices = int(meta.get("global_batch_size") or 0), int(meta.get("num_devices") or 1)
        pair = make_candidate(*pair_of_key(tdir.name), gbs, devices)
        write_ended(TrialResult(**pair.numbers(gbs, devices), status=Status.CANCELLED, job_id=str(job.job_id), finished_at=now_iso(),
                                error="cancelled by python -m sweep.cancel (the search was not running)"), tdir)
        ended.append(f"{tdir.name} job {job.job_id}")
    return ended


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweep.cancel", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a sweep dir (e.g. outputs/latest)")
    args = parser.parse_args(argv)
    try:
        return cancel(sweep_dir_arg(args.sweep_dir), out)
    except SweepError as e:
        print(f"sweep.cancel: {e}", file=err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
