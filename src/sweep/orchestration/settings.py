"""The edge: the composed config and the command line, checked once and turned into frozen typed `Settings`.

Everything a user can get wrong in the config is refused here, before a directory is made or a job is launched,
as one SweepError line naming the key, the value and what would be valid. Each value's rule is declared beside
its field (core/config.Rule; the workloads' schemas too); what relates several values, or needs this host, is
checked below. Nothing downstream reads the raw config: the plan (orchestration/plan.py) is built from Settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sweep import workloads
from sweep.core.config import MachineConfig, SearchConfig, SweepConfig, TrialConfig, checked, machine_refusal, resolved_memory_gib
from sweep.core.screening import screens
from sweep.core.space import Candidate, enumerate_candidates
from sweep.errors import SpaceError, SweepError
from sweep.resources import config_options

if TYPE_CHECKING:
    from omegaconf import DictConfig

T = TypeVar("T")
SWEEPABLE = ("accum", "split")
_YAML_SWITCHES = {True: "on", False: "off", "True": "on", "False": "off"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Settings:
    """A sweep's whole configuration, checked: what the plan is made from."""

    global_batch_size: int
    max_in_flight: int  # trials running at once
    machine: MachineConfig
    trial: TrialConfig  # memory_margin resolved to the device's default where unset
    search: SearchConfig  # screen spelled as one of auto, on, off
    screen: bool  # search.screen resolved for this machine: one-rank screening first
    workload_name: str
    workload: Any  # the workload's frozen config, with what only this host knows filled in (Workload.at_edge)
    workload_as_configured: Any  # the same before at_edge: what the fingerprint keeps
    # How trial logs are read, the unit every trial records, how the recommendation is written, whether split applies.
    logs: Mapping[str, Any]
    launcher: Mapping[str, Any]  # hydra.launcher resolved, its task layout checked for this machine
    candidates: tuple[Candidate, ...]  # every (accum, split) pair, valid first
    dry_run: bool
    live: bool | None
    keep_jobs_on_interrupt: bool
    detach: bool  # the search runs in the background (orchestration/detach.py)
    warm_workers: bool
    arguments: tuple[str, ...]  # the multirun overrides as given (sweep.json records them)


def read_settings(cfg: DictConfig, arguments: Sequence[str]) -> Settings:
    """cfg: the composed config (DictConfig) without the sweep overrides; arguments: the command line's overrides."""
    from sweep.launch.backend import check_task_layout
    from sweep.launch.clusters import cluster_for

    swept = swept_knobs(arguments)
    check_no_schema_choice(cfg)
    kind = workloads.get(cfg.workload.get("name"))
    check_known_keys(cfg, kind.schema)
    machine, trial = _typed(cfg.machine, MachineConfig), _typed(cfg.trial, TrialConfig)
    # The machine before the launcher: its layout is derived from the machine (${sweep_div:num_devices,nodes}), so
    # machine.nodes=0 would otherwise surface as a ZeroDivisionError inside that interpolation, not as the key it is.
    _refuse(machine_refusal(machine))
    launcher = _plain_dict(launcher_node(cfg))
    check_launcher_text(launcher)
    # The demo's emulated budget is the built-in workload's alone: a command sweep has none it did not ask for.
    machine = replace(machine, memory_gib=resolved_memory_gib(machine.memory_gib, machine.device, builtin_demo=kind.name == "rnnt"))
    as_configured: object = _typed(cfg.workload, kind.schema)  # the workload's own config dataclass
    search_node = _plain_dict(cfg.search)
    search = SearchConfig(**{**search_node, "screen": screen_word(search_node.get("screen", "auto"))})
    top = SimpleNamespace(global_batch_size=cfg.global_batch_size, max_in_flight=cfg.max_in_flight)
    try:
        trial = checked(top, machine, trial, search, as_configured)  # every value's rule (core/config.py), in one pass
    except ValueError as e:
        raise SweepError(str(e)) from None
    check_nodes_reachable(machine, launcher)
    # One task per device, or one launcher per node for a workload whose own launcher starts the ranks.
    launcher = check_task_layout(launcher, machine.num_devices, machine.nodes, one_launcher_per_node=kind.one_launcher_per_node)
    check_stress_step(as_configured, trial, arguments)
    accum, split = knob_values("accum", swept, _plain(cfg.accum)), knob_values("split", swept, _plain(cfg.split))
    dry_run = bool(cfg.dry_run)
    # What only this host knows (the start directory) goes into the plan; the fingerprint keeps the configured value,
    # so a sweep resumed from another directory is still the same sweep.
    workload = kind.at_edge(as_configured)
    kind.validate(workload, workloads.CheckContext(local_launch=cluster_for(launcher).on_this_host, dry_run=dry_run, device=machine.device,
                                                    nodes=int(machine.nodes or 1)))
    splits_apply = kind.splits_apply(workload)
    if not splits_apply:
        # The script has no batch_split_factor: the space is accum alone.
        if any(v != 1 for v in split or []):
            raise SweepError(
                "split cannot be swept: this workload sets splits_apply=false or its command uses neither {split} nor {joint_batch} "
                "(its script has no batch_split_factor); drop split="
            )
        split = [1]
    try:
        candidates = enumerate_candidates(cfg.global_batch_size, machine.num_devices, accum, split)
    except SpaceError as e:
        raise SweepError(str(e)) from None
    return Settings(
        global_batch_size=int(cfg.global_batch_size),
        max_in_flight=int(cfg.max_in_flight),
        machine=machine,
        trial=trial,
        search=search,
        # auto screens CUDA sweeps only: CPU ranks would share the host's cores.
        screen=screens(search.screen, machine.num_devices) and (search.screen == "on" or machine.device == "cuda"),
        workload_name=kind.name,
        workload=workload,
        workload_as_configured=as_configured,
        logs=log_reading(workload, splits_apply),
        launcher=launcher,
        candidates=tuple(candidates),
        dry_run=dry_run,
        live=cfg.live,
        keep_jobs_on_interrupt=bool(cfg.keep_jobs_on_interrupt),
        detach=_detach(bool(cfg.detach), launcher),
        warm_workers=bool(cfg.warm_workers),
        arguments=tuple(arguments),
    )


def _detach(detach: bool, launcher: Mapping[str, Any]) -> bool:
    """detach=true where the search can run on without the terminal: on this host (a process of its own session).
    A Slurm sweep's search cannot be submitted as a job of its own yet: one line saying what to do instead."""
    from sweep.launch.clusters import cluster_for

    if detach and not cluster_for(dict(launcher)).on_this_host:
        raise SweepError(
            "detach=true is not supported with hydra/launcher=submitit_slurm yet: the search would run on this login node; "
            "run `python -m sweep ...` inside an sbatch job (CPU only, a long --time) or tmux, and watch it with python -m sweep.status DIR"
        )
    return detach


def check_nodes_reachable(machine: MachineConfig, launcher: Mapping[str, Any]) -> None:
    """A trial over several nodes needs a launcher that reaches them: the local one runs every task on this host, where
    submitit's local executor fails at the first trial (its own traceback), so it is refused here, dry run included."""
    from sweep.launch.clusters import cluster_for

    if machine.nodes > 1 and not cluster_for(dict(launcher)).spans_nodes:
        raise SweepError(
            f"machine.nodes={machine.nodes} is not valid with the local launcher (hydra/launcher=submitit_local runs every "
            f"trial on this one host): run it on Slurm with hydra/launcher=submitit_slurm, or set machine.nodes=1"
        )


def log_reading(workload: Any, splits_apply: bool) -> dict[str, Any]:
    """How trial logs are read, the unit every trial records, and how the recommendation is written (SweepMeta's)."""
    from sweep.parsers import parser_settings
    from sweep.parsers.presets import flags_template
    from sweep.parsers.throughput import SAMPLES_PER_S, BatchContext, output_unit

    if not hasattr(workload, "parser"):  # the built-in workload times its own steps: samples/s
        return {"splits_apply": splits_apply}
    settings = parser_settings(workload.parser)  # validated already by the workload
    figure = settings.prefer[0] if settings.prefer else settings.parser_spec.get("unit", SAMPLES_PER_S)
    unit = output_unit(figure, BatchContext(tokens_per_sample=settings.tokens_per_sample), settings.throughput_unit)
    argv, env = list(getattr(workload, "argv", None) or []), dict(getattr(workload, "env", None) or {})
    return {"parser": settings.type, "throughput_unit": unit, "splits_apply": splits_apply,
            "flags_template": flags_template(settings.type, argv, env)}


def screen_word(value: Any) -> Any:
    """search.screen as the word it was written as: YAML 1.1 reads `screen: on` / `off` (as docs/gpus.md spells
    them) as booleans, which the str schema then holds as 'True' / 'False'."""
    return _YAML_SWITCHES.get(value, value) if isinstance(value, (bool, str)) else value


def _refuse(why: str | None) -> None:
    if why:
        raise SweepError(why)


def _typed(node: Any, schema: type[T]) -> T:
    """A composed node (Hydra composes a mutable twin, cli/config.hydra_schema) as its frozen schema's instance."""
    return schema(**_plain_dict(node))


def _plain_dict(node: Any) -> dict[str, Any]:
    """A composed mapping node as a plain dict, its interpolations resolved; its keys are the YAML's, strings."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(node, resolve=True)
    assert isinstance(data, dict)
    return cast("dict[str, Any]", data)


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def swept_knobs(arguments: Sequence[str]) -> dict[str, list[Any]]:
    """The swept knobs (`accum=1,2,4`), by name. Hydra has already applied the fixed overrides to the config;
    the sweep overrides it leaves to the Sweeper, and only accum and split may be swept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept: dict[str, list[Any]] = {}
    given: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        if key in given and key in SWEEPABLE:
            # Hydra would let the later one win (or sweep the earlier): the user meant one of them.
            raise SweepError(f"{key} is given twice ({given[key]!r} and {override.input_line!r}): give it once, e.g. {key}=1,2,4")
        given[key] = override.input_line or key
        if not override.is_sweep_override():
            continue
        if key not in SWEEPABLE:
            raise SweepError(
                f"{override.input_line!r}: only accum and split can be swept "
                f"(e.g. accum=1,2,4 split=1,2,4); give {key} a single value"
            )
        swept[key] = list(override.sweep_iterator())
    return swept


def knob_values(name: str, swept: Mapping[str, list[Any]], configured: Any) -> list[Any] | None:
    """Values for one knob: the multirun list, else the config (int or list), else None = derive."""
    if name in swept:
        return swept[name]
    if configured is None:
        return None
    if isinstance(configured, (list, tuple)):
        return list(configured)
    return [configured]


def check_no_schema_choice(cfg: DictConfig) -> None:
    """The typed schemas share the config groups with the YAML options (search=search_schema
    composes), but they are not choices: search_schema would silently run a grid."""
    try:
        choices = dict(cfg.hydra.runtime.choices)
    except Exception:  # noqa: BLE001 - hydra.mode=RUN, or a config without Hydra's node: nothing chosen
        return
    for group, choice in choices.items():
        if isinstance(choice, str) and choice.endswith("_schema") and not str(group).startswith("hydra"):
            raise SweepError(f"{group}={choice} is not a valid {group}: it is the typed schema {group} options build on; choose one of {', '.join(config_options(group))}")


def launcher_node(cfg: DictConfig) -> DictConfig:
    """hydra.launcher: in the Sweeper's config, or (hydra.mode=RUN) from Hydra's global state."""
    if "hydra" in cfg:
        return cfg.hydra.launcher
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().launcher


def check_launcher_text(value: object, key: str = "hydra.launcher") -> None:
    """Refuse a control character in any launcher string: submitit writes them into the sbatch
    script line by line, so "gpu\ntouch /tmp/x #" as a partition would be a shell line of its own."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_launcher_text(k, f"{key} key")  # additional_parameters' keys are written as #SBATCH --key
            check_launcher_text(v, f"{key}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_launcher_text(v, f"{key}[{i}]")
    elif isinstance(value, str) and (char := _CONTROL.search(value)):
        raise SweepError(
            f"{key}={value!r} contains the control character {char.group()!r}: launcher settings are written into the "
            "job script, one per line; give it without newlines, tabs or other control characters"
        )


def check_known_keys(cfg: DictConfig, workload_schema: type) -> None:
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


def check_stress_step(workload: object, trial: TrialConfig, arguments: Sequence[str]) -> None:
    """A stress step the user sets (the built-in RNN-T's worst batch, repeated) must be a step some trial runs: past
    the last one (trial.warmup_steps + trial.max_measure_steps - 1), no pair could ever stop ahead of its rivals.
    The default (9: the last step of the default trial) is left alone under other trial settings: past a shorter
    trial's end, its pairs are measured to their own end, which costs steps but misleads no one."""
    step = getattr(workload, "stress_step", None)
    if step is None or not any(a.lstrip("+~").startswith("workload.stress_step=") for a in arguments):
        return
    last = trial.warmup_steps + trial.max_measure_steps - 1
    if step > last:
        raise SweepError(
            f"workload.stress_step={step!r} is not valid: expected a step in [0, {last}] (trial.warmup_steps={trial.warmup_steps} "
            f"+ trial.max_measure_steps={trial.max_measure_steps} - 1 is every trial's last), e.g. {min(9, last)}"
        )
