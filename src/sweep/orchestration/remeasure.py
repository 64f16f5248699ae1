"""A provisional pair that may be the answer is run again, in full (core/decision.py's rule 0).

The search's first pair stops provisionally once its fit at the first (worst) batch is known: one
figure to order the next pairs by, its stress step not met, no 95% interval. It is never the answer
as it stands. When the search has nothing left to run and such a pair may still be the answer
(core/decision.provisional_contenders: the pair the recommendation would take, or one whose median
reaches that pair's 95% lower bound), the orchestrator runs it again in its own trial dir: the
provisional record moves aside to provisional.json (kept for the record, never read as a result:
sweep/records.py reads result.json), and the pair runs as a new trial, measured to the decision
against every finished pair and never stopped provisionally again (Racing.in_full). Until it lands,
the provisional record stands in the results (the strategy sees the pair as run, the table shows
it); then the re-run's record replaces it, and the search goes on from that: a late OOM at the
stress step, say, reopens the staircase below it. A resumed sweep finds the re-run's record, or
the provisional one and runs it again.

A pair cut short on a step or two by the throughput ordering that turns out to be a neighbour of the
answer the ordering alone ranks below it is run again in full the same way (issue 50: the ordering is
a prior, and that neighbour is where it fails; the confidence score stays below 80 until it is measured).
"""

from __future__ import annotations

import os

from sweep.core.decision import is_provisional, provisional_contenders
from sweep.core.measure import PROGRESS_FILE
from sweep.core.schema import RESULT_FILE, trial_dir
from sweep.orchestration.sweep_state import SweepState

PROVISIONAL_FILE = "provisional.json"  # in the trial dir: the provisional record a full re-run replaced


def run_in_full(orch: SweepState) -> bool:
    """Submit again, in full, each provisional pair that may be the answer; whether any was.

    Not in a screening sweep (plan.nominates_only): a screening row is never the answer, and its
    confirmations measure the pairs that may be."""
    if orch.plan.nominates_only or orch.stop.signal is not None:
        return False
    keys = [k for k in provisional_contenders(orch.results, list(orch.by_key.values())) if k in orch.by_key and k not in orch.racing.in_full]
    for key in keys:
        tdir = trial_dir(orch.plan.sweep_dir, key)
        if (tdir / RESULT_FILE).exists():
            os.replace(tdir / RESULT_FILE, tdir / PROVISIONAL_FILE)
        (tdir / PROGRESS_FILE).unlink(missing_ok=True)  # the re-run's steps, not the provisional ones, are its progress
        first = orch.results[key]
        orch.racing.in_full.add(key)
        how = "provisionally" if is_provisional(first) else "by the throughput ordering"
        orch.display.log(
            f"accum={first.accum} split={first.split}: stopped {how} after {len(first.step_times_s)} timed step(s) "
            f"({float(first.throughput or 0.0):.4g} {orch.plan.meta.throughput_unit or 'samples/s'}) and may be the answer: "
            f"running it again in full (the provisional record is kept as {PROVISIONAL_FILE})"
        )
        orch.submit(orch.by_key[key])
    return bool(keys)
