"""Where a sweep starts, from Hydra's Sweeper: place its dir, make its plan, then run it (or only show it).

The loop itself is orchestration/orchestrator.py; one-rank screening on a multi-device host runs first
where the plan asks for it (orchestration/screening.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sweep import startup
from sweep.orchestration.detach import detach_search
from sweep.orchestration.orchestrator import Orchestrator
from sweep.orchestration.plan import make_plan
from sweep.orchestration.preflight import check_runnable_here, dry_run_text
from sweep.orchestration.search_record import DETACHED_ENV, write_search_record
from sweep.orchestration.settings import read_settings
from sweep.orchestration.sweep_dir import (
    claim_fresh_dir,
    dir_given,
    first_free,
    removed_if_refused,
    set_sweep_dir,
    sweep_dir_of,
    sweep_lock,
)


@dataclass
class ExitStatus:
    """What `python -m sweep` exits with: the status of the sweep run while it was open (0 where none ran)."""

    code: int = 0


# hydra.main discards the Sweeper's return value, so the status a sweep returns reaches `python -m sweep`
# (cli/main.py) in the ExitStatus its call opened (sweep_exit_status); a caller that opened none drops it.
_OPEN: ContextVar[ExitStatus | None] = ContextVar("sweep_exit_status", default=None)


@contextmanager
def sweep_exit_status() -> Iterator[ExitStatus]:
    """An ExitStatus that a sweep run inside the block fills in with the status run_from_hydra returns."""
    status = ExitStatus()
    token = _OPEN.set(status)
    try:
        yield status
    finally:
        _OPEN.reset(token)


def run_from_hydra(cfg: Any, arguments: list[str], poll_interval_s: float = 0.25) -> int:
    """Entry from the Hydra Sweeper: build the plan, then run it (or just show it); the exit status."""
    code = _run(cfg, arguments, poll_interval_s)
    status = _OPEN.get()
    if status is not None:
        status.code = code
    return code


def _run(cfg: Any, arguments: list[str], poll_interval_s: float) -> int:
    settings = read_settings(cfg, arguments)  # the config checked once: nothing below reads cfg for a setting
    given = dir_given(cfg)
    sweep_dir = default_dir = sweep_dir_of(cfg)
    if not given and sweep_dir.exists():
        sweep_dir = first_free(default_dir)
        set_sweep_dir(cfg, sweep_dir)
    plan = make_plan(settings, sweep_dir)
    if plan.dry_run:
        print(dry_run_text(plan))
        return 0
    check_runnable_here(plan)  # before any dir is made: a refusal writes nothing
    startup.over()  # a Ctrl-C from here on is the sweep's to clean up, not an instant exit
    with removed_if_refused(plan.sweep_dir if given else default_dir) as made:
        if not given:
            # The default dir is named by the second: a sweep started in the same second by
            # someone else must not share (and resume) it. mkdir is the atomic claim.
            claimed = claim_fresh_dir(default_dir)
            made.append(claimed)
            if claimed != sweep_dir:
                set_sweep_dir(cfg, claimed)
                plan = make_plan(settings, claimed)
        # The dir's lock for the whole sweep, taken before its first write: screening writes sweep.json and
        # runs trials before the full sweep's orchestrator starts (it takes the lock again, re-entrant).
        if plan.detach and os.environ.get(DETACHED_ENV) != "1":
            # The dir is claimed; the search runs on without this terminal, and takes the dir's lock itself.
            return detach_search(plan, arguments)
        with sweep_lock(plan.sweep_dir):
            write_search_record(plan.sweep_dir)  # where the search runs, for python -m sweep.status and sweep.cancel
            strategy = None
            if plan.screen:  # one-rank screening first; the full trials then confirm its leaders
                from sweep.orchestration.screening import run_screening

                strategy, code = run_screening(plan, lambda sub: Orchestrator(sub, poll_interval_s=poll_interval_s))
                if strategy is None:
                    return code
            return Orchestrator(plan, poll_interval_s=poll_interval_s, strategy=strategy).run()
