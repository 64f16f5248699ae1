"""Where a sweep starts, from Hydra's Sweeper: place its dir, make its plan, then run it (or only show it).

The loop itself is orchestration/orchestrator.py; one-rank screening on a multi-device host runs first
where the plan asks for it (orchestration/screening.py).
"""

from __future__ import annotations

from typing import Any

from sweep import startup
from sweep.orchestration.orchestrator import Orchestrator
from sweep.orchestration.plan import make_plan
from sweep.orchestration.preflight import check_runnable_here, dry_run_text
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

# Hydra's entry point discards the Sweeper's return value; `python -m sweep` exits with this.
exit_code = 0


def run_from_hydra(cfg: Any, arguments: list[str], poll_interval_s: float = 0.25) -> int:
    """Entry from the Hydra Sweeper: build the plan, then run it (or just show it)."""
    global exit_code
    settings = read_settings(cfg, arguments)  # the config checked once: nothing below reads cfg for a setting
    given = dir_given(cfg)
    sweep_dir = default_dir = sweep_dir_of(cfg)
    if not given and sweep_dir.exists():
        sweep_dir = first_free(default_dir)
        set_sweep_dir(cfg, sweep_dir)
    plan = make_plan(settings, sweep_dir)
    if plan.dry_run:
        print(dry_run_text(plan))
        exit_code = 0
        return exit_code
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
        with sweep_lock(plan.sweep_dir):
            strategy = None
            if plan.screen:  # one-rank screening first; the full trials then confirm its leaders
                from sweep.orchestration.screening import run_screening

                strategy, code = run_screening(plan, lambda sub: Orchestrator(sub, poll_interval_s=poll_interval_s))
                if strategy is None:
                    exit_code = code
                    return exit_code
            exit_code = Orchestrator(plan, poll_interval_s=poll_interval_s, strategy=strategy).run()
    return exit_code
