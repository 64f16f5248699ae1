"""The asynchronous sweep loop: propose, submit, poll, collect, publish.

A new trial starts the moment a slot frees, and every landed result rewrites
trials.csv and the shown table at once. State lives on disk (one result.json
per finished trial, written by the trial, or an ended.json this process writes for a
job that died without one; one job.json per submitted job), so killing this process at
any moment loses nothing: rerunning the same sweep dir reuses what finished and
re-attaches to what is still running, the drift check's re-timings included (orchestration/retime.py).
"""

from __future__ import annotations

import errno
import json
import shlex
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from sweep import workloads
from sweep.core.config import run_to_run_noise
from sweep.core.drift import Drift
from sweep.core.ranking import build_table, confidence_view, table_csv
from sweep.core.recommendation import Recommendation, recommendation, recommendation_line
from sweep.core.run_to_run import BUSY_HOST_NOISE
from sweep.core.schema import Status, TrialResult, trial_dir
from sweep.core.space import Candidate
from sweep.core.strategies import Strategy, make_strategy, strategy_class
from sweep.core.table import Row, table_rows
from sweep.core.validity import validated, validated_across_pairs
from sweep.errors import SweepError
from sweep.launch import backend as backends
from sweep.orchestration.display import Display, landed_line, summary_lines
from sweep.orchestration.host_load import HostLoad, busy_host_note
from sweep.orchestration.plan import META_FILE, SweepPlan, sweep_record
from sweep.orchestration.racing import Predictions, Racing, plan_stop_steps
from sweep.orchestration.remeasure import reruns_in_full
from sweep.orchestration.retime import DriftCheck
from sweep.orchestration.signals import Interrupted, StopSignals, silence_stdout
from sweep.orchestration.sweep_dir import remove_stale_temp_files, sweep_lock
from sweep.orchestration.trial_pool import Trial, TrialPool
from sweep.records import atomic_write_text, collect_results, point_latest

TABLE_FILE = "trials.csv"
RECOMMENDATION_FILE = "recommendation.yaml"
INTERIM_CAP = 79  # the most the score says while trials are running (as core/confidence.UNMEASURED_CAP for a pair cut short)
# OSError numbers that mean "this sweep dir cannot be written": a clear error, not a traceback.
_CANNOT_WRITE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


class Orchestrator:
    def __init__(self, plan: SweepPlan, poll_interval_s: float = 0.25, display: Display | None = None, strategy: Strategy | None = None) -> None:
        self.plan = plan
        self.poll_interval_s = poll_interval_s
        self.display = display or Display(plan.live)
        # strategy: another proposer than plan.search's (screening's confirmations, orchestration/screening.py);
        # a screening sweep's staircase gives its spare devices the likeliest retry (core/strategies.Staircase).
        self.strategy = strategy or make_strategy(
            plan.search, plan.candidates, plan.max_trials, capacity_gib=plan.machine.memory_gib, trust_memory_model=plan.trust_memory_model,
            spare_retry=plan.nominates_only,
        )
        self.by_key = {c.key: c for c in plan.candidates}
        decision = self.by_key if plan.measure_to_decision else None
        # A possible answer stops ahead, tied or undecidable only past its stress step; the search's first pair
        # stops provisionally (plan_stop_steps), and is run again in full if it may be the answer (_loop).
        self.racing = Racing(plan.sweep_dir, plan.meta.global_batch_size, decision, plan_stop_steps(plan), run_to_run_noise(plan.machine))
        self.predictions = Predictions(plan.sweep_dir, plan.meta, self.by_key, plan.machine.memory_gib)
        self.results: dict[str, TrialResult] = {}
        self.last_rec: tuple[int, int, int | None] | None = None  # the pair and score last logged
        self.drift: Drift | None = None  # once the end-of-sweep re-timing has run
        self.host_load = HostLoad(plan.sweep_dir)  # sampled while trials run: an oversubscribed CPU host scores noisier
        self.reused = 0  # finished trials found on start
        # Every job's life (submit, poll, time limit, stop, re-attach, its record): the search's trials, their re-runs in
        # full, the drift check's re-timings and screening's cancels alike. The search loop stays here.
        self.pool = TrialPool(plan, self.display.log)
        self.workload = workloads.get(plan.meta.workload)
        self._shown_live: dict[str, float] = {}
        self.stop = StopSignals()  # SIGINT/SIGTERM noted, acted on at the loop's safe points
        self.drift_check = DriftCheck(plan, self.pool, self.by_key, self.display.log, self.stop, poll_interval_s)
        self.t0 = time.monotonic()
        # CPU spent before the loop (interpreter, imports, Hydra's composition, the plan), counted apart:
        # the loop's share of wall time is what the orchestrator takes from running trials.
        self.startup_cpu_s = time.process_time()

    @property
    def in_flight(self) -> Mapping[str, Trial]:
        """The search's running trials, by pair key (the pool's)."""
        return self.pool.running

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        sweep_dir = self.plan.sweep_dir
        with sweep_lock(sweep_dir):  # held already where the sweep screens first (orchestration/entry.py)
            try:
                return self._run_locked()
            except OSError as e:
                # A full disk or a sweep dir that turned read-only: every write is atomic, so what is
                # there is intact; stop the trials (they cannot write either) and say how to go on.
                if e.errno not in _CANNOT_WRITE:
                    raise
                retiming = " and the drift check's re-timing" if self.pool.retimings else ""
                running = len(self.in_flight)
                # A re-timing that outlived this sweep would hold its device while the next one runs: ended too.
                self.pool.cancel_all(quietly=True)
                where = f" ({e.filename})" if e.filename else ""
                raise SweepError(
                    f"cannot write the sweep dir {sweep_dir}: {e.strerror}{where}; finished results are kept and "
                    f"{running} running trial(s){retiming} were stopped: free space (or make it writable), then resume with: "
                    f"python -m sweep {shlex.quote(f'resume={sweep_dir}')}"
                ) from None
            finally:
                self._retire_workers()

    def _run_locked(self) -> int:
        with self.stop:
            try:
                self._start()
                with self.display:
                    self._publish()
                    self._loop()
                    # Before the drift check: its re-timings are fresh processes on the same devices.
                    self._retire_workers(wait=True)
                if self.plan.drift_check:  # a stop in it is an interrupt too: the resume finishes it (orchestration/retime.py)
                    self.drift = self.drift_check.run(self.results, run_to_run_noise(self.plan.machine))
            except Interrupted:
                return self._interrupted()
            except BrokenPipeError:
                # stdout went away (`| head` ended): nobody reads the table any more. Stop as if
                # interrupted, the hint on stderr; what finished is kept for a resume.
                silence_stdout()
                self.stop.signal = signal.SIGPIPE
                return self._interrupted()
            # Still under the stop handlers: a Ctrl-C now waits for the few writes that finish the sweep.
            return self._finish()

    def _start(self) -> None:
        plan = self.plan
        self._load_finished()
        self.pool.open(self.workload.warm_runner)
        self._reattach()
        self.drift_check.reattach()  # a drift check an earlier run was killed in: its job is this sweep's too
        self._write_meta("running")
        if not point_latest(plan.sweep_dir) and not (plan.sweep_dir.parent / "latest").is_symlink():
            self.display.log(f"{plan.sweep_dir.parent / 'latest'} is not sweep's link to the latest sweep: left as it is")
        reused = self.reused = len(self.results)
        self._stop_if_signalled()
        self.display.log(
            f"sweep {plan.meta.sweep_id}: {plan.meta.machine}, global_batch_size={plan.meta.global_batch_size}, "
            f"search={plan.search}, {sum(c.valid for c in plan.candidates)} valid pairs, dir {plan.sweep_dir}"
            + (f"; reusing {reused} finished trial(s)" if reused else "")
        )

    def _loop(self) -> None:
        while True:
            self._stop_if_signalled()
            landed = self._collect()
            self._race()
            proposal = self.strategy.propose(self.results, set(self.in_flight))
            landed += self._update_predicted()
            free = self.pool.slots()
            started = 0
            for cand in proposal.candidates:
                if started >= free or self.stop.signal is not None:
                    break
                if cand.key in self.results or cand.key in self.in_flight or not cand.valid:
                    continue
                self.submit(cand)
                started += 1
            if landed or started or self._progress_changed():
                self._publish()
            if not self.in_flight and (proposal.done or not started):
                # Done, or nothing left to propose with nothing running, unless a provisional pair may be the answer.
                if not self._run_in_full():
                    return
            self._stop_if_signalled()
            if self.in_flight:
                self.host_load.sample()
            time.sleep(self.poll_interval_s)

    def _stop_if_signalled(self) -> None:
        if self.stop.signal is not None:
            raise Interrupted()

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, cand: Candidate) -> None:
        """Start a trial of `cand` (the pool's) with no stop request an earlier run left for it."""
        self.racing.forget(cand.key)
        self.pool.submit(cand, trial_dir(self.plan.sweep_dir, cand.key))

    def _run_in_full(self) -> bool:
        """Submit again, in full, each provisional pair that may be the answer (orchestration/remeasure.py); whether any was."""
        if self.stop.signal is not None:
            return False
        again = reruns_in_full(self.plan, self.results, self.by_key, self.racing.in_full)
        for key, line in again:
            self.racing.in_full.add(key)
            self.display.log(line)
            self.submit(self.by_key[key])
        return bool(again)

    def _retire_workers(self, wait: bool = False) -> None:
        """Warm workers exit once idle, a busy one (its trial left running on purpose) after its trial; wait: for the idle."""
        self.pool.close(wait)

    def _collect(self) -> int:
        landed = 0
        for trial, res in self.pool.poll():
            self.results[trial.key] = res = validated(res)  # a record from before these checks, or a job that skipped them
            landed += 1
            self.display.log(landed_line(res) + (f" (stopped early: {res.stopped_early})" if res.stopped_early else ""))
        self._judge_across_pairs()
        return landed

    def _judge_across_pairs(self) -> None:
        """A record that lands may contradict earlier ones (core/validity.validated_across_pairs): those are rejected now."""
        for key in validated_across_pairs(self.results):
            res = self.results[key]
            self.display.log(f"accum={res.accum} split={res.split}: rejected on the other pairs' evidence: {res.error}")

    def _load_finished(self) -> None:
        unreadable: dict[str, str] = {}
        for key, res in collect_results(self.plan.sweep_dir, errors=unreadable, fingerprint=self.plan.fingerprint).items():
            # A cancelled trial was interrupted, not measured: a resumed sweep runs it again.
            if key in self.by_key and res.status != Status.CANCELLED:
                self.results[key] = validated(res)
        self._judge_across_pairs()
        for key, why in unreadable.items():
            if key in self.by_key and key not in self.results:
                self.display.log(f"ignoring {why}: that trial is not finished")
        remove_stale_temp_files(self.plan.sweep_dir, (TABLE_FILE, RECOMMENDATION_FILE, META_FILE), (backends.JOB_FILE,))

    def _reattach(self) -> None:
        for cand in self.plan.candidates:
            if cand.key in self.results or not cand.valid:
                continue
            trial = self.pool.reattach(cand, trial_dir(self.plan.sweep_dir, cand.key))
            if trial is not None:
                self.display.log(f"re-attached to running job {trial.job.job_id} for accum={cand.accum} split={cand.split}")

    # -- racing and the memory model (orchestration/racing.py) ---------------------------------
    def _race(self) -> None:
        if not self.plan.racing:
            return
        for key, reason in self.racing.stop_losers(list(self.in_flight), self.results).items():
            f = self.in_flight[key]
            self.display.log(f"accum={f.cand.accum} split={f.cand.split}: stopping it, {reason}")
        if self.plan.cancel_outranked:  # a screening sweep's trials not yet timing a step (orchestration/screening.py)
            from sweep.orchestration.screening import cancel_outranked

            cancel_outranked(self.pool, self.results, self.plan.sweep_dir)

    def _update_predicted(self) -> int:
        """Record and log the pairs the strategy will not launch on the memory model's word; how many changed."""
        lines = self.predictions.update(self.strategy, self.results, len(self.in_flight))
        for line in lines:
            self.display.log(line)
        return len(lines)

    # -- output -------------------------------------------------------------------------------
    def _rows(self, done: bool = False) -> list[dict[str, Any]]:
        # Predicted OOMs are shown, not results: the strategy and the score never count them as run.
        shown = {**{k: v for k, v in self.predictions.records.items() if k not in self.in_flight}, **self.results}
        # Ranked as the recommendation is (core/drift.pooled): a re-timed pair on both its timings, everywhere.
        from sweep.core.drift import pooled, retimed_figures

        return build_table(self.plan.meta, self.plan.candidates, shown, set(self.in_flight), self._live_throughput(), done,
                           judged=pooled(self.results, self.drift), retimed=retimed_figures(self.results, self.drift))

    def _live_throughput(self) -> dict[str, float]:
        """Throughput running trials already show, as their workload reports it."""
        live = {}
        for key in self.in_flight:
            value = self.workload.live_throughput(trial_dir(self.plan.sweep_dir, key))
            if value is not None:
                live[key] = value
        return live

    def _progress_changed(self) -> bool:
        live = self._live_throughput()
        changed = live != self._shown_live
        self._shown_live = live
        return changed and bool(live)

    def _recommendation(self) -> Recommendation | None:
        from sweep.core.confidence import confidence_score
        from sweep.core.drift import pooled, pooled_note

        # The noise the drift check saw, where it exceeded the machine's assumed one, and each re-timed pair on both
        # its timings (core/drift.py): the answer and its score rest on every figure the sweep has of a pair.
        noise = self.drift.noise if self.drift is not None else run_to_run_noise(self.plan.machine)
        # Local trials only: on a cluster they share their nodes' CPUs, not this host's.
        busy = busy_host_note(self.plan.machine, self.host_load, noise) if self.pool.cluster.on_this_host else ""
        noise = max(noise, BUSY_HOST_NOISE) if busy else noise
        basis = pooled(self.results, self.drift)
        conf = confidence_score(self.plan.candidates, confidence_view(basis), predicted_oom=self.predictions.p_exceeds, run_to_run=noise)
        if conf is not None and self.in_flight:
            # Interim: the search runs a pair only where it may change the answer, yet the score leaves out every pair
            # the throughput ordering calls no faster than one measured (core/confidence.outranked_by_measured), the
            # running ones included: one 1-D sweep said 99 after its first pair and 73 once the second landed. Until
            # what runs has landed the score claims no more than a pair still being measured allows.
            conf = min(conf, INTERIM_CAP)
        rec = recommendation(self.plan.meta, basis, conf, self.plan.trial.memory_margin, noise)
        if rec is not None and self.drift is not None:
            key = next(k for k, r in basis.items() if (r.accum, r.split) == (rec.accum, rec.split))
            note = pooled_note(self.results, basis, key, self.plan.meta.throughput_unit or "samples/s", self.drift)
            rec = replace(rec, drift=self.drift.record(), drift_note=note)
        if rec is not None and busy:
            rec = replace(rec, busy_host_note=busy)
        self.host_load.save()
        return rec

    def _publish(self, done: bool = False) -> tuple[list[Row], Recommendation | None]:
        """Rewrite trials.csv (and recommendation.yaml), update the display; the rows and recommendation."""
        records = self._rows(done)
        atomic_write_text(self.plan.sweep_dir / TABLE_FILE, table_csv(records))
        rows = table_rows(records)  # typed once: the display reads attributes
        # A screening sweep's rows only nominate pairs for the full trials: no answer, shown or written, of its own.
        rec = None if self.plan.nominates_only else self._recommendation()
        if rec is not None:
            atomic_write_text(self.plan.sweep_dir / RECOMMENDATION_FILE, yaml.safe_dump(rec.to_record(), sort_keys=False))
            marker = (rec.accum, rec.split, rec.confidence)
            if marker != self.last_rec:
                self.last_rec = marker
                self.display.log(recommendation_line(rec))
        valid = sum(c.valid for c in self.plan.candidates)  # invalid pairs are never candidates to run
        self.display.update(rows, f"{len(self.results)} finished, {len(self.in_flight)} running, of {valid} valid pairs")
        return rows, rec

    def _write_meta(self, state: str) -> None:
        record = sweep_record(
            self.plan, state=state, launcher=self.pool.cluster.name, argv=sys.argv[1:],
            orchestrator_cpu_s=time.process_time() - self.startup_cpu_s, startup_cpu_s=self.startup_cpu_s,
            wall_s=time.monotonic() - self.t0,
        )
        atomic_write_text(self.plan.sweep_dir / META_FILE, json.dumps(record, indent=2) + "\n")

    def _finish(self) -> int:
        rows, rec = self._publish(done=True)
        self._write_meta("done")
        plan = self.plan
        # A screening sweep (nominates_only) says no answer of its own: the sweep's comes after its confirmations.
        lines = summary_lines(self.results, rec, self.drift, strategy_class(plan.search).one_dimensional, answer=not plan.nominates_only)
        self.display.final(rows, [*lines, f"results: {plan.sweep_dir / TABLE_FILE}"])
        ran_ok = any(r.status == Status.OK for r in self.results.values())
        return 0 if rec is not None or (plan.nominates_only and ran_ok) else 1

    def _interrupted(self) -> int:
        keep = self.plan.keep_jobs_on_interrupt
        if self.drift_check.left is not None:  # stopped in the drift check: every trial had finished
            note = self.drift_check.cut_short(keep)
        elif keep:
            left = ", ".join(self.pool.job_ids())
            note = f"left running: job(s) {left}" if left else "no trial was running"
        else:
            self.pool.end_retimings(hurry=lambda: self.stop.hurry)  # an earlier run's, re-attached and not yet waited for
            note = self._cancel_in_flight()
        self._publish_quietly()
        self._write_meta("interrupted")
        # The hint goes where someone reads: stderr once stdout is closed.
        print(self.stop.hint(note, self.plan.sweep_dir), file=sys.stderr if self.stop.signal == signal.SIGPIPE else sys.stdout, flush=True)
        return self.stop.exit_status()

    def _cancel_in_flight(self) -> str:
        """Stop this sweep's own jobs (the ones it submitted and still tracks) and record how they ended."""
        for key in list(self.in_flight):
            self.pool.cancel(key)
        deadline = time.monotonic() + 10
        while self.in_flight and time.monotonic() < deadline and not self.stop.hurry:
            self._collect_quietly()
            time.sleep(0.1)
        if self.in_flight:
            # Cut short (a second Ctrl-C) or slow to end: their jobs were told to stop; a resume reruns them.
            return f"{len(self.in_flight)} in-flight trial(s) told to stop"
        return "in-flight trials cancelled"

    def _collect_quietly(self) -> None:
        try:
            self._collect()
        except BrokenPipeError:
            silence_stdout()

    def _publish_quietly(self) -> None:
        try:
            self._publish()
        except BrokenPipeError:
            silence_stdout()

