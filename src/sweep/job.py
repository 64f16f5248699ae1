"""What each submitit job runs: one trial of the configured workload.

Kept tiny and import-light: it is pickled by reference into every job, and the
workload's heavy imports (torch) happen inside the job process only.
"""

from __future__ import annotations

from typing import Any


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    name = spec["workload"].get("name")
    if name == "rnnt":
        from .trial import run_trial

        return run_trial(spec)
    if name == "command":
        from .workloads.command import run_command_trial

        return run_command_trial(spec)
    raise ValueError(f"workload.name={name!r} is not valid: expected rnnt or command")
