"""Config of the `sweep` Sweeper (hydra/sweeper=sweep). Kept import-light: Hydra imports every
module under hydra_plugins at plugin discovery, before any sweep runs."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class SweepSweeperConf:
    _target_: str = "hydra_plugins.sweep_sweeper.sweeper.SweepSweeper"
    # Seconds between checks for ended jobs; a landed result shows within this plus the table write.
    poll_interval_s: float = 0.25


ConfigStore.instance().store(group="hydra/sweeper", name="sweep", node=SweepSweeperConf, provider="sweep")
