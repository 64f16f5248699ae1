"""The end-of-sweep drift check: re-time the leader and the runner-up briefly, through the same backend.

A re-timing is a trial like any other (one job, its own result.json, the trial's own writer), run in
`retime/<pair>/` beside `trials/`: it never replaces the pair's first figure, and sweep.load() never
reads it as one. How far the pairs moved, against machine.run_to_run_noise, is core/drift.py's call;
the recommendation records both figures of each pair in its `drift` block.

The check is part of the sweep's lifecycle: its jobs are the sweep's (held in the trial pool's retimings, ended on every
way out, re-attached by a resume), a stop in it is an interrupt (exit 130, cut_short says what was cut), and
a resume after any of those finishes the check it owes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from sweep.core.confidence import leader_probability
from sweep.core.drift import Drift, Retimed, drift
from sweep.core.growth import at_risk
from sweep.core.ranking import ranked_ok
from sweep.core.run_to_run import BUSY_HOST_NOISE, Repeat
from sweep.core.schema import ENDED_FILE, RESULT_FILE, Status, TrialResult, trial_dir
from sweep.core.space import Candidate
from sweep.errors import ResultError
from sweep.orchestration.plan import SweepPlan
from sweep.orchestration.signals import Interrupted, StopSignals
from sweep.orchestration.trial_pool import TrialPool
from sweep.records import check_record_place, read_trial_record

RETIME_DIR = "retime"  # beside trials/: re-timings are not trials of the sweep's search
PAIRS = 2  # the leader and the runner-up: the pairs the answer turns on


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
    # Where the leader stays the leader with 95% probability even at the busiest host's noise, no drift could change
    # the answer, and nothing is re-timed (a leader twice as fast as the runner-up needs no second look).
    sure = leader_probability(contest, BUSY_HOST_NOISE)
    return roomy[:PAIRS] if sure is not None and sure < 0.95 else []


class DriftCheck:
    """The drift check of one sweep: it re-times the leader and the runner-up through the sweep's trial pool, holds
    what it has still to re-time (`left`, what a stop cuts short), and re-attaches an earlier run's re-timings."""

    def __init__(self, plan: SweepPlan, pool: TrialPool, by_key: Mapping[str, Candidate], log: Callable[[str], None],
                 stop: StopSignals, poll_interval_s: float) -> None:
        self.plan = plan
        self.pool = pool
        self.by_key = by_key  # every candidate, by pair key
        self.log = log
        self.stop = stop  # SIGINT/SIGTERM noted: a stop in the check is an interrupt
        self.poll_interval_s = poll_interval_s
        self.left: list[TrialResult] | None = None  # while the check runs: the pairs it has still to re-time

    def run(self, results: dict[str, TrialResult], assumed: float) -> Drift | None:
        """Re-time the pairs one after another (they would share the device otherwise) and measure the drift.

        None when no pair can be re-timed or no re-timing ran ok. A re-timing that ended after every trial (an
        earlier run's, on a resume) stands; one an earlier run left running (re-attached at start) is waited for;
        the rest are re-timed now: a resume after a kill, a Ctrl-C or a full disk in the check finishes it, and a
        resume of a finished sweep launches nothing. A stop signal (Ctrl-C) raises Interrupted, its re-timing under
        way still held in the pool's retimings for the orchestrator to end and name (cut_short).
        """
        chosen = pairs_to_retime(results)
        newest = _newest_record(self.plan.sweep_dir, results)
        # A re-attached re-timing is waited for even where its record is in already: its job is this sweep's to see end.
        held = self.pool.retimings
        kept = {first.key: None if first.key in held else _earlier(self.plan, first, newest) for first in chosen}
        owed = [first for first in chosen if kept[first.key] is None]
        # A re-attached re-timing of a pair no longer the leader or runner-up measures nothing this check needs.
        self.pool.end_retimings(keep={first.key for first in owed}, why="the drift check no longer re-times that pair",
                                hurry=lambda: self.stop.hurry)
        if owed:
            names = " and ".join(f"accum={r.accum} split={r.split}" + (f" (re-attached job {held[r.key].job.job_id})"
                                 if r.key in held else "") for r in owed)
            self.log(f"drift check: re-timing {names} ({self.plan.trial.measure_steps} timed steps each; search.drift_check=false skips it)")
        retimed = []
        self.left = list(owed)  # what a stop now cuts short (cut_short)
        for first in chosen:
            again = kept[first.key] or self._retime(first)
            if kept[first.key] is None:
                self.left.pop(0)
                if again.status != Status.OK or not again.throughput:
                    why = str(again.error or "no result").splitlines()[0]
                    self.log(f"drift check: re-timing accum={first.accum} split={first.split} did not run ok ({why})")
            if again.status == Status.OK and again.throughput:
                retimed.append(Retimed(first.accum, first.split, _repeat(first), _repeat(again)))
        self.left = None
        return drift(retimed, assumed)

    def _retime(self, first: TrialResult) -> TrialResult:
        """One brief re-run of the pair through the sweep's trial pool (or the job an earlier run left running); its record.

        The pool holds the job while it runs, so that every way out (a stop, a full disk) ends it."""
        if self.stop.signal is not None:  # stopped between two re-timings: start no other
            raise Interrupted()
        if first.key not in self.pool.retimings:
            tdir = retime_dir(self.plan.sweep_dir, first.key)
            # A re-timing is of now: an earlier run's record (a resumed sweep) is not this one's.
            (tdir / RESULT_FILE).unlink(missing_ok=True)
            self.pool.submit_retiming(self.by_key[first.key], tdir)
        again = self.pool.wait_retiming(first.key, lambda: self.stop.signal is not None, self.poll_interval_s)
        if again is None:
            raise Interrupted()
        return again

    def reattach(self) -> None:
        """The re-timing jobs an earlier run of this sweep left running (killed in its drift check): held in the pool's
        retimings, where the drift check waits for them, a new trial's start ends them (they would share its device),
        and so does a stop."""
        for key in sorted(self.by_key):
            trial = self.pool.reattach(self.by_key[key], retime_dir(self.plan.sweep_dir, key), retiming=True)
            if trial is not None:
                cand = trial.cand
                self.log(f"re-attached to running re-timing job {trial.job.job_id} for accum={cand.accum} split={cand.split} "
                                 f"(an earlier run's drift check)")

    def cut_short(self, left_running: bool) -> str:
        """What the stop line says when a stop came during the drift check: every trial had finished, the re-timing that
        was stopped (or left running), those not reached. The resume finishes the check (check_drift)."""
        left = list(self.left or [])
        current = left[0] if left else None
        held = self.pool.retimings.get(current.key) if current is not None else None
        ended = left_running or self.pool.end_retimings(hurry=lambda: self.stop.hurry)
        said = []
        if held is not None:
            what = f"left running: job {held.job.job_id}" if left_running else ("stopped" if ended else "told to stop")
            said.append(f"re-timing of accum={held.cand.accum} split={held.cand.split} {what}")
        rest = left[1:] if held is not None else left
        if rest:
            said.append(" and ".join(f"accum={r.accum} split={r.split}" for r in rest) + " not re-timed yet")
        return f"the drift check was cut short after every trial finished ({', '.join(said) or 'its last re-timing had ended'})"


def _newest_record(sweep_dir: Path, results: dict[str, TrialResult]) -> float:
    """When the sweep's last trial record was written (its mtime: the file system's one clock, in ns)."""
    newest = 0.0
    for key in results:
        for name in (RESULT_FILE, ENDED_FILE):
            try:
                newest = max(newest, (trial_dir(sweep_dir, key) / name).stat().st_mtime)
            except OSError:
                continue
    return newest


def _repeat(r: TrialResult) -> Repeat:
    return Repeat(float(r.throughput or 0.0), r.throughput_low, r.throughput_high)


def _earlier(plan: SweepPlan, first: TrialResult, after: float) -> TrialResult | None:
    """The pair's re-timing from an earlier run of this sweep where it ended (cancelled: cut short) after every trial
    record, under the same settings; None where the check owes it."""
    tdir = retime_dir(plan.sweep_dir, first.key)
    try:
        again = read_trial_record(tdir)
        if again is None or again.status == Status.CANCELLED:
            return None
        check_record_place(again, tdir, plan.fingerprint)
        written = max((tdir / name).stat().st_mtime for name in (RESULT_FILE, ENDED_FILE) if (tdir / name).exists())
    except (ResultError, OSError, ValueError):
        return None
    return again if written > after else None
