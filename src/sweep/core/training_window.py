"""Which probe steps are the training's (pure): the loop that runs through the trial's window (issue 50).

core/probe_report.summarise leaves some steps out before anything is summarised (ProbeReport.left_out says
which and why):
- a process that stepped and then ended while the command ran on (a preparation subprocess stepping an
  optimizer before the training starts), or, once the command has ended, one whose steps all ended before the
  last process to step began (training_sources);
- in a process, the steps before a torch.optim optimizer it made after stepping: the trainer started a new phase
  with a fresh optimizer, as Lightning's Tuner and similar do after a learning-rate range test;
- a learning-rate range test in flight: a run of at least RANGE_TEST_MIN_RATIOS rises of the learning rate by a
  near-constant factor a step (a geometric sweep, fastai's and Lightning's shape) over RANGE_TEST_MIN_RISE or
  more. A warm-up's rise is not geometric (a linear or cosine ramp's factor falls step by step) and is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# A learning-rate range test: at least RANGE_TEST_MIN_RATIOS consecutive rises of the rate, each by
# RANGE_TEST_MIN_STEP_RISE or more, by a constant factor (the largest log-ratio within RANGE_TEST_RATIO_SPREAD of the
# smallest) and RANGE_TEST_MIN_RISE in all. fastai's lr_find and Lightning's default sweep 1e-7..10 and 1e-8..1 in
# 100 steps, 1.2x a step exactly: seen after 7 steps, before a sweep's warm-up and first figure (10 steps) are over.
# A linear warm-up's factor falls step by step ((i+1)/i: 1.24 between the first and fifth of five rises of 5% or
# more), a cosine ramp's rises and falls.
RANGE_TEST_MIN_RATIOS = 6
RANGE_TEST_MIN_STEP_RISE = 1.05
RANGE_TEST_MIN_RISE = 2.0
RANGE_TEST_RATIO_SPREAD = 1.1


def training_sources(stepped: Mapping[str, Mapping[int, Record]], exited: set[str], running: bool) -> set[str]:
    """The processes whose steps are the training's: those still running (no exit record) and any that stepped
    alongside them; none while the command runs and every process that stepped has exited (a preparation done, the
    training not started). Once the command has ended: the last process to step and those whose steps overlap its.
    A process's span is its steps' wall-clock ends."""
    spans = {}
    for source, steps in stepped.items():
        ends = [e for e in (_number(r.get("end")) for r in steps.values()) if e is not None]
        spans[source] = (min(ends), max(ends)) if ends else (0.0, math.inf)
    alive = [source for source in stepped if source not in exited]
    if alive:
        anchor = min(spans[source][0] for source in alive)
    elif running or not stepped:
        return set()
    else:
        anchor = spans[max(stepped, key=lambda source: spans[source][1])][0]
    return {source for source in stepped if source in alive or spans[source][1] >= anchor}


def training_steps(source: str, steps: Mapping[int, Record], made_after: Sequence[int], left_out: list[str]) -> dict[int, Record]:
    """A process's steps less those before its last fresh optimizer (made after it had stepped) and those of a
    learning-rate range test (range_test_steps); why each was left out goes to left_out."""
    fresh = max((after for after in made_after if after > 0), default=0)
    kept = {index: record for index, record in steps.items() if index >= fresh}
    if len(kept) < len(steps):
        left_out.append(f"{source}: steps 0-{fresh - 1}, before the trainer made a fresh optimizer (a new phase: after a range test?)")
    test = range_test_steps([(index, _number(kept[index].get("lr"))) for index in sorted(kept)])
    if test:
        left_out.append(f"{source}: steps {min(test)}-{max(test)}, a learning-rate range test (the rate rose geometrically)")
    return {index: record for index, record in kept.items() if index not in test}


def range_test_steps(rates: Sequence[tuple[int, float | None]]) -> set[int]:
    """The steps (index, learning rate; in order) of runs of a geometric rise in the learning rate (module docstring)."""
    out: set[int] = set()
    run: list[tuple[int, float]] = []

    def close() -> None:
        logs = [math.log(b / a) for (_, a), (_, b) in zip(run, run[1:])]
        if (len(logs) >= RANGE_TEST_MIN_RATIOS and math.exp(sum(logs)) >= RANGE_TEST_MIN_RISE
                and max(logs) <= RANGE_TEST_RATIO_SPREAD * min(logs)):
            out.update(index for index, _ in run)

    for index, lr in rates:
        rises = bool(run) and lr is not None and lr > 0 and index == run[-1][0] + 1 and lr >= run[-1][1] * RANGE_TEST_MIN_STEP_RISE
        if not rises:
            close()
            run = []
        if lr is not None and lr > 0:
            run.append((index, lr))
    close()
    return out
