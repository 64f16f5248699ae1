"""detach=true: the search goes on without the terminal that started it.

The command runs again, as a process in a session of its own (no controlling terminal, so a closed laptop or a lost
ssh session sends it no hang-up), with the dir this run claimed and DETACHED_ENV set; its output goes to the sweep
dir's search.log. It is the same code as an attached sweep: the same records, answer and `resume=DIR`, and it takes
the dir's lock itself, so a second sweep into the dir is refused as ever. This process returns once the search has
said where it runs (search.json), printing the two commands that watch and stop it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence

from sweep.errors import SweepError
from sweep.orchestration.plan import SweepPlan
from sweep.orchestration.search_record import DETACHED_ENV, SEARCH_FILE, SEARCH_LOG

STARTED_WAIT_S = 60  # how long to wait for the detached search's search.json (its imports and Hydra's composition)


def detach_search(plan: SweepPlan, arguments: Sequence[str]) -> int:
    """Start the search in the background in plan.sweep_dir; 0 once it runs, else its exit status and log."""
    sweep_dir = plan.sweep_dir
    argv = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")] or list(arguments)
    command = [sys.executable, "-m", "sweep", *argv, f"hydra.sweep.dir={sweep_dir}"]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log_path = sweep_dir / SEARCH_LOG
    with open(log_path, "ab") as log, open(os.devnull, "rb") as nothing:
        proc = subprocess.Popen(
            command, stdin=nothing, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, DETACHED_ENV: "1"}, cwd=os.getcwd(),
        )
    deadline = time.monotonic() + STARTED_WAIT_S
    while not (sweep_dir / SEARCH_FILE).exists():
        code = proc.poll()
        if code is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise SweepError(f"the detached search ended at once (exit {code}); its log {log_path} ends: " + " | ".join(tail))
        if time.monotonic() > deadline:
            break  # slow to start (a busy host): it is running; say so and where to look
        time.sleep(0.1)
    where = shlex.quote(str(sweep_dir))
    print(f"sweep detached: the search runs in the background as pid {proc.pid} "
          f"(its own session: closing this terminal does not stop it), its output in {log_path}")
    print(f"  watch: python -m sweep.status {where}")
    print(f"  stop:  python -m sweep.cancel {where}")
    print(f"  after: python -m sweep {shlex.quote(f'resume={sweep_dir}')} (resume it if it was stopped)")
    return 0
