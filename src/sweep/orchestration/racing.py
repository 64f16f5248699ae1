"""Racing and the memory model's verdicts: the orchestrator's side of spending less on clear answers.

Racing. Each poll, every running trial's timed steps so far (its progress.json) give a 95%
interval of its median throughput; when that interval lies wholly below the leader's
(core/measure.py's cannot_win, with its guards against noise) the orchestrator writes
`<trial dir>/stop.json` with the reason. It alone writes that file; the trial polls for it
between steps, stops, and records its partial measurement as ok with `stopped_early`.
Measuring to the decision (search.measure_to_decision, core/decision.py) uses the same channel
for more reasons: the throughput ordering rules the trial out, it is already separated above
every rival, tied with them, or its own steps cannot separate it from them; or it is the search's
first pair, stopped provisionally once its fit is known (orchestration/remeasure.py runs such a
pair again in full when it may be the answer).

Predicted OOMs. Pairs the strategy's memory model will not launch get a record of their own,
`<trial dir>/predicted_oom.json` (TrialResult schema, status predicted_oom, the predicted peak
as peak_mem_gib and the capacity as capacity_gib), written by the orchestrator alone, never
result.json: no trial ran. They are recomputed from the measured peaks on every change, so a
resumed sweep needs none of these files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from sweep.core.config import TrialConfig
from sweep.core.decision import FIT_KNOWN_STEPS, PROVISIONAL_STEPS, Running, ahead_after_steps, decision_stops, losers
from sweep.core.measure import STOP_FILE
from sweep.core.memory_model import PeakPrediction, predicted_oom_reason
from sweep.core.schema import Status, TrialResult, now_iso, trial_dir
from sweep.core.space import Candidate
from sweep.records import atomic_write_text, progress_step_times

if TYPE_CHECKING:
    from sweep.core.ranking import SweepMeta
    from sweep.core.strategies import Strategy
    from sweep.orchestration.plan import SweepPlan

PREDICTED_FILE = "predicted_oom.json"


class StopSteps(NamedTuple):
    """How many timed steps the decision lets a plan's trials run before each kind of stop (core/decision.py)."""

    first_pair: int  # a pair with no rival measured (trial.measure_steps)
    ahead: int  # a pair ahead, tied, or past what its own steps can separate: past the stress step
    provisional: int  # the search's first pair (rule 0); 0: never
    cap: int = 0  # trial.max_measure_steps, where rule 5 bounds what a pair's own steps can still separate; 0: unknown


# trial.measure_steps' default, no stress step, no provisional stop: what a Racing is told when nothing else is
PLAIN_STEPS = StopSteps(first_pair=TrialConfig.measure_steps, ahead=FIT_KNOWN_STEPS, provisional=0, cap=TrialConfig.max_measure_steps)


class Racing:
    """Writes stop.json for running trials that cannot win; each trial is told once.

    With `candidates` (the sweep's pairs by key) it measures to the decision instead
    (core/decision.py): a trial also stops once the throughput ordering rules it out, once its
    interval already separates it from every rival, once it is tied with them within
    run_to_run_noise (machine.run_to_run_noise, core/decision.tie_band), or once its own steps cannot
    separate it from them; steps (plan_stop_steps) says after how many timed steps each of those may
    come, and where the search's first pair stops provisionally. The trials in `in_full` (re-runs of
    provisional pairs: orchestration/remeasure.py) never stop provisionally.
    """

    def __init__(
        self,
        sweep_dir: Path,
        global_batch_size: int,
        candidates: Mapping[str, Candidate] | None = None,
        steps: StopSteps = PLAIN_STEPS,
        run_to_run_noise: float = 0.0,
    ) -> None:
        self.sweep_dir = sweep_dir
        self.global_batch_size = global_batch_size
        self.candidates = candidates
        self.steps = steps
        self.run_to_run_noise = run_to_run_noise
        self.told: set[str] = set()
        self.in_full: set[str] = set()

    def forget(self, key: str) -> None:
        """A (re)submitted trial starts with no stop request."""
        self.told.discard(key)
        (trial_dir(self.sweep_dir, key) / STOP_FILE).unlink(missing_ok=True)

    def stop_losers(self, running: Iterable[str], results: Mapping[str, TrialResult]) -> dict[str, str]:
        """Tell each running trial that cannot win to stop; {key: reason} of those told now."""
        pending = [k for k in running if k not in self.told]
        if self.candidates is None:
            stopped = losers({k: progress_step_times(trial_dir(self.sweep_dir, k)) for k in pending}, results, self.global_batch_size)
        else:
            # Every running trial is a rival of the others, told or not: each one's progress so far.
            now = {k: Running(self.candidates[k], progress_step_times(trial_dir(self.sweep_dir, k))) for k in running if k in self.candidates}
            stopped = {
                k: why
                for k, why in decision_stops(
                    now, results, self.global_batch_size, first_pair_steps=self.steps.first_pair, ahead_steps=self.steps.ahead,
                    run_to_run_noise=self.run_to_run_noise, provisional_steps=self.steps.provisional, in_full=self.in_full,
                    space=list(self.candidates.values()), max_steps=self.steps.cap,
                ).items()
                if k not in self.told
            }
        for key, reason in stopped.items():
            atomic_write_text(trial_dir(self.sweep_dir, key) / STOP_FILE, json.dumps({"reason": reason, "at": now_iso()}) + "\n")
            self.told.add(key)
        return stopped


def plan_stop_steps(plan: SweepPlan) -> StopSteps:
    """The plan's StopSteps: trial.measure_steps for a pair with no rival, the workload's stress step for a
    possible answer to stop ahead, tied or undecidable by its own steps (a screening row too: core/screening.py),
    and the search's first pair stopped provisionally where that pair is the slow end of the search (the
    staircase's and the powers climb's first fitting pair: the biggest accumulation, or the smallest micro-batch).
    Not with search=grid, whose first pair is the biggest micro-batch, as likely the answer as not; nor in a
    screened sweep's confirmations (plan.screen), whose first full trial is the screening leader: a provisional
    stop there would most often be run again."""
    ahead = plan_ahead_steps(plan.workload, plan.trial.warmup_steps)
    from sweep.core.strategies import strategy_class

    provisional = PROVISIONAL_STEPS if strategy_class(plan.search).starts_slowest and not plan.screen else 0
    return StopSteps(int(plan.trial.measure_steps), ahead, provisional, int(plan.trial.max_measure_steps))


def plan_ahead_steps(workload: object, warmup_steps: int) -> int:
    """core/decision.ahead_after_steps for a plan's workload config: the built-in RNN-T's
    workload.stress_step where it has one; a command trial's (or a config without one) 0: none."""
    return ahead_after_steps(int(getattr(workload, "stress_step", 0) or 0), int(warmup_steps))


def predicted_record(cand: Candidate, pred: PeakPrediction, capacity_gib: float, global_batch_size: int, num_devices: int) -> TrialResult:
    """What the table and predicted_oom.json show for a pair skipped on the memory model's word."""
    return TrialResult(
        **cand.numbers(global_batch_size, num_devices),
        status=Status.PREDICTED_OOM,
        error=predicted_oom_reason(pred, capacity_gib),
        peak_mem_gib=round(pred.peak_gib, 4),
        capacity_gib=capacity_gib,
        finished_at=now_iso(),
    )


def write_predicted(sweep_dir: Path, record: TrialResult) -> None:
    tdir = trial_dir(sweep_dir, record.key)
    tdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(tdir / PREDICTED_FILE, json.dumps(record.to_dict(), indent=2) + "\n")


def drop_predicted(sweep_dir: Path, key: str) -> None:
    """A pair no longer predicted out (new peaks changed the fit, or it is launched) loses its record."""
    (trial_dir(sweep_dir, key) / PREDICTED_FILE).unlink(missing_ok=True)


class Predictions:
    """The pairs skipped on the memory model's word, refitted whenever a result lands."""

    def __init__(self, sweep_dir: Path, meta: SweepMeta, by_key: Mapping[str, Candidate], capacity_gib: float | None) -> None:
        self.sweep_dir, self.meta, self.by_key = sweep_dir, meta, by_key
        # None: no budget was set (machine.memory_gib), so the strategy predicts nothing and nothing is compared with it.
        self.capacity_gib = float(capacity_gib) if capacity_gib is not None else math.inf
        self.records: dict[str, TrialResult] = {}  # shown in the table as predicted_oom
        self.p_exceeds: dict[str, float] = {}  # their P(OOM), for the confidence score
        self._made_from: tuple[int, int] | None = None

    def update(self, strategy: Strategy, results: Mapping[str, TrialResult], in_flight: int) -> list[str]:
        """Refit when the results changed; the log lines of what changed."""
        if self._made_from == (len(results), in_flight):
            return []
        self._made_from = (len(results), in_flight)
        now = strategy.predicted_ooms(results)
        self.p_exceeds = {k: pred.p_exceeds(self.capacity_gib) for k, pred in now.items()}
        lines = []
        for key in [k for k in self.records if k not in now]:
            record = self.records.pop(key)
            drop_predicted(self.sweep_dir, key)
            lines.append(f"accum={record.accum} split={record.split}: no longer predicted to OOM (refitted on new peaks)")
        for key, pred in now.items():
            if key in self.records:
                continue
            record = predicted_record(self.by_key[key], pred, self.capacity_gib, self.meta.global_batch_size, self.meta.num_devices)
            write_predicted(self.sweep_dir, record)
            self.records[key] = record
            lines.append(f"accum={record.accum} split={record.split}: {record.status}, not launched: {record.error}")
        return lines
