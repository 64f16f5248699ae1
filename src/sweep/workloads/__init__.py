"""The workloads a sweep can measure, by name: one registry line each.

A new workload is a package beside rnnt/ and command/ whose __init__ defines
`WORKLOAD = Workload(...)` (sweep.workloads.base), plus its line below and its
conf/workload/<name>.yaml.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweep.errors import SweepError
from sweep.launch.job import TrialJob
from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.command import WORKLOAD as _COMMAND
from sweep.workloads.rnnt import WORKLOAD as _RNNT

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec

REGISTRY: dict[str, Workload] = {w.name: w for w in (_RNNT, _COMMAND)}

__all__ = ["REGISTRY", "CheckContext", "Workload", "get", "run_job"]


def get(name: object) -> Workload:
    """The registered workload called `name`; a SweepError naming the valid ones otherwise."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise SweepError(f"workload.name={name!r} is not valid: expected one of {', '.join(REGISTRY)}") from None


def run_configured(spec: TrialSpec) -> TrialResult:
    """Run one trial of the workload its spec names, in this (the job's) process."""
    return get(spec.workload.name).run(spec)


# What every trial job runs (submitted with the spec): requeued on Slurm preemption as the same trial.
run_job = TrialJob(run_configured)
