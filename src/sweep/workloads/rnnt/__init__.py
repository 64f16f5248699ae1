"""The built-in PyTorch RNN-T training step (workload=rnnt)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sweep.errors import SweepError
from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.rnnt.config import RNNTWorkloadConfig, check_joint

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec


def _validate(config: Any, context: CheckContext) -> None:
    """What its fields' rules (checked already, at the edge) cannot say: a packed joint needs the fused one, the
    duration bounds in order (pure checks); and bf16 on a local CPU without bfloat16 kernels (torch, only for that
    case: elsewhere the trial's host decides, and its failure names the same fix)."""
    from sweep.workloads.rnnt.data import length_spec  # pure, like check_joint: no torch here

    try:
        check_joint(config.joint, bool(config.packed_joint))
        length_spec(config)
    except ValueError as exc:
        raise SweepError(str(exc)) from None
    if config.precision == "bf16" and context.local_launch and context.device == "cpu":
        import torch

        from sweep.workloads.rnnt.model import autocast_dtype

        try:
            autocast_dtype("bf16", torch.device("cpu"))
        except ValueError as exc:
            raise SweepError(str(exc)) from None


def _run(spec: TrialSpec) -> TrialResult:
    from sweep.workloads.rnnt.runner import run_trial  # torch: in the job process only

    return run_trial(spec)


def _warm_runner() -> Callable[..., TrialResult]:
    """In a warm worker, once: torch and the model's modules imported, so the trials it forks find them loaded."""
    from sweep.workloads.rnnt.runner import run_trial

    return run_trial


def _describe(config: RNNTWorkloadConfig) -> str:
    from sweep.workloads.rnnt.data import size_summary  # pure arithmetic on the dimensions

    return size_summary(config)


WORKLOAD = Workload(name="rnnt", schema=RNNTWorkloadConfig, validate=_validate, run=_run, warm_runner=_warm_runner, describe=_describe)
