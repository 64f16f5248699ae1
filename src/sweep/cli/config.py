"""Registers the typed config schemas in Hydra's ConfigStore: the sweep's own, and each workload's.

The schemas are frozen dataclasses (the typed specs the edge validates into, orchestration/settings.py), but Hydra
merges YAML and command-line overrides into the nodes it composes, and OmegaConf makes a frozen dataclass's node
read-only. So Hydra is given a mutable twin of each: the same fields, types, defaults and rules, generated here.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from typing import Any

from hydra.core.config_store import ConfigStore

from sweep import workloads
from sweep.core.config import MachineConfig, SearchConfig, SweepConfig, TrialConfig

__all__ = ["MachineConfig", "SearchConfig", "SweepConfig", "TrialConfig", "hydra_schema", "register_configs", "schema_levels"]


def schema_levels(workload: str | None = None) -> list[tuple[str, type]]:
    """(config path, schema) for every typed level a key can be missing from; workload: the one chosen (its
    schema first under `workload`), else every workload's."""
    levels: list[tuple[str, type]] = [("", SweepConfig), ("machine", MachineConfig), ("trial", TrialConfig), ("search", SearchConfig)]
    chosen = [w for w in workloads.REGISTRY.values() if w.name == workload]
    return levels + [("workload", w.schema) for w in chosen or workloads.REGISTRY.values()]


@cache
def hydra_schema(schema: type) -> type:
    """The mutable twin of a frozen schema dataclass, for Hydra to compose into (nested schemas twinned too)."""
    hints = typing.get_type_hints(schema)  # the annotations as types: the schemas use `from __future__ import annotations`
    twin_fields: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(schema):
        kind: Any = hints[f.name]
        spec: dict[str, Any] = {"metadata": f.metadata}
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            kind = hydra_schema(kind)
            spec["default_factory"] = kind
        elif f.default_factory is not dataclasses.MISSING:
            spec["default_factory"] = f.default_factory
        elif f.default is not dataclasses.MISSING:
            spec["default"] = f.default
        twin_fields.append((f.name, kind, dataclasses.field(**spec)))
    twin = dataclasses.make_dataclass(schema.__name__, twin_fields)
    twin.__module__, twin.__doc__ = schema.__module__, f"Hydra's mutable twin of {schema.__module__}.{schema.__name__}."
    return twin


def register_configs() -> None:
    from omegaconf import OmegaConf

    # Profiles derive per-node launcher settings from the machine: ${sweep_div:${machine.num_devices},${machine.nodes}}.
    if not OmegaConf.has_resolver("sweep_div"):
        OmegaConf.register_new_resolver("sweep_div", lambda a, b: int(a) // int(b))
    cs = ConfigStore.instance()
    cs.store(name="sweep_schema", node=hydra_schema(SweepConfig))
    cs.store(group="machine", name="machine_schema", node=hydra_schema(MachineConfig), package="machine")
    for workload in workloads.REGISTRY.values():
        # conf/workload/<name>.yaml extends `<name>_schema`.
        cs.store(group="workload", name=f"{workload.name}_schema", node=hydra_schema(workload.schema), package="workload")
    cs.store(group="search", name="search_schema", node=hydra_schema(SearchConfig), package="search")
