"""The frameworks' own per-optimizer-step timing, written where the tests read it: one JSON line per step,
{"rank", "step", "seconds"}, `seconds` being the wall time from the end of the previous optimizer step to the
end of this one (as the probe measures), `step` counting this process's optimizer steps from 1.

Each test script calls `StepTimesFile.mark(step)` from a hook of its framework's own (a Trainer callback, a
Lightning callback); the file is `$STEP_TIMES_FILE.rank<R>.jsonl`, the tests setting STEP_TIMES_FILE per trial
through workload.env's placeholders; without it, `step_times.rank<R>.jsonl` in the trial's own dir
(`$SWEEP_TRIAL_DIR`, which sweep gives every command: a drift check's re-timing keeps its own), else in the
working dir. Standard library only: the scripts import it beside their framework.

`batch_arguments()` is the command line the small scripts share, the one sweeps/my_script.yaml passes.
"""

from __future__ import annotations

import argparse
import json
import os
import time


class StepTimesFile:
    def __init__(self, rank: int) -> None:
        stem = os.environ.get("STEP_TIMES_FILE") or os.path.join(os.environ.get("SWEEP_TRIAL_DIR", ""), "step_times")
        os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
        self.rank = rank
        self.file = open(f"{stem}.rank{rank}.jsonl", "w", buffering=1)  # line-buffered: a killed trial keeps its steps
        self.last: float | None = None

    def mark(self, step: int) -> None:
        """Called once at the end of each optimizer step; the first step has no previous end, so no record."""
        now = time.perf_counter()
        if self.last is not None:
            self.file.write(json.dumps({"rank": self.rank, "step": step, "seconds": now - self.last}) + "\n")
        self.last = now


def batch_arguments() -> argparse.ArgumentParser:
    """--batch-size and --accum (what sweeps/my_script.yaml passes), and the model's size; a script adds its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="samples per micro-batch")
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run (one epoch)")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    return parser
