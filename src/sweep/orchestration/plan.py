"""Turn a composed config plus the multirun overrides into a checked sweep plan.

Everything a user can get wrong is checked here (the config's values by
orchestration/config_checks.py), before a directory is made or a job is launched,
and reported as one SweepError line naming the value and what would be valid.
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sweep import workloads
from sweep.core.config import MachineConfig, TrialConfig, memory_margin
from sweep.core.fingerprint import differences, fingerprint, fingerprint_values, restoring_overrides
from sweep.core.ranking import SweepMeta
from sweep.core.schema import now_iso
from sweep.core.space import Candidate, SpaceError, enumerate_candidates
from sweep.core.spec import TrialSpec
from sweep.errors import SweepError
from sweep.orchestration.config_checks import (
    check_known_keys,
    check_launcher_text,
    check_machine,
    check_no_schema_choice,
    check_stress_step,
    check_trial,
    launcher_node,
    plain,
    positive,
    resolved_screen,
    typed,
)

SWEEPABLE = ("accum", "split")


@dataclass
class SweepPlan:
    meta: SweepMeta
    candidates: list[Candidate]
    sweep_dir: Path
    search: str
    max_trials: int | None
    max_in_flight: int
    time_limit_s: float
    machine: MachineConfig
    workload: Any  # the workload's own config dataclass
    trial: TrialConfig
    launcher: dict[str, Any]  # hydra.launcher, resolved
    dry_run: bool = False
    live: bool | None = None
    keep_jobs_on_interrupt: bool = False
    warm_workers: bool = True  # warm_workers: built-in one-device local trials run in warm workers (launch/warm_pool.py)
    trust_memory_model: bool = True  # search.trust_memory_model: skip pairs the memory model predicts to OOM
    racing: bool = True  # search.racing: stop running trials that cannot beat the leader
    drift_check: bool = True  # search.drift_check: re-time the leader and runner-up at the end (orchestration/retime.py)
    measure_to_decision: bool = True  # search.measure_to_decision: stop trials once they cannot change the answer
    screen: bool = False  # search.screen resolved: one-rank screening first, then full trials (orchestration/screening.py)
    # A screening sweep cancels a trial the throughput ordering rules out before its first timed step
    # (core/decision.cancel_reason), as the strategy would not have launched it; never for the grid.
    cancel_outranked: bool = False
    # A screening sweep's rows only nominate pairs for full trials: never the answer, so a provisional one is
    # never run again in full (orchestration/remeasure.py).
    nominates_only: bool = False
    overrides: list[str] = field(default_factory=list)
    # What a trial's measurement depends on (core/fingerprint.py), and its digest.
    fingerprint_values: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""
    started_at: str = field(default_factory=now_iso)  # when the sweep in this dir first started (a resume keeps it)

    def spec(self, cand: Candidate, trial_dir: Path) -> TrialSpec:
        """Everything one trial job needs (it is pickled into the job)."""
        return TrialSpec(
            accum=cand.accum,
            split=cand.split,
            per_device_batch=cand.per_device_batch,
            joint_batch=cand.joint_batch,
            global_batch_size=self.meta.global_batch_size,
            num_devices=self.meta.num_devices,
            machine=self.machine,
            workload=self.workload,
            trial=self.trial,
            trial_dir=str(trial_dir),
            fingerprint=self.fingerprint,
        )


def _throughput_meta(workload: Any, splits_apply: bool) -> dict[str, Any]:
    """How trial logs are read, the unit every trial records, and how the recommendation is written."""
    from sweep.parsers import parser_settings
    from sweep.parsers.presets import flags_template
    from sweep.parsers.throughput import SAMPLES_PER_S, BatchContext, output_unit

    if not hasattr(workload, "parser"):  # the built-in workload times its own steps: samples/s
        return {"splits_apply": splits_apply}
    settings = parser_settings(plain(workload.parser))  # validated already by the workload
    figure = settings.prefer[0] if settings.prefer else settings.parser_spec.get("unit", SAMPLES_PER_S)
    unit = output_unit(figure, BatchContext(tokens_per_sample=settings.tokens_per_sample), settings.throughput_unit)
    argv = list(plain(getattr(workload, "argv", None)) or [])
    return {"parser": settings.type, "throughput_unit": unit, "splits_apply": splits_apply, "flags_template": flags_template(settings.type, argv)}


def split_overrides(arguments: Sequence[str]) -> tuple[dict[str, list[Any]], list[str]]:
    """Separate the swept knobs (`accum=1,2,4`) from the fixed overrides.

    Hydra has already applied the fixed overrides to the config; the sweep overrides
    it leaves to the Sweeper, and only accum and split may be swept.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept: dict[str, list[Any]] = {}
    fixed: list[str] = []
    given: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        if key in given and key in SWEEPABLE:
            # Hydra would let the later one win (or sweep the earlier): the user meant one of them.
            raise SweepError(f"{key} is given twice ({given[key]!r} and {override.input_line!r}): give it once, e.g. {key}=1,2,4")
        given[key] = override.input_line or key
        if not override.is_sweep_override():
            fixed.append(override.input_line or "")
            continue
        key = override.get_key_element()
        if key not in SWEEPABLE:
            raise SweepError(
                f"{override.input_line!r}: only accum and split can be swept "
                f"(e.g. accum=1,2,4 split=1,2,4); give {key} a single value"
            )
        swept[key] = list(override.sweep_iterator())
    return swept, fixed


def knob_values(name: str, swept: Mapping[str, list[Any]], configured: Any) -> list[Any] | None:
    """Values for one knob: the multirun list, else the config (int or list), else None = derive."""
    if name in swept:
        return swept[name]
    if configured is None:
        return None
    if isinstance(configured, (list, tuple)):
        return list(configured)
    return [configured]


def make_plan(cfg: Any, arguments: Sequence[str], sweep_dir: Path) -> SweepPlan:
    """cfg: the composed config (DictConfig) without the sweep overrides."""
    from omegaconf import OmegaConf

    from sweep.launch.backend import check_task_layout, cluster_of

    swept, fixed = split_overrides(arguments)
    check_no_schema_choice(cfg)
    launcher = OmegaConf.to_container(launcher_node(cfg), resolve=True)
    assert isinstance(launcher, dict)
    check_launcher_text(launcher)
    workload_kind = workloads.get(cfg.workload.get("name"))
    check_known_keys(cfg, workload_kind.schema)
    # Typed from here on: the composed nodes become their schemas' dataclasses.
    machine = typed(cfg.machine, MachineConfig)
    trial = typed(cfg.trial, TrialConfig)
    as_configured = typed(cfg.workload, workload_kind.schema)
    # What only this host knows (the start directory) goes into the plan; the fingerprint keeps the
    # configured value, so a sweep resumed from another directory is still the same sweep.
    workload = workload_kind.at_edge(as_configured)

    check_machine(machine)
    # One task per device, or one launcher per node for a workload whose own launcher starts the ranks.
    launcher = check_task_layout(launcher, machine.num_devices, machine.nodes, one_launcher_per_node=workload_kind.one_launcher_per_node)
    # Resolved before the fingerprint, so that a sweep records (and a rerun compares) the margin it used.
    trial = replace(trial, memory_margin=memory_margin(trial, machine))
    check_trial(trial)
    check_stress_step(workload, trial, arguments)
    context = workloads.CheckContext(local_launch=cluster_of(launcher) == "local", dry_run=bool(cfg.dry_run), device=str(machine.device))
    workload_kind.validate(workload, context)
    if not workload_kind.splits_apply(workload):
        # The script has no batch_split_factor: the space is accum alone.
        if any(v != 1 for v in swept.get("split", [])) or plain(cfg.split) not in (None, 1, [1]):
            raise SweepError(
                "split cannot be swept: this workload sets splits_apply=false or its command uses neither {split} nor {joint_batch} "
                "(its script has no batch_split_factor); drop split="
            )
        swept["split"] = [1]
    max_in_flight = positive("max_in_flight", cfg.max_in_flight)
    search = str(cfg.search.name)
    max_trials = None if cfg.search.max_trials is None else positive("search.max_trials", cfg.search.max_trials)

    try:
        candidates = enumerate_candidates(
            cfg.global_batch_size,
            machine.num_devices,
            knob_values("accum", swept, plain(cfg.accum)),
            knob_values("split", swept, plain(cfg.split)),
        )
    except SpaceError as e:
        raise SweepError(str(e)) from None

    # Checked here so that a typo in search= fails before anything is written.
    from sweep.core.strategies import make_strategy

    trust_memory_model = bool(cfg.search.get("trust_memory_model", True))
    try:
        make_strategy(search, candidates, max_trials, capacity_gib=machine.memory_gib, trust_memory_model=trust_memory_model)
    except ValueError as e:
        raise SweepError(str(e)) from None

    values = fingerprint_values(
        machine=asdict(machine),
        workload=asdict(as_configured),
        trial=asdict(trial),
        global_batch_size=int(cfg.global_batch_size),
        num_devices=int(machine.num_devices),
        launcher=launcher,
    )
    stored = check_same_settings(sweep_dir, values)
    meta = SweepMeta(
        sweep_id=str(stored.get("sweep_id") or new_sweep_id(sweep_dir)),
        machine=str(machine.name),
        workload=str(workload_kind.name),
        global_batch_size=int(cfg.global_batch_size),
        num_devices=int(machine.num_devices),
        **_throughput_meta(workload, workload_kind.splits_apply(workload)),
    )
    return SweepPlan(
        meta=meta,
        candidates=candidates,
        sweep_dir=sweep_dir,
        search=search,
        max_trials=max_trials,
        max_in_flight=max_in_flight,
        time_limit_s=float(trial.time_limit_s),
        machine=machine,
        workload=workload,
        trial=trial,
        launcher=launcher,
        dry_run=bool(cfg.dry_run),
        live=cfg.live,
        keep_jobs_on_interrupt=bool(cfg.keep_jobs_on_interrupt),
        warm_workers=bool(cfg.get("warm_workers", True)),
        trust_memory_model=trust_memory_model,
        racing=bool(cfg.search.get("racing", True)),
        drift_check=bool(cfg.search.get("drift_check", True)),
        measure_to_decision=bool(cfg.search.get("measure_to_decision", True)),
        screen=resolved_screen(cfg.search.get("screen", "auto"), machine),
        overrides=list(arguments),
        fingerprint_values=values,
        fingerprint=fingerprint(values),
        started_at=str(stored.get("started_at") or now_iso()),
    )


META_FILE = "sweep.json"


def stored_meta(sweep_dir: Path) -> dict[str, Any]:
    """An existing sweep dir's sweep.json, or {} where there is none (or it cannot be read)."""
    try:
        meta = json.loads((sweep_dir / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def sweep_record(
    plan: SweepPlan, *, state: str, launcher: str, argv: Sequence[str], orchestrator_cpu_s: float, startup_cpu_s: float, wall_s: float
) -> dict[str, Any]:
    """What sweep.json holds: the sweep's identity and settings, its state, and what resume replays."""
    meta = plan.meta
    return {
        "schema_version": 1,
        "sweep_id": meta.sweep_id,
        "machine": meta.machine,
        "workload": meta.workload,
        "global_batch_size": meta.global_batch_size,
        "num_devices": meta.num_devices,
        "parser": meta.parser,
        "throughput_unit": meta.throughput_unit,
        "splits_apply": meta.splits_apply,
        "search": plan.search,
        "launcher": launcher,
        "started_at": plan.started_at,
        "finished_at": now_iso() if state != "running" else None,
        "state": state,
        # The orchestrator's own work while the sweep ran (its process's CPU time, trials excluded) against
        # the sweep's wall time; start-up (imports, Hydra's composition, the plan) is counted apart.
        "orchestrator_cpu_s": round(orchestrator_cpu_s, 3),
        "startup_cpu_s": round(startup_cpu_s, 3),
        "wall_s": round(wall_s, 3),
        # What every trial's measurement depends on: a rerun with other values is refused.
        "fingerprint": plan.fingerprint,
        "fingerprint_values": plan.fingerprint_values,
        "command": "python -m sweep " + " ".join(shlex.quote(a) for a in argv),
        # What `resume=DIR` replays: the whole command line, hydra.* overrides included.
        "argv": list(argv),
    }


def check_same_settings(sweep_dir: Path, values: dict[str, Any]) -> dict[str, Any]:
    """A rerun or resume into a dir made with other settings is refused: its finished trials
    measured something else, and reusing them would relabel their figures. The stored meta."""
    stored = stored_meta(sweep_dir)
    old = stored.get("fingerprint_values")
    if isinstance(old, dict) and fingerprint(old) != fingerprint(values):
        # The headline values first: a profile change names num_devices before its launcher's shape.
        order = ("global_batch_size", "num_devices", "machine", "workload", "trial", "launcher")
        changed = sorted(differences(old, values), key=lambda d: next((i for i, k in enumerate(order) if d.startswith(k)), len(order)))
        shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
        # Its own values spelled out, since a default may have changed since it ran (then its stored
        # command alone no longer gives them back). Run with the dir's own command, every difference is
        # a changed default, so all of them are; with other arguments, only a few (beyond that the
        # user changed the sweep on purpose, and resume=DIR alone gives the dir's own command back).
        same_command = _command_of(stored.get("argv")) == _command_of(sys.argv[1:])
        restore = restoring_overrides(old, values, most=None if same_command else 3) or []
        raise SweepError(
            f"{sweep_dir} holds a sweep with other settings ({shown}): its results do not apply; "
            f"choose a new hydra.sweep.dir (or run with that dir's own settings: {shlex.join(['python', '-m', 'sweep', f'resume={sweep_dir}', *restore])})"
        )
    return stored


def _command_of(argv: Any) -> list[str] | None:
    """A command line without where it writes (hydra.sweep.dir=, resume=): what it sweeps, and how."""
    if not isinstance(argv, list):
        return None
    return [str(a) for a in argv if not str(a).startswith(("hydra.sweep.dir=", "resume="))]


def new_sweep_id(sweep_dir: Path) -> str:
    """Unique across hosts and dirs of the same name (two hosts' outputs/run1 are two sweeps)."""
    return f"{sweep_dir.name}-{uuid.uuid4().hex[:8]}"
