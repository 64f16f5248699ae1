"""The Sweeper that runs a `sweep`.

Hydra's own Launcher.launch() returns only when every job of a batch has ended, which
would keep devices idle behind a straggler and hide results until the end. So this
Sweeper does not call a Launcher: it reads the `hydra.launcher` parameters and gives
them, with the candidates parsed from the multirun overrides, to sweep's orchestrator,
which submits through submitit directly and collects each result as its job ends.
"""

from __future__ import annotations

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class SweepSweeper(Sweeper):
    def __init__(self, poll_interval_s: float = 0.25) -> None:
        self.poll_interval_s = poll_interval_s
        self.config: Optional[DictConfig] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config

    def sweep(self, arguments: List[str]) -> Any:
        # Deferred so that Hydra's plugin discovery stays fast.
        from sweep.orchestration.entry import run_from_hydra

        assert self.config is not None
        return run_from_hydra(self.config, arguments, poll_interval_s=self.poll_interval_s)
