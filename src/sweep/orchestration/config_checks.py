"""Checks of a composed config, run once by make_plan (orchestration/plan.py) before anything is made.

Each refusal is one SweepError line naming the value and what would be valid; the typed dataclasses
(core/config.py) say what each key means, these say which values a sweep can run with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from sweep.core.config import MachineConfig, SearchConfig, SweepConfig, TrialConfig
from sweep.core.space import SpaceError, check_positive_int
from sweep.errors import SweepError
from sweep.resources import config_options

DEVICES = ("cpu", "cuda")


def check_no_schema_choice(cfg: Any) -> None:
    """The typed schemas share the config groups with the YAML options (search=search_schema
    composes), but they are not choices: search_schema would silently run a grid."""
    try:
        choices = dict(cfg.hydra.runtime.choices)
    except Exception:  # noqa: BLE001 - hydra.mode=RUN, or a config without Hydra's node: nothing chosen
        return
    for group, choice in choices.items():
        if isinstance(choice, str) and choice.endswith("_schema") and not str(group).startswith("hydra"):
            raise SweepError(f"{group}={choice} is not a valid {group}: it is the typed schema {group} options build on; choose one of {', '.join(config_options(group))}")


def typed(node: Any, schema: type) -> Any:
    """A composed config node as its schema's dataclass (resolving interpolations)."""
    from omegaconf import OmegaConf

    if OmegaConf.get_type(node) is schema:
        return OmegaConf.to_object(node)
    data = OmegaConf.to_container(node, resolve=True)
    assert isinstance(data, dict)
    return schema(**data)


def launcher_node(cfg: Any) -> Any:
    """hydra.launcher: in the Sweeper's config, or (hydra.mode=RUN) from Hydra's global state."""
    if "hydra" in cfg:
        return cfg.hydra.launcher
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().launcher


def plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def positive(name: str, value: Any) -> int:
    try:
        return check_positive_int(name, value)
    except SpaceError as e:
        raise SweepError(str(e)) from None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_launcher_text(value: Any, key: str = "hydra.launcher") -> None:
    """Refuse a control character in any launcher string: submitit writes them into the sbatch
    script line by line, so "gpu\ntouch /tmp/x #" as a partition would be a shell line of its own."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_launcher_text(k, f"{key} key")  # additional_parameters' keys are written as #SBATCH --key
            check_launcher_text(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_launcher_text(v, f"{key}[{i}]")
    elif isinstance(value, str) and _CONTROL.search(value):
        char = _CONTROL.search(value).group()  # type: ignore[union-attr]
        raise SweepError(
            f"{key}={value!r} contains the control character {char!r}: launcher settings are written into the "
            "job script, one per line; give it without newlines, tabs or other control characters"
        )


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (to Python, True is the int 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_machine(machine: MachineConfig) -> None:
    if machine.device not in DEVICES:
        raise SweepError(f"machine.device={machine.device!r} is not valid: expected one of {', '.join(DEVICES)}")
    num, nodes = positive("machine.num_devices", machine.num_devices), positive("machine.nodes", machine.nodes)
    if num % nodes:
        raise SweepError(f"machine.num_devices={num} is not divisible by machine.nodes={nodes}: each node runs the same number of ranks")
    mem = machine.memory_gib
    if not is_number(mem) or not math.isfinite(mem) or mem <= 0:
        raise SweepError(f"machine.memory_gib={mem!r} is not valid: expected a positive number of GiB")
    if machine.cpu_threads is not None:
        positive("machine.cpu_threads", machine.cpu_threads)
    noise = machine.run_to_run_noise
    if noise is not None and (not is_number(noise) or not 0 <= noise < 0.5):  # nan and inf fail the range too
        raise SweepError(
            f"machine.run_to_run_noise={noise!r} is not valid: expected a relative sd in [0, 0.5), e.g. 0.01, or null for the device's default"
        )


def resolved_screen(mode: Any, machine: MachineConfig) -> bool:
    """search.screen resolved: auto screens CUDA sweeps of more than one device; on screens any."""
    from sweep.core.screening import SCREEN_MODES, screens

    # YAML 1.1 reads `screen: on` / `off` (as docs/gpus.md spells them) as booleans, which the str schema makes 'True'/'False'.
    mode = {True: "on", False: "off", "True": "on", "False": "off"}.get(mode, mode) if isinstance(mode, (bool, str)) else mode
    if mode not in SCREEN_MODES:
        raise SweepError(f"search.screen={mode!r} is not valid: expected one of {', '.join(SCREEN_MODES)}")
    if mode == "auto" and machine.device != "cuda":
        return False
    return screens(str(mode), int(machine.num_devices))


def check_known_keys(cfg: Any, workload_schema: type) -> None:
    """Hydra's `+key=value` adds a key even to a typed config, so a typo such as
    `+trial.time_limit=60` would be ignored without a word: refuse keys no schema has."""
    from dataclasses import fields

    levels = [
        ("", cfg, SweepConfig),
        ("machine", cfg.machine, MachineConfig),
        ("trial", cfg.trial, TrialConfig),
        ("search", cfg.search, SearchConfig),
        ("workload", cfg.workload, workload_schema),
    ]
    for prefix, node, schema in levels:
        known = [f.name for f in fields(schema)]
        for key in node.keys():
            if key not in known and not (prefix == "" and key == "hydra"):
                name = f"{prefix}.{key}" if prefix else str(key)
                raise SweepError(f"{name} is not a known key: valid keys{' under ' + prefix if prefix else ''}: {', '.join(known)}")


def check_trial(trial: TrialConfig) -> None:
    from sweep.core.measure import check_trial_settings

    positive("trial.measure_steps", trial.measure_steps)
    try:
        check_trial_settings(trial)  # target_precision in (0, 0.5), max_measure_steps >= measure_steps
    except ValueError as e:
        raise SweepError(str(e)) from None
    warmup = trial.warmup_steps
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise SweepError(f"trial.warmup_steps={warmup!r} is not valid: expected an integer >= 0")
    limit = trial.time_limit_s
    if not is_number(limit) or not math.isfinite(limit) or not limit > 0:  # inf overflowed the executor's minutes
        raise SweepError(f"trial.time_limit_s={limit!r} is not valid: expected a finite positive number of seconds")
    margin = trial.memory_margin
    if not is_number(margin) or not 0 <= margin < 0.5:
        raise SweepError(f"trial.memory_margin={margin!r} is not valid: expected a fraction of device memory in [0, 0.5), e.g. 0.1, or null for the device's default")


def check_stress_step(workload: Any, trial: TrialConfig, arguments: Sequence[str]) -> None:
    """A stress step the user sets (the built-in RNN-T's worst batch, repeated) must be a step some trial runs: past
    the last one (trial.warmup_steps + trial.max_measure_steps - 1), no pair could ever stop ahead of its rivals.
    The default (9: the last step of the default trial) is left alone under other trial settings: past a shorter
    trial's end, its pairs are measured to their own end, which costs steps but misleads no one."""
    step = getattr(workload, "stress_step", None)
    if step is None or not any(a.lstrip("+~").startswith("workload.stress_step=") for a in arguments):
        return
    last = int(trial.warmup_steps) + int(trial.max_measure_steps) - 1
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= last:
        raise SweepError(
            f"workload.stress_step={step!r} is not valid: expected a step in [0, {last}] (trial.warmup_steps={trial.warmup_steps} "
            f"+ trial.max_measure_steps={trial.max_measure_steps} - 1 is every trial's last), e.g. {min(9, last)}"
        )
