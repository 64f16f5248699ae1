"""A sweep's plan: its checked settings (orchestration/settings.py) in its sweep dir.

The settings were checked at the edge; what is checked here is the dir: a sweep there before
must have measured under the same settings, or its trials do not apply.
"""

from __future__ import annotations

import json
import shlex
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sweep.core.config import MachineConfig, TrialConfig
from sweep.core.fingerprint import differences, fingerprint, fingerprint_values, restoring_overrides
from sweep.core.ranking import SweepMeta
from sweep.core.schema import now_iso
from sweep.core.space import Candidate
from sweep.core.spec import TrialSpec
from sweep.errors import SweepError
from sweep.orchestration.settings import Settings


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
    detach: bool = False  # detach=true: the search runs in the background (orchestration/detach.py)
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


def make_plan(settings: Settings, sweep_dir: Path) -> SweepPlan:
    """The plan of a sweep with these (checked) settings in sweep_dir: an earlier sweep there must have had the same."""
    machine, trial, workload = settings.machine, settings.trial, settings.workload
    values = fingerprint_values(
        machine=asdict(machine),
        workload=asdict(settings.workload_as_configured),
        trial=asdict(trial),
        global_batch_size=settings.global_batch_size,
        num_devices=machine.num_devices,
        launcher=dict(settings.launcher),
    )
    digest = fingerprint(values)
    stored = check_same_settings(sweep_dir, values, digest)
    meta = SweepMeta(
        sweep_id=str(stored.get("sweep_id") or new_sweep_id(sweep_dir)),
        machine=machine.name,
        workload=settings.workload_name,
        global_batch_size=settings.global_batch_size,
        num_devices=machine.num_devices,
        **settings.logs,
    )
    search = settings.search
    return SweepPlan(
        meta=meta,
        candidates=list(settings.candidates),
        sweep_dir=sweep_dir,
        search=search.name,
        max_trials=search.max_trials,
        max_in_flight=settings.max_in_flight,
        time_limit_s=float(trial.time_limit_s),
        machine=machine,
        workload=workload,
        trial=trial,
        launcher=dict(settings.launcher),
        dry_run=settings.dry_run,
        live=settings.live,
        keep_jobs_on_interrupt=settings.keep_jobs_on_interrupt,
        detach=settings.detach,
        warm_workers=settings.warm_workers,
        trust_memory_model=search.trust_memory_model,
        racing=search.racing,
        drift_check=search.drift_check,
        measure_to_decision=search.measure_to_decision,
        screen=settings.screen,
        overrides=list(settings.arguments),
        fingerprint_values=values,
        fingerprint=digest,
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


def check_same_settings(sweep_dir: Path, values: dict[str, Any], digest: str | None = None) -> dict[str, Any]:
    """A rerun or resume into a dir made with other settings is refused: its finished trials
    measured something else, and reusing them would relabel their figures. The stored meta.
    digest: fingerprint(values), where the caller has it already."""
    stored = stored_meta(sweep_dir)
    old = stored.get("fingerprint_values")
    if isinstance(old, dict) and fingerprint(old) != (digest or fingerprint(values)):
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


def _command_of(argv: object) -> list[str] | None:
    """A command line without where it writes (hydra.sweep.dir=, resume=): what it sweeps, and how."""
    if not isinstance(argv, list):
        return None
    return [str(a) for a in argv if not str(a).startswith(("hydra.sweep.dir=", "resume="))]


def new_sweep_id(sweep_dir: Path) -> str:
    """Unique across hosts and dirs of the same name (two hosts' outputs/run1 are two sweeps)."""
    return f"{sweep_dir.name}-{uuid.uuid4().hex[:8]}"
