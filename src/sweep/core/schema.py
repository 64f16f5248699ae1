"""The one trial-result schema, written by the trial and read by the aggregator.

Each trial's record is a JSON file, `<sweep_dir>/trials/<key>/result.json`, written by
the trial alone. A job that ended without writing one (killed, cancelled, out of host
memory) gets `<sweep_dir>/trials/<key>/ended.json` instead, same schema, written by the
orchestrator alone; readers take result.json first, else ended.json. Both are written
atomically (temp file, fsync, rename) so a reader sees either nothing or the whole record,
even if the writer is killed mid-write: sweep/records.py reads and writes them; this module
is the schema alone (no I/O).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweep.errors import ResultError

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"  # written by the trial only
ENDED_FILE = "ended.json"  # written by the orchestrator only, for a job that died without a result.json


class Status(str, enum.Enum):
    """A trial's status. A str, so JSON, CSV and pandas see the same plain strings as before."""

    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    # The trial ran and printed a figure, but the figure did not measure the pair it is filed under (more
    # ranks than devices, a run that never reached a steady state, a log figure the probe contradicts):
    # core/validity.py. Not a measurement: never the answer, prunes nothing, and the confidence score
    # counts the pair as untried.
    REJECTED = "rejected"
    # Only the sweep table has these: a candidate not (yet) run. `skipped`: the search ended
    # without it (its OOM was implied, or it could not beat the leader).
    PENDING = "pending"
    RUNNING = "running"
    SKIPPED = "skipped"
    # Not launched: the memory model puts its peak above the capacity (core/memory_model.py).
    PREDICTED_OOM = "predicted_oom"
    INVALID = "invalid"

    def __str__(self) -> str:
        return self.value


class OomPhase(str, enum.Enum):
    """Where in the training step an OOM happened."""

    ENCODER = "encoder"
    JOINT = "joint"
    OPTIMIZER = "optimizer"

    def __str__(self) -> str:
        return self.value


# Short names, kept for the modules that import them.
OK, OOM, FAILED, TIMEOUT, CANCELLED = Status.OK, Status.OOM, Status.FAILED, Status.TIMEOUT, Status.CANCELLED
REJECTED = Status.REJECTED
FINISHED_STATUSES = (OK, OOM, FAILED, TIMEOUT, CANCELLED, REJECTED)
PENDING, RUNNING, SKIPPED, INVALID = Status.PENDING, Status.RUNNING, Status.SKIPPED, Status.INVALID
PREDICTED_OOM = Status.PREDICTED_OOM
ALL_STATUSES = FINISHED_STATUSES + (RUNNING, PENDING, SKIPPED, PREDICTED_OOM, INVALID)

PHASE_ENCODER, PHASE_JOINT, PHASE_OPTIMIZER = OomPhase.ENCODER, OomPhase.JOINT, OomPhase.OPTIMIZER
OOM_PHASES = tuple(OomPhase)


@dataclass
class TrialResult:
    """What one trial measured. Field units are in the names where they are not obvious."""

    accum: int  # grad_accumulation_batches
    split: int  # batch_split_factor
    per_device_batch: int  # global_batch_size / (accum * num_devices)
    joint_batch: int  # per_device_batch / split
    global_batch_size: int
    num_devices: int
    status: Status  # one of FINISHED_STATUSES
    oom_phase: OomPhase | None = None  # when status is Status.OOM
    error: str = ""  # one line: why the trial did not finish ok
    warmup_steps: int = 0  # optimizer steps run before timing started
    step_times_s: list[float] = field(default_factory=list)  # each measured optimizer step
    throughput: float | None = None  # samples over wall time across the measured steps (stalls included), in throughput_unit
    throughput_low: float | None = None  # 95% interval of that figure (None: unknown, e.g. one figure)
    throughput_high: float | None = None
    throughput_unit: str = "samples/s"  # what the figure counts: samples/s or tokens/s (issue 12)
    steps_measured: int | None = None  # post-warm-up figures the figure rests on
    peak_mem_gib: float | None = None  # peak device memory (CPU: resident set above the start-up baseline)
    # Built-in workload: what the budget counts at the peak, which headroom counts: on CUDA the
    # allocator's reserved peak (what the card loses), on CPU the address space the emulated cap sees.
    peak_reserved_gib: float | None = None
    capacity_gib: float | None = None  # the device's usable memory the peak is measured against
    headroom: float | None = None  # fraction of capacity left at the peak: 1 - peak / capacity
    tight: bool = False  # ok, but headroom below trial.memory_margin: may OOM in real training
    wall_s: float | None = None  # the trial's whole wall time, start-up included
    log: str = ""  # path of the job's log (stdout/stderr) to read first
    job_id: str = ""
    host: str = ""
    device: str = ""  # "cpu", "cuda", or "command"
    started_at: str = ""  # ISO-8601 UTC
    finished_at: str = ""
    stopped_early: str = ""  # why racing stopped it (it could not beat the leader); empty if it ran its course
    fingerprint: str = ""  # the sweep configuration it measured under (core/fingerprint.py); empty: unknown
    # Issue 29: who measured it and what the probe saw (defaults: records written before the probe).
    measured_by: str = ""  # "probe" (inside the trained process, sweep.probe) or "log" (parsed from its output); "": unknown
    oom_module: str = ""  # module path running at the OOM (e.g. "encoder.lstm", "optimizer:Adam"), when the probe saw it
    # Each step's reserved peak in GiB, warm-up included, in order: CUDA's allocator reserved peak; on CPU
    # the address-space peak (VmPeak, what the emulated budget counts, never reset) or else the resident peak.
    step_peak_reserved_gib: list[float] = field(default_factory=list)
    # Each step's CUDA allocator retries (how far num_alloc_retries rose in it: a cudaMalloc failed, the cache
    # was flushed and the allocation retried), warm-up included, in order, the most over ranks. A retry in a
    # timed step puts an ok pair at risk (core/growth.py). []: not measured (CPU, a log-parsed trial, older records).
    step_alloc_retries: list[int] = field(default_factory=list)
    peak_step: int | None = None  # the step (0: the first, warm-up included) the peak was reached in
    ranks_seen: int | None = None  # processes (ranks) the probe recorded steps from
    # Issue 43: the figure's provenance, which core/validity.py checks before the figure counts.
    world_size: int | None = None  # the ranks' own world size as the probe read it (largest over ranks, every node)
    probe_oom: str = ""  # an out-of-memory error the probe recorded (one line), even one the trainer caught
    backward_per_step: float | None = None  # median backward passes per timed optimizer step (the probe's)
    # Where no torch.optim optimizer exists: the median backward passes between the parameter updates the probe saw
    # (a watched parameter's values changed), the accumulation the trainer really ran.
    backward_per_update: float | None = None
    # Median forward passes of the root modules (gradients on) per timed optimizer step: a loop that averages its
    # micro-batches' losses and runs one backward pass still runs `accum` of them (core/validity.py). None: not counted.
    forward_per_step: float | None = None
    log_throughput: float | None = None  # the log's own figure, in throughput_unit, where the probe gave the figure
    transient_steps: int = 0  # leading timed steps left out as still warming up (core/steady.py), after warmup_steps
    # The probe's figure over every timed step, the transient ones included: the window log_throughput (the log's own
    # figure, over every step it printed) covers, so the two are compared like for like (core/validity.py).
    untrimmed_throughput: float | None = None
    probe_signal: str = ""  # what timed the probe's steps: "optimizer steps" or "backward passes" (no torch.optim step)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # Plain strings (from JSON, parsers, older callers) become the enum members.
        try:
            self.status = Status(self.status)
            self.oom_phase = None if self.oom_phase is None else OomPhase(self.oom_phase)
        except ValueError:
            pass  # from_dict names the bad value; a caller's typo shows in the record as is

    @property
    def key(self) -> str:
        return f"accum{self.accum}_split{self.split}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: the enums as their strings."""
        data = dataclasses.asdict(self)
        data["status"] = str(self.status)
        data["oom_phase"] = None if self.oom_phase is None else str(self.oom_phase)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> TrialResult:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ResultError(
                f"{source}: schema_version={version!r} is not supported "
                f"(this sweep reads version {SCHEMA_VERSION}); rerun that trial or upgrade sweep"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]  # noqa: E501
        if missing:
            raise ResultError(f"{source}: missing field(s) {', '.join(missing)}")
        wrong = _wrong_types(data) or _bad_figures(data)
        if wrong:
            raise ResultError(f"{source}: {wrong}; the file is not a trial's record")
        result = cls(**{k: v for k, v in data.items() if k in names})
        if result.status not in FINISHED_STATUSES:
            raise ResultError(f"{source}: status={result.status!r} is not one of {', '.join(FINISHED_STATUSES)}")
        if result.oom_phase is not None and not isinstance(result.oom_phase, OomPhase):
            raise ResultError(f"{source}: oom_phase={result.oom_phase!r} is not one of {', '.join(OOM_PHASES)}")
        return result


_INT, _NUM, _STR, _BOOL = "an integer", "a number", "a string", "true or false"
# What each field's JSON value must be: (kind, None allowed), read off TrialResult's own
# annotations, so a new field is checked too. A wrong-typed field would otherwise reach the
# ranking (a throughput of "fast") or make a wrong key ("accumtwo_split1").
_KIND_OF_ANNOTATION = {"int": _INT, "float": _NUM, "bool": _BOOL, "str": _STR, "Status": _STR, "OomPhase": _STR}


def _field_kinds() -> dict[str, tuple[str, bool]]:
    kinds = {}
    for f in dataclasses.fields(TrialResult):
        parts = [p.strip() for p in str(f.type).split("|")]
        if parts[0] in _KIND_OF_ANNOTATION:  # the lists (step_times_s, step_peak_reserved_gib, ...) are checked on their own
            kinds[f.name] = (_KIND_OF_ANNOTATION[parts[0]], "None" in parts)
    return kinds


_FIELD_KINDS = _field_kinds()


def _is_kind(value: Any, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == _INT:
        return isinstance(value, int)
    if kind == _NUM:
        return isinstance(value, (int, float))
    return isinstance(value, str)


def _wrong_types(data: dict[str, Any]) -> str:
    """'field=value is not KIND' for the first field of the wrong JSON type, else ''."""
    for name, (kind, nullable) in _FIELD_KINDS.items():
        if name not in data or (nullable and data[name] is None):
            continue
        if not _is_kind(data[name], kind):
            return f"{name}={data[name]!r} is not {kind}"
    for name in ("step_times_s", "step_peak_reserved_gib"):
        values = data.get(name, [])
        if not isinstance(values, list) or not all(_is_kind(v, _NUM) for v in values):
            return f"{name}={values!r} is not a list of numbers"
    retries = data.get("step_alloc_retries", [])
    if not isinstance(retries, list) or not all(_is_kind(v, _INT) and v >= 0 for v in retries):
        return f"step_alloc_retries={retries!r} is not a list of counts"
    return ""


# Figures that only mean something above zero (a throughput of 0 is no measurement; a
# negative one crashed the confidence score), and those that may be 0 but never below.
# Every number must be finite: JSON's Infinity and NaN parse, and "infx the baseline" followed.
_POSITIVE = ("throughput", "throughput_low", "throughput_high", "capacity_gib",
             "accum", "split", "per_device_batch", "joint_batch", "global_batch_size", "num_devices")
_NOT_NEGATIVE = ("peak_mem_gib", "peak_reserved_gib", "wall_s", "warmup_steps", "steps_measured")


def _bad_figure(name: str, value: Any) -> str:
    """'name=value is not ...' for a number out of its field's range, else ''."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    if not math.isfinite(value):
        return f"{name}={value!r} is not a finite number"
    if name in _POSITIVE and value <= 0:
        return f"{name}={value!r} is not above zero"
    if name in _NOT_NEGATIVE and value < 0:
        return f"{name}={value!r} is negative"
    return ""


def _bad_figures(data: dict[str, Any]) -> str:
    """The first number in a record (of the right type) that no measurement can give, else ''."""
    for name, (kind, _) in _FIELD_KINDS.items():
        if kind in (_NUM, _INT) and name in data:
            bad = _bad_figure(name, data[name])
            if bad:
                return bad
    for t in data.get("step_times_s", []):
        if not (math.isfinite(t) and t > 0):
            return f"step_times_s holds {t!r}, not a positive finite time"
    return ""


def check_figures(result: TrialResult) -> TrialResult:
    """Make a record fit to write, in place: no figure a reader would refuse.

    An ok trial whose throughput is not a finite number above zero did not measure
    anything: it becomes failed, saying so. Any other out-of-range figure (a peak of
    inf, a negative wall time) is unknown, None, rather than a number that misleads.
    Raises ResultError for a bad pair or batch (a caller's bug, not a measurement).
    """
    for name, (kind, nullable) in _FIELD_KINDS.items():
        bad = "" if nullable or kind not in (_NUM, _INT) else _bad_figure(name, getattr(result, name))
        if bad:
            raise ResultError(f"cannot write a trial record with {bad}")
    if result.status == Status.OK and _bad_figure("throughput", result.throughput):
        result.status = Status.FAILED
        result.error = (
            f"the log's throughput figure was {result.throughput!r} {result.throughput_unit}, "
            "which is no measurement (not a finite number above zero); see the log"
        )
    for name, (kind, nullable) in _FIELD_KINDS.items():
        if kind in (_NUM, _INT) and nullable and _bad_figure(name, getattr(result, name)):
            setattr(result, name, None)
    result.step_times_s = [t for t in result.step_times_s if math.isfinite(t) and t > 0]
    return result


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def trial_dir(sweep_dir: Path, key: str) -> Path:
    return Path(sweep_dir) / "trials" / key


