"""What a workload gives the sweep: the four things it registers (see sweep.workloads).

A workload module stays import-light: its config schema and validation are read by the
orchestrator, while `run` executes in the trial job and imports the heavy parts (torch)
only there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec


@dataclass(frozen=True)
class CheckContext:
    """What a workload's validation may need to know beyond its own config."""

    local_launch: bool  # trials run on this host (files and executables there can be checked)
    dry_run: bool = False  # nothing launches: what only a launch needs (the executable) is a warning
    device: str = "cpu"  # machine.device: what the trials train on
    nodes: int = 1  # machine.nodes: the nodes each trial spans


@dataclass(frozen=True)
class Workload:
    name: str  # the value of workload.name, and `workload=NAME` in conf/workload/
    schema: type  # its config dataclass; registered in Hydra's ConfigStore as `<name>_schema`
    # Raises SweepError (one line) for a config no trial could run with; called before anything starts.
    validate: Callable[[Any, CheckContext], None]
    # Runs one trial in the job process and writes its result.json; returns the same record.
    run: Callable[[TrialSpec], TrialResult]
    # Throughput a running trial has already shown (from files in its trial dir), or None.
    live_throughput: Callable[[Path], float | None] = lambda trial_dir: None
    # Whether batch_split_factor means anything to it; False: the space is accum alone (split=1).
    splits_apply: Callable[[Any], bool] = lambda config: True
    # Its config with what only the starting host knows filled in (a start directory), before validation.
    at_edge: Callable[[Any], Any] = lambda config: config
    # True: a trial runs one task per node (the workload's own launcher starts the ranks); False: one per device.
    one_launcher_per_node: bool = False
    # Called once in a warm worker's process (launch/worker.py), where it pays the heavy imports, and returning the
    # function that runs each trial there: run(spec, extra_startup_s=...), the start-up its first trial owes. None: each
    # trial needs a process of its own (a command's memory is the user's program's), so no warm worker serves it.
    warm_runner: Callable[[], Callable[..., TrialResult]] | None = None
    # A few lines for dry_run on what the workload is (its size, say); empty if nothing useful.
    describe: Callable[[Any], str] = lambda config: ""
    # dry_run's lines on how one trial starts (a command: the line each node's launcher runs); empty if nothing useful.
    describe_launch: Callable[[TrialSpec], str] = lambda spec: ""
