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
from collections.abc import Collection, Mapping

from sweep.core.decision import is_provisional, provisional_contenders
from sweep.core.measure import PROGRESS_FILE
from sweep.core.schema import RESULT_FILE, TrialResult, trial_dir
from sweep.core.space import Candidate
from sweep.orchestration.plan import SweepPlan

PROVISIONAL_FILE = "provisional.json"  # in the trial dir: the provisional record a full re-run replaced


def reruns_in_full(plan: SweepPlan, results: Mapping[str, TrialResult], by_key: Mapping[str, Candidate],
                   in_full: Collection[str]) -> list[tuple[str, str]]:
    """(key, the line to log) for each provisional pair that may be the answer and is not run in full yet, its
    provisional record moved aside and its progress cleared, ready to submit again (the orchestrator submits it).

    Not in a screening sweep (plan.nominates_only): a screening row is never the answer, and its
    confirmations measure the pairs that may be."""
    if plan.nominates_only:
        return []
    out = []
    for key in provisional_contenders(results, list(by_key.values())):
        if key not in by_key or key in in_full:
            continue
        tdir = trial_dir(plan.sweep_dir, key)
        if (tdir / RESULT_FILE).exists():
            os.replace(tdir / RESULT_FILE, tdir / PROVISIONAL_FILE)
        (tdir / PROGRESS_FILE).unlink(missing_ok=True)  # the re-run's steps, not the provisional ones, are its progress
        first = results[key]
        how = "provisionally" if is_provisional(first) else "by the throughput ordering"
        out.append((key, f"accum={first.accum} split={first.split}: stopped {how} after {len(first.step_times_s)} timed step(s) "
                         f"({float(first.throughput or 0.0):.4g} {plan.meta.throughput_unit or 'samples/s'}) and may be the answer: "
                         f"running it again in full (the provisional record is kept as {PROVISIONAL_FILE})"))
    return out
