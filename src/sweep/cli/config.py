"""Registers the typed config schemas in Hydra's ConfigStore: the sweep's own, and each workload's."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from sweep import workloads
from sweep.core.config import MachineConfig, SearchConfig, SweepConfig, TrialConfig

__all__ = ["MachineConfig", "SearchConfig", "SweepConfig", "TrialConfig", "register_configs", "schema_levels"]


def schema_levels(workload: str | None = None) -> list[tuple[str, type]]:
    """(config path, schema) for every typed level a key can be missing from; workload: the one chosen (its
    schema first under `workload`), else every workload's."""
    levels: list[tuple[str, type]] = [("", SweepConfig), ("machine", MachineConfig), ("trial", TrialConfig), ("search", SearchConfig)]
    chosen = [w for w in workloads.REGISTRY.values() if w.name == workload]
    return levels + [("workload", w.schema) for w in chosen or workloads.REGISTRY.values()]


def register_configs() -> None:
    from omegaconf import OmegaConf

    # Profiles derive per-node launcher settings from the machine: ${sweep_div:${machine.num_devices},${machine.nodes}}.
    if not OmegaConf.has_resolver("sweep_div"):
        OmegaConf.register_new_resolver("sweep_div", lambda a, b: int(a) // int(b))
    cs = ConfigStore.instance()
    cs.store(name="sweep_schema", node=SweepConfig)
    cs.store(group="machine", name="machine_schema", node=MachineConfig, package="machine")
    for workload in workloads.REGISTRY.values():
        # conf/workload/<name>.yaml extends `<name>_schema`.
        cs.store(group="workload", name=f"{workload.name}_schema", node=workload.schema, package="workload")
    cs.store(group="search", name="search_schema", node=SearchConfig, package="search")
