"""The end-of-sweep drift check: re-time the leader and the runner-up briefly, through the same backend.

A re-timing is a trial like any other (one job, its own result.json, the trial's own writer), run in
`retime/<pair>/` beside `trials/`: it never replaces the pair's first figure, and sweep.load() never
reads it as one. How far the pairs moved, against machine.run_to_run_noise, is core/drift.py's call;
the recommendation records both figures of each pair in its `drift` block.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.core.confidence import leader_probability
from sweep.core.drift import Drift, Retimed, drift
from sweep.core.growth import at_risk
from sweep.core.ranking import ranked_ok
from sweep.core.run_to_run import Repeat
from sweep.core.schema import ENDED_FILE, RESULT_FILE, ResultError, Status, TrialResult
from sweep.launch import backend as backends
from sweep.records import check_record_place, read_trial_record

if TYPE_CHECKING:
    from sweep.orchestration.orchestrator import Orchestrator

RETIME_DIR = "retime"  # beside trials/: re-timings are not trials of the sweep's search
PAIRS = 2  # the leader and the runner-up: the pairs the answer turns on
# The most run-to-run noise a host has shown here (docs/search.md: 0.243 on the busy 2-core box). Where the
# leader stays the leader with 95% probability even at this noise, no drift could change the answer, and
# nothing is re-timed (a leader twice as fast as the runner-up needs no second look).
BUSY_HOST_NOISE = 0.25


def retime_dir(sweep_dir: Path, key: str) -> Path:
    return Path(sweep_dir) / RETIME_DIR / key


def pairs_to_retime(results: dict[str, TrialResult]) -> list[TrialResult]:
    """The leader and the runner-up among the pairs the sweep may recommend (not tight, unless all are);
    none when a single pair ran ok or when even a busy host's noise (BUSY_HOST_NOISE) could not change the leader."""
    ranked = [r for r in ranked_ok(results) if r.step_times_s or r.throughput_low]
    roomy = [r for r in ranked if not at_risk(r)] or ranked
    if len(roomy) < 2:
        return []
    contest = {r.key: r for r in roomy[:PAIRS]}
    sure = leader_probability(contest, BUSY_HOST_NOISE)
    return roomy[:PAIRS] if sure is not None and sure < 0.95 else []


def check_drift(orch: Orchestrator, assumed: float) -> Drift | None:
    """Re-time the pairs one after another (they would share the device otherwise) and measure the drift.

    None when no pair can be re-timed or no re-timing ran ok. A stop signal (Ctrl-C) cancels the re-timing
    under way and ends the check with what it has: the sweep's own results are complete already.
    """
    chosen = pairs_to_retime(orch.results)
    if not chosen:
        return None
    if orch.reused == len(orch.results):
        # Nothing ran in this process (a resume that rescores a finished sweep): read the re-timings already
        # made, launch nothing.
        return drift([r for r in (_earlier(orch, first) for first in chosen) if r is not None], assumed)
    names = " and ".join(f"accum={r.accum} split={r.split}" for r in chosen)
    orch.display.log(f"drift check: re-timing {names} ({orch.plan.trial.measure_steps} timed steps each; search.drift_check=false skips it)")
    retimed = []
    for first in chosen:
        if orch.stop.signal is not None:
            break
        again = _retime(orch, first)
        if again is None or again.status != Status.OK or not again.throughput:
            why = again.error if again is not None and again.error else "no result"
            orch.display.log(f"drift check: re-timing accum={first.accum} split={first.split} did not run ok ({str(why).splitlines()[0]})")
            continue
        retimed.append(Retimed(first.accum, first.split, _repeat(first), _repeat(again)))
    return drift(retimed, assumed)


def _earlier(orch: Orchestrator, first: TrialResult) -> Retimed | None:
    """The pair's re-timing from an earlier run of this sweep, if it ran ok under the same settings."""
    tdir = retime_dir(orch.plan.sweep_dir, first.key)
    try:
        again = read_trial_record(tdir)
        if again is None or again.status != Status.OK or not again.throughput:
            return None
        check_record_place(again, tdir, orch.plan.fingerprint)
    except (ResultError, OSError):
        return None
    return Retimed(first.accum, first.split, _repeat(first), _repeat(again))


def _repeat(r: TrialResult) -> Repeat:
    return Repeat(float(r.throughput or 0.0), r.throughput_low, r.throughput_high)


def _retime(orch: Orchestrator, first: TrialResult) -> TrialResult | None:
    """One brief re-run of the pair through the sweep's executor; its record, or None if it did not end in time."""
    from sweep.launch.ended import ended_job_result, forget_ended
    from sweep.launch.job import run_job

    plan = orch.plan
    cand = orch.by_key[first.key]
    tdir = retime_dir(plan.sweep_dir, first.key)
    tdir.mkdir(parents=True, exist_ok=True)
    # A re-timing is of now: an earlier run's record (a resumed sweep) is not this one's.
    for name in (RESULT_FILE, ENDED_FILE):
        (tdir / name).unlink(missing_ok=True)
    forget_ended(tdir)
    brief = replace(plan.trial, max_measure_steps=plan.trial.measure_steps)
    spec = replace(plan.spec(cand, tdir), trial=brief)
    gpus = orch.free_gpus[0] if orch.free_gpus else None
    if gpus is not None:
        orch.executor.update_parameters(visible_gpus=gpus, gpus_per_node=len(gpus))
    job = orch.executor.submit(run_job, spec)
    backends.remember_job(tdir, job, orch.cluster)
    started = time.monotonic()
    timed_out = False
    while not job.done():
        if orch.stop.signal is not None:
            backends.cancel_job(job, orch.cluster)
            return None
        if not timed_out and orch.cluster == "local" and time.monotonic() - started > plan.time_limit_s:
            timed_out = True
            backends.cancel_job(job, orch.cluster)
        time.sleep(orch.poll_interval_s)
    return ended_job_result(job, spec, tdir, timed_out=timed_out, cancelled=False, wall_s=time.monotonic() - started)
