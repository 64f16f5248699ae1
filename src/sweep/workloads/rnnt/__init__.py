"""The built-in PyTorch RNN-T training step (workload=rnnt)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.rnnt.config import RNNTWorkloadConfig

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec


def _validate(config: Any, context: CheckContext) -> None:
    """Its typed schema already checks every field; nothing more can be checked before a trial runs."""


def _run(spec: TrialSpec) -> TrialResult:
    from sweep.workloads.rnnt.runner import run_trial  # torch: in the job process only

    return run_trial(spec)


def _describe(config: RNNTWorkloadConfig) -> str:
    from sweep.workloads.rnnt.data import size_summary  # pure arithmetic on the dimensions

    return size_summary(config)


WORKLOAD = Workload(name="rnnt", schema=RNNTWorkloadConfig, validate=_validate, run=_run, describe=_describe)
