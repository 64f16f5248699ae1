"""The command workload's config schema (workload=command)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional


@dataclass(frozen=True)
class CommandWorkloadConfig:
    name: str = "command"  # an external training command: one launcher per node per trial (it starts the ranks)
    argv: List[str] = field(default_factory=list)  # argv template; placeholders like {accum}, {split}
    env: Any = field(default_factory=dict)  # extra environment variables (values may use placeholders)
    cwd: Optional[str] = None  # working directory for the command (relative: to where sweep started); None: where sweep started
    parser: Any = field(default_factory=dict)  # how throughput is read from the log (see sweep.parsers)
    splits_apply: bool = True  # False: the script has no batch_split_factor; the space is 1-D (also when argv uses neither {split} nor {joint_batch})
    probe: bool = True  # time and size each step from inside the command's Python processes; False: from the log alone
    phase_patterns: Any = None  # {encoder|joint|optimizer: [regex on traceback frames]}; None: the RNN-T defaults
