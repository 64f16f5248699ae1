"""What a sweep's warm workers record of themselves (tests/test_warm_workers.py, bench/reliability_validity.py)."""

from __future__ import annotations

import json
from pathlib import Path


def states(sweep_dir: Path) -> list[dict]:
    return [{**json.loads(p.read_text()), "dir": p.parent.name} for p in sorted((sweep_dir / ".workers").glob("*/state.json"))]


def running_worker(sweep_dir: Path) -> dict | None:
    """A worker's state once its trial has timed a step (mid-trial)."""
    for state in states(sweep_dir):
        if state["state"] == "running" and (Path(state["trial_dir"]) / "progress.json").exists():
            return state
    return None
