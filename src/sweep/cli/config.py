"""Registers the typed config schemas in Hydra's ConfigStore."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from sweep.core.config import MachineConfig, SearchConfig, SweepConfig, TrialConfig
from sweep.workloads.command.config import CommandWorkloadConfig
from sweep.workloads.rnnt.config import RNNTWorkloadConfig

__all__ = ["CommandWorkloadConfig", "MachineConfig", "RNNTWorkloadConfig", "SearchConfig", "SweepConfig", "TrialConfig", "register_configs"]


def register_configs() -> None:
    from omegaconf import OmegaConf

    # Profiles derive per-node launcher settings from the machine: ${sweep_div:${machine.num_devices},${machine.nodes}}.
    if not OmegaConf.has_resolver("sweep_div"):
        OmegaConf.register_new_resolver("sweep_div", lambda a, b: int(a) // int(b))
    cs = ConfigStore.instance()
    cs.store(name="sweep_schema", node=SweepConfig)
    cs.store(group="machine", name="machine_schema", node=MachineConfig, package="machine")
    cs.store(group="workload", name="rnnt_schema", node=RNNTWorkloadConfig, package="workload")
    cs.store(group="workload", name="command_schema", node=CommandWorkloadConfig, package="workload")
    cs.store(group="search", name="search_schema", node=SearchConfig, package="search")
