"""Sweep any training script (workload=command): its argv template runs as one trial."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.errors import SweepError
from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.command.config import CommandWorkloadConfig

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec


def _validate(config: CommandWorkloadConfig, context: CheckContext) -> None:
    from sweep.parsers import compile_phase_patterns, parser_settings
    from sweep.parsers.regex_guard import check_regex_speed
    from sweep.workloads.command.runner import TemplateError, check_template

    argv, env = config.argv or [], config.env or {}
    try:
        check_template(argv, env)
    except TemplateError as e:
        raise SweepError(str(e)) from None
    exe = argv[0]
    # On Slurm the executable lives on the compute nodes; only a local launch can be checked here.
    if context.local_launch and "{" not in exe and shutil.which(exe, path=None if os.sep not in exe else "") is None:
        if not (os.sep in exe and os.access(exe, os.X_OK)):
            problem = f"workload.argv[0]={exe!r} is not an executable on PATH: give the full path or install it"
            if not context.dry_run:
                raise SweepError(problem)
            # A dry run launches nothing: it may well be planned on a host without the trainer.
            print(f"sweep: warning: {problem} before running this sweep", file=sys.stderr)
    try:
        # Every parser key, the common ones (skip_first, stop_after, ...) included, before launch.
        settings = parser_settings(config.parser)
    except ValueError as e:
        raise SweepError(f"workload.parser: {e}") from None
    pattern = settings.parser_spec.get("pattern")
    if settings.type == "regex" and isinstance(pattern, str):
        slow = check_regex_speed(pattern)
        if slow:
            raise SweepError(f"workload.parser: {slow}")
    if config.phase_patterns is not None:
        try:
            compile_phase_patterns(config.phase_patterns)
        except ValueError as e:
            raise SweepError(f"workload.phase_patterns: {e}") from None


def _run(spec: TrialSpec) -> TrialResult:
    from sweep.workloads.command.runner import run_command_trial

    return run_command_trial(spec)


def _live_throughput(trial_dir: Path) -> float | None:
    """The last throughput the command's log showed, from the progress file its trial keeps."""
    from sweep.workloads.command.runner import PROGRESS_FILE

    try:
        return float(json.loads((Path(trial_dir) / PROGRESS_FILE).read_text())["throughput"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _splits_apply(config: Any) -> bool:
    return bool(config.splits_apply)


WORKLOAD = Workload(
    name="command",
    schema=CommandWorkloadConfig,
    validate=_validate,
    run=_run,
    live_throughput=_live_throughput,
    splits_apply=_splits_apply,
)
