"""Sweep any training script (workload=command): its argv template runs as one trial."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweep.errors import SweepError, TemplateError
from sweep.workloads.base import CheckContext, Workload
from sweep.workloads.command.config import CommandWorkloadConfig

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult
    from sweep.core.spec import TrialSpec


def _validate(config: CommandWorkloadConfig, context: CheckContext) -> None:
    from sweep.parsers import compile_phase_patterns, parser_settings
    from sweep.parsers.regex_guard import check_regex_speed
    from sweep.workloads.command.template import check_template, missing_paths, unjoined_nodes

    argv, env = config.argv or [], config.env or {}
    try:
        check_template(argv, env)
    except TemplateError as e:
        raise SweepError(str(e)) from None
    # Not refused: a script may join its nodes from Slurm's own variables (Lightning reads SLURM_NODEID), which no
    # placeholder shows; but a plain `python train.py` started on every node is a world per node, and says so here.
    unjoined = unjoined_nodes(argv, env, context.nodes)
    if unjoined:
        print(f"sweep: warning: {unjoined}", file=sys.stderr)
    # On Slurm the script and executable live on the compute nodes (each trial checks them there); here,
    # whatever the run needs is checked before anything launches. A dry run launches nothing: it shows its plan
    # (a shipped preset's, say, looked at from anywhere) and says what a run from here would stop on.
    if context.local_launch:
        missing = missing_paths(argv, config.cwd or os.getcwd())
        if missing and context.dry_run:
            print(f"sweep: warning: {missing} (a dry run goes on; a run from here would stop on it)", file=sys.stderr)
        elif missing:
            raise SweepError(missing)
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


def _at_edge(config: CommandWorkloadConfig) -> CommandWorkloadConfig:
    """The command runs where sweep was started (or workload.cwd, relative to there), never in the trial dir:
    the start directory is recorded here, in the plan, since the trial jobs may run anywhere."""
    start = os.getcwd()
    return replace(config, cwd=os.path.normpath(os.path.join(start, os.path.expanduser(config.cwd))) if config.cwd else start)


def _run(spec: TrialSpec) -> TrialResult:
    from sweep.workloads.command.runner import run_command_trial

    return run_command_trial(spec)


def _live_throughput(trial_dir: Path) -> float | None:
    """The last throughput the command's log showed, from the progress file its trial keeps."""
    from sweep.core.measure import PROGRESS_FILE

    try:
        return float(json.loads((Path(trial_dir) / PROGRESS_FILE).read_text())["throughput"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _describe_launch(spec: TrialSpec) -> str:
    from sweep.workloads.command.launching import launch_lines

    try:
        return launch_lines(spec)
    except (TemplateError, KeyError, ValueError):
        return ""  # validate reports the template


def _splits_apply(config: Any) -> bool:
    """A command that uses neither {split} nor {joint_batch} cannot tell the pairs of one accum apart: 1-D."""
    from sweep.workloads.command.template import uses_split

    try:
        return bool(config.splits_apply) and uses_split(config.argv or [], config.env or {})
    except TemplateError:
        return bool(config.splits_apply)  # validate reports the template


WORKLOAD = Workload(
    name="command",
    schema=CommandWorkloadConfig,
    validate=_validate,
    run=_run,
    live_throughput=_live_throughput,
    splits_apply=_splits_apply,
    at_edge=_at_edge,
    one_launcher_per_node=True,
    describe_launch=_describe_launch,
)
