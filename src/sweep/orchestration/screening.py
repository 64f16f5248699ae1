"""Parallel screening on multi-device hosts: one-rank trials first, then full trials to confirm.

With machine.num_devices=N > 1 (search.screen=auto on CUDA, or on), a sweep runs in two phases:

1. screening: the search strategy's candidates as one-rank trials at global batch / N (so every
   pair keeps its per-device batch), one per device, N at a time; on Slurm as one-GPU jobs. Each
   is measured coarsely, to at most trial.measure_steps timed steps: what it cannot separate, a
   full trial will. A screened pair that may be confirmed meets the workload's stress step, so a
   late OOM is met at one rank rather than in a fresh N-rank confirmation (core/screening.py). It
   is a sweep of its own in `<sweep dir>/screening/` (its own trials.csv, sweep.json and trial
   dirs, resumable like any sweep): the screening rows, kept and labelled.
2. confirmation: the screened pairs inside the noise of the screening leader
   (core/screening.confirm_candidates) as full N-device trials in the sweep dir itself. The table
   and the recommendation rest on these alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.core.fingerprint import fingerprint, fingerprint_values
from sweep.core.memory_model import PeakPrediction
from sweep.core.schema import TrialResult
from sweep.core.screening import SCREENING_DIR, confirm_candidates, screening_batch
from sweep.core.space import Candidate
from sweep.core.strategies import Proposal, strategy_class
from sweep.orchestration.plan import SweepPlan, check_same_settings, new_sweep_id

if TYPE_CHECKING:  # the pool imports the launch edge (submitit): only where a sweep runs
    from sweep.orchestration.trial_pool import TrialPool


def screening_plan(plan: SweepPlan) -> SweepPlan:
    """The one-rank sweep that screens `plan`'s candidates: same pairs, one device each, N at a time."""
    n = plan.meta.num_devices
    gbs = screening_batch(plan.meta.global_batch_size, n)
    machine = replace(plan.machine, num_devices=1, nodes=1)
    trial = replace(plan.trial, max_measure_steps=plan.trial.measure_steps)
    launcher = {**plan.launcher, "tasks_per_node": 1, "nodes": 1}
    if launcher.get("gpus_per_node"):  # a CPU profile has the key unset: a GPU asked of a CPU cluster is refused
        launcher["gpus_per_node"] = 1
    sweep_dir = plan.sweep_dir / SCREENING_DIR
    values = fingerprint_values(
        machine=asdict(machine), workload=asdict(plan.workload), trial=asdict(trial), global_batch_size=gbs, num_devices=1, launcher=launcher
    )
    stored = check_same_settings(sweep_dir, values)
    meta = replace(plan.meta, sweep_id=str(stored.get("sweep_id") or new_sweep_id(sweep_dir)), global_batch_size=gbs, num_devices=1)
    return replace(
        plan, meta=meta, sweep_dir=sweep_dir, machine=machine, trial=trial, launcher=launcher, max_in_flight=n,
        time_limit_s=float(trial.time_limit_s), fingerprint_values=values, fingerprint=fingerprint(values), screen=False,
        # Screening only ranks candidates for the full trials, which the drift check then re-times.
        drift_check=False,
        cancel_outranked=strategy_class(plan.search).uses_ordering,
        nominates_only=True,
        started_at=str(stored.get("started_at") or plan.started_at),
    )


class Confirm:
    """The confirmation phase's strategy: the screened pairs inside the leader's noise, fastest first."""

    name = "confirm"

    def __init__(self, candidates: Collection[Candidate], screening: Mapping[str, TrialResult]) -> None:
        self.by_key = {c.key: c for c in candidates if c.valid}
        self.screening = dict(screening)

    def propose(self, finished: Mapping[str, TrialResult], in_flight: Collection[str]) -> Proposal:
        left = [
            self.by_key[r.key]
            for r in confirm_candidates(self.screening, finished)
            if r.key in self.by_key and r.key not in in_flight and r.key not in finished
        ]
        return Proposal(left, done=not left and not in_flight)

    def predicted_ooms(self, finished: Mapping[str, TrialResult]) -> dict[str, PeakPrediction]:
        return {}  # the screening trials measured every pair's memory at this per-device batch


def cancel_outranked(pool: TrialPool, results: Mapping[str, TrialResult], sweep_dir: Path) -> None:
    """Cancel the running screening trials that the ordering rules out before their first timed step."""
    from sweep.core.decision import cancel_reason
    from sweep.core.schema import trial_dir
    from sweep.records import progress_step_times

    for key, trial in list(pool.running.items()):
        if trial.cancelled or progress_step_times(trial_dir(sweep_dir, key)):
            continue
        why = cancel_reason(trial.cand, results)
        if why:
            pool.cancel(key)
            pool.log(f"accum={trial.cand.accum} split={trial.cand.split}: {why}")


def _record_the_sweep(plan: SweepPlan) -> None:
    """The sweep's own sweep.json before its screening phase runs, so that `resume=<sweep dir>` has the
    command to replay if it is stopped then (the sweep's orchestrator rewrites it when it starts). Written under
    the sweep dir's lock (orchestration/entry.py): a second sweep into the dir is refused before it writes."""
    import json
    import sys

    from sweep.launch.clusters import cluster_for
    from sweep.orchestration.plan import META_FILE, sweep_record
    from sweep.records import atomic_write_text

    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    record = sweep_record(plan, state="screening", launcher=cluster_for(plan.launcher).name, argv=sys.argv[1:], orchestrator_cpu_s=0.0,
                          startup_cpu_s=0.0, wall_s=0.0)
    atomic_write_text(plan.sweep_dir / META_FILE, json.dumps(record, indent=2) + "\n")


def run_screening(plan: SweepPlan, orchestrator_for: Callable[[SweepPlan], Any]) -> tuple[Confirm | None, int]:
    """Run the screening phase with the orchestrator `orchestrator_for` makes for its plan;
    (the confirmation strategy, or None when it was interrupted; its exit status)."""
    sub = screening_plan(plan)
    _record_the_sweep(plan)
    orchestrator = orchestrator_for(sub)
    # Stopped during screening, the way on is to resume the whole sweep, not its screening phase alone.
    hint = orchestrator.stop.hint
    orchestrator.stop.hint = lambda note, _screening_dir: hint(note, plan.sweep_dir)
    orchestrator.display.log(
        f"screening: {sum(c.valid for c in plan.candidates)} pairs as one-rank trials at global_batch_size={sub.meta.global_batch_size}, "
        f"{sub.max_in_flight} at a time, in {sub.sweep_dir}; then full {plan.meta.num_devices}-device trials confirm the leaders"
    )
    code = orchestrator.run()
    latest = plan.sweep_dir / "latest"  # the screening sweep pointed its parent's link at itself: not a sweep of its own
    if latest.is_symlink():
        latest.unlink()
    if orchestrator.stop.signal is not None:
        return None, code
    return Confirm(plan.candidates, orchestrator.results), code


def screening_results(plan: SweepPlan) -> Mapping[str, Any]:
    """The screening phase's finished trials as they are on disk (for reports and tests)."""
    from sweep.records import collect_results

    return collect_results(plan.sweep_dir / SCREENING_DIR)
