"""What the end-of-search steps (remeasure.py's re-runs, retime.py's drift check) see of the running sweep.

The orchestrator drives them and hands itself in; they read and change its state through this Protocol,
not through the Orchestrator class, so neither imports orchestrator.py back (no import circle).
"""

from __future__ import annotations

from typing import Protocol

from sweep.core.schema import TrialResult
from sweep.core.space import Candidate
from sweep.orchestration.display import Display
from sweep.orchestration.plan import SweepPlan
from sweep.orchestration.racing import Racing
from sweep.orchestration.signals import StopSignals
from sweep.orchestration.trial_pool import TrialPool


class SweepState(Protocol):
    """The running sweep, as the steps after its search use it (orchestrator.Orchestrator is one)."""

    plan: SweepPlan  # the validated settings
    results: dict[str, TrialResult]  # finished trials, by pair key
    by_key: dict[str, Candidate]  # every candidate, by pair key
    racing: Racing  # stop requests, and the pairs measured in full (never stopped provisionally)
    display: Display  # where log lines go
    stop: StopSignals  # SIGINT/SIGTERM noted, acted on at safe points
    pool: TrialPool  # every job's life: the search's trials and the drift check's re-timings
    drift_left: list[TrialResult] | None  # the pairs the drift check under way has still to re-time
    poll_interval_s: float  # how often the loop looks at its jobs

    def submit(self, cand: Candidate) -> None:
        """Start a trial of `cand` and track it."""
