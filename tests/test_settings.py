"""The config is checked once, at the edge (orchestration/settings.py), into frozen typed specs.

Each value's rule sits beside its field (core/config.Rule); Hydra composes into a mutable twin of each frozen
schema (cli/config.hydra_schema); and nothing past the edge reads the composed config.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweep.cli.config import hydra_schema
from sweep.core.config import POSITIVE_INT, MachineConfig, Rule, SearchConfig, SweepConfig, TrialConfig, checked, refusal, rule_of
from sweep.workloads import REGISTRY

SCHEMAS = [SweepConfig, MachineConfig, TrialConfig, SearchConfig, *(w.schema for w in REGISTRY.values())]
SRC = Path(__file__).resolve().parents[1] / "src" / "sweep"


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_every_default_meets_its_own_rule_and_every_spec_is_frozen(schema: type) -> None:
    default = schema()
    assert refusal(default, "") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.name = "changed"  # type: ignore[misc]  # every schema has a name (SweepConfig: a key of its own)
    twin = hydra_schema(schema)
    assert [(f.name, f.default) for f in dataclasses.fields(twin)] == [(f.name, f.default) for f in dataclasses.fields(schema)]
    assert [rule_of(f) for f in dataclasses.fields(twin)] == [rule_of(f) for f in dataclasses.fields(schema)]


def test_hydra_merges_overrides_into_the_twin_and_the_edge_gets_the_frozen_spec() -> None:
    # A frozen dataclass's node is read-only to OmegaConf: Hydra could not apply an override to it.
    with pytest.raises(Exception, match="read-only"):
        OmegaConf.update(OmegaConf.structured(SweepConfig), "machine.num_devices", 8)
    node = OmegaConf.structured(hydra_schema(SweepConfig))
    OmegaConf.update(node, "machine.num_devices", 8)  # as Hydra applies machine.num_devices=8
    assert node.machine.num_devices == 8 and OmegaConf.get_type(node.machine) is hydra_schema(MachineConfig)
    with pytest.raises(Exception, match="Integer"):  # the twin keeps the types: a wrong one fails at composition
        OmegaConf.merge(node, {"machine": {"num_devices": "two"}})


def test_the_rules_refuse_in_one_line_naming_the_key_the_value_and_what_is_valid() -> None:
    assert refusal(MachineConfig(num_devices=0), "machine.") == "machine.num_devices=0 is not valid: expected a positive integer"
    assert refusal(MachineConfig(memory_gib=float("inf")), "machine.") == "machine.memory_gib=inf is not valid: expected a positive number of GiB, or null (unset)"
    assert refusal(MachineConfig(device="tpu"), "machine.") == "machine.device='tpu' is not valid: expected one of cpu, cuda"
    assert refusal(SearchConfig(max_trials=True), "search.") == "search.max_trials=True is not valid: expected a positive integer, or null"
    assert refusal(TrialConfig(memory_margin=None), "trial.") is None  # optional: the device's default
    assert Rule("x", above=0, below=1).accepts(0.5) and not Rule("x", above=0, below=1).accepts(1)
    assert not POSITIVE_INT.accepts(2.0) and not POSITIVE_INT.accepts(float("nan"))


def test_the_search_choices_are_the_strategies() -> None:
    from sweep.core.config import SEARCHES
    from sweep.core.strategies import STRATEGIES

    assert set(SEARCHES) == set(STRATEGIES)


def test_checked_reads_the_levels_in_the_users_order_and_resolves_the_margin() -> None:
    from types import SimpleNamespace

    from sweep.workloads.rnnt.config import RNNTWorkloadConfig

    top = SimpleNamespace(global_batch_size=64, max_in_flight=1)
    trial = checked(top, MachineConfig(device="cuda"), TrialConfig(), SearchConfig(), RNNTWorkloadConfig())
    assert trial.memory_margin == 0.05  # MEMORY_MARGIN["cuda"]
    with pytest.raises(ValueError, match=r"^machine\.nodes=0 .*positive integer$"):
        checked(top, MachineConfig(nodes=0), TrialConfig(measure_steps=0), SearchConfig(), RNNTWorkloadConfig(vocab=0))
    with pytest.raises(ValueError, match=r"^workload\.vocab=0 is not valid"):
        checked(top, MachineConfig(), TrialConfig(), SearchConfig(), RNNTWorkloadConfig(vocab=0))
    with pytest.raises(ValueError, match="machine.num_devices=4 is not divisible by machine.nodes=3"):
        checked(top, MachineConfig(num_devices=4, nodes=3), TrialConfig(), SearchConfig(), RNNTWorkloadConfig())


def test_the_settings_and_the_plan_hold_frozen_specs(tmp_path: Path) -> None:
    from support.plans import plan

    made = plan(["+machine=cpu2", "trial.measure_steps=6"], tmp_path / "run")
    assert type(made.machine) is MachineConfig and type(made.trial) is TrialConfig  # the frozen schemas, not Hydra's twins
    assert made.trial.measure_steps == 6 and made.trial.memory_margin == 0.1 and made.machine.num_devices == 2


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_edge_reads_the_composed_config() -> None:
    """The composed config is OmegaConf's: a module that reads it imports omegaconf or hydra. Past the edge, the plan and
    everything after it take the checked Settings. (launch/backend.py reads hydra-submitit-launcher's queue dataclasses.)"""
    readers = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if _imports(p) & {"omegaconf", "hydra"}}
    assert readers == {"cli/main.py", "cli/config.py", "orchestration/settings.py", "orchestration/sweep_dir.py"}
    launcher_config = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "hydra_plugins" in _imports(p)}
    assert launcher_config == {"launch/backend.py"}


@pytest.mark.e2e
def test_a_single_trial_in_hydras_run_mode_reads_the_same_settings(tmp_path: Path) -> None:
    """`hydra.mode=RUN` (debugging one pair in this process, cli/main._task) goes through the same edge: a bad value is
    the same one line, and a good config runs its first valid pair."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sweep", "hydra.mode=RUN", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    bad = run("machine.num_devices=0")
    assert bad.returncode == 2 and bad.stderr.strip() == "sweep: error: machine.num_devices=0 is not valid: expected a positive integer", bad.stderr
    good = run("accum=2", "split=2", "global_batch_size=8", "trial.measure_steps=6", "trial.max_measure_steps=6")
    assert good.returncode == 0, good.stderr[-2000:]
    record = json.loads(good.stdout[good.stdout.index("{"):])
    assert (record["accum"], record["split"], record["status"]) == (2, 2, "ok")
