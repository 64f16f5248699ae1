"""What the probe measured, summarised over a trial's processes (pure: parsed records in, report out).

The probe (sweep/probe/boot/_sweep_probe.py) writes one JSON-lines file per process; sweep.probe.read_probe
reads them and calls parse_records and summarise here. A trial's step time is its slowest rank's: the
step is over when every rank is. Memory figures are the largest any rank reached.

Only training counts (issue 50): core/training_window.py leaves out the steps that are not the training's
(ProbeReport.left_out says which and why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sweep.core.schema import PHASE_ENCODER, PHASE_JOINT, PHASE_OPTIMIZER, OomPhase
from sweep.core.training_window import training_sources, training_steps

Record = Mapping[str, Any]

# Matched against each component of a module path (`encoder.layers.0`: "encoder", "layers", "0"),
# deepest first; the first component any pattern matches gives the phase. Defaults: RNN-T's networks
# (the built-in's encoder_pre/encoder/embed/pred_rnn/joint_enc/joint_pred/joint_out, Myrtle's
# encoder/prediction/joint_net, NeMo's joint). The probe names an optimizer step "optimizer:<class>".
DEFAULT_MODULE_PHASE_PATTERNS: dict[str, tuple[str, ...]] = {
    PHASE_OPTIMIZER: (r"^optimizer:",),
    PHASE_JOINT: (r"^(?:joint|joiner)(?:_\w*|\d*)$",),
    PHASE_ENCODER: (r"^(?:enc|encoder|encoders|pred|prediction|predictor|embed)(?:_\w*|\d*)$",),
}


@dataclass(frozen=True)
class ProbeStep:
    """One optimizer step, over the ranks that recorded it."""

    index: int  # the step's number, from 0 (warm-up included)
    seconds: float  # the slowest rank's
    peak_bytes: int | None  # largest per-rank peak: CUDA max allocated, else CPU resident (VmHWM)
    peak_reserved_bytes: int | None  # CUDA max reserved, else CPU address-space peak (VmPeak; never reset)
    resident_peak_bytes: int | None  # CPU resident peak (on CUDA runs too: the host side)
    retries: int | None  # CUDA allocator retries (cudaMalloc failed, cache flushed) in this step, most over ranks
    ranks: int  # how many ranks recorded it
    optimizers: int  # optimizer steps in it on the slowest rank (several optimizers: one step)
    skipped: int  # of those, how many AMP's GradScaler skipped (inf/nan gradients)
    backwards: int | None = None  # backward passes in it on the slowest rank; None: a probe that did not count them
    forwards: int | None = None  # root modules' forward passes (gradients on) in it; None: not counted (torch.compile)
    lr: float | None = None  # the first optimizer's learning rate at it (a plain number only)


@dataclass(frozen=True)
class ProbeOom:
    """The first out-of-memory error the probe saw, on any rank."""

    module: str  # path of the module running (or just finished), e.g. `encoder.lstm`; "optimizer:Adam" in a step
    where: str  # forward, backward or optimizer
    message: str
    rank: int
    step: int  # the step it happened in (0: the first)
    inside: bool  # True: that module was running; False: it had just finished (an op between modules)
    # How the module was known: "hooks" (tracked live, the first step), "frames" (the failing call's Python
    # frames), "autograd node" (the module owning the parameter nearest the failing backward node); "": none
    via: str = ""


@dataclass(frozen=True)
class ProbeReport:
    """A trial's probe records, summarised."""

    ranks: list[int]  # ranks that stepped an optimizer
    steps: list[ProbeStep]  # by index, warm-up included
    step_times_s: list[float]  # each step's seconds (slowest rank), in order
    peak_bytes: int | None  # largest step peak_bytes
    peak_reserved_bytes: int | None  # largest step peak_reserved_bytes
    peak_step: int | None  # the step peak_bytes was reached in
    oom: ProbeOom | None
    device: str  # "cuda" or "cpu" (what the steps ran on); "" when no step was recorded
    armed: bool  # some process imported torch and the probe armed there
    problems: list[str] = field(default_factory=list)  # why part of the measurement is missing
    world_size: int | None = None  # the largest world size a process that stepped or backpropagated reported
    # Each process's backward passes: source -> (rank, [perf_counter at each return]), for trainers whose
    # parameter update is no torch.optim step (backward_step_times) and for counting micro-batches.
    backward_ats: dict[str, tuple[int, list[float]]] = field(default_factory=dict)
    torch_optimizers: bool = False  # some process made a torch.optim optimizer: its steps time the training
    # Where no torch.optim optimizer exists: each process's backward passes at which the watched parameter had changed
    # since the one before (an update ran between them): source -> their indices (backward_per_update).
    update_backwards: dict[str, list[int]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # steps that are not the training's, and why (module docstring)

    @property
    def step_retries(self) -> list[int]:
        """Each step's CUDA allocator retries, in step order (TrialResult.step_alloc_retries); [] when no step
        has a count (CPU). A step without one counts 0, as does a negative one: the trainer reset the allocator's
        accumulated counts in that step (reset_accumulated_memory_stats), so what it retried there is unknown."""
        if all(s.retries is None for s in self.steps):
            return []
        return [max(0, s.retries or 0) for s in self.steps]


def parse_records(text: str, source: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The records in one file's text, and a problem line per line that is not a record.

    A cut-off last line (the process was killed mid-write) is dropped with a problem noted."""
    records, problems = [], []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            last = number == len(lines) or (number == len(lines) - 1 and not lines[-1])
            problems.append(f"{source}: line {number} " + ("cut off (the process ended mid-write)" if last else "is not JSON"))
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str):
            records.append(record)
        else:
            problems.append(f"{source}: line {number} is not a probe record")
    return records, problems


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _most(values: Sequence[Any]) -> int | None:
    present = [int(v) for v in values if _number(v) is not None]
    return max(present) if present else None


def summarise(records_by_source: Mapping[str, Sequence[Record]], problems: Sequence[str] = (), running: bool = False) -> ProbeReport:
    """One report from each process's records (source: its file name, for messages). running: the command is still
    running, so a process that stepped and has since exited is not its training (training_sources)."""
    per_step: dict[int, list[Record]] = {}
    ranks: set[int] = set()
    armed = False
    all_problems = list(problems)
    ooms: list[tuple[float, Record]] = []
    world_sizes: dict[str, int] = {}
    backward_ats: dict[str, tuple[int, list[float]]] = {}
    update_backwards: dict[str, list[int]] = {}
    stepped: dict[str, dict[int, Record]] = {}
    made_after: dict[str, list[int]] = {}  # source -> steps closed before each torch.optim optimizer it made
    exited: set[str] = set()
    for source, records in sorted(records_by_source.items()):
        seen: dict[int, Record] = {}
        ats: list[float] = []
        for record in records:
            kind = record.get("kind")
            if kind == "backward":
                at = _number(record.get("at"))
                if at is not None:
                    ats.append(at)
            elif kind == "backwards":  # a batch of them (the probe writes them so since issue 50)
                ats.extend(a for a in (_number(x) for x in record.get("ats") or ()) if a is not None)
            elif kind == "update":
                if isinstance(record.get("backward"), int):
                    update_backwards.setdefault(source, []).append(int(record["backward"]))
            elif kind == "optimizer":
                after = record.get("after_step")
                made_after.setdefault(source, []).append(int(after) if isinstance(after, int) else 0)
            elif kind == "start":
                armed = True
                if isinstance(record.get("world_size"), int):
                    world_sizes[source] = int(record["world_size"])
            elif kind == "exit":
                exited.add(source)
            elif kind == "problem":
                all_problems.append(f"{source}: {record.get('message', '')}")
            elif kind == "oom":
                ooms.append((_number(record.get("t")) or 0.0, record))
            elif kind == "step":
                index, seconds = record.get("step"), _number(record.get("seconds"))
                if not isinstance(index, int) or seconds is None:
                    all_problems.append(f"{source}: a step record without step/seconds")
                    continue
                seen[index] = record  # a step written twice (a re-armed process): the last one counts
        if seen:
            stepped[source] = seen
        if ats:
            last_rank = next((int(r.get("rank", 0) or 0) for r in reversed(records) if r.get("kind") in ("backward", "backwards")), 0)
            backward_ats[source] = (last_rank, ats)
    left_out: list[str] = []
    training = training_sources(stepped, exited, running)
    for source in sorted(set(stepped) - training):
        left_out.append(f"{source}: {len(stepped[source])} step(s) of a process that ended before the training ran")
    for source in sorted(training):
        for index, record in training_steps(source, stepped[source], made_after.get(source, []), left_out).items():
            per_step.setdefault(index, []).append(record)
            ranks.add(int(record.get("rank", 0)))
    before_training = set(stepped) - training
    torch_optimizers = any(source not in before_training for source in made_after)
    # A launcher (torchrun's agent) arms too and reports the task's world size, but never trains: only the
    # processes that stepped or backpropagated say how many ranks trained.
    trained = training | (set(backward_ats) - before_training)
    stepped_world = [int(r["world_size"]) for rs in per_step.values() for r in rs if isinstance(r.get("world_size"), int)]
    trained_world = stepped_world or [size for source, size in world_sizes.items() if source in trained]
    steps = [_step(index, per_step[index]) for index in sorted(per_step)]
    peaks = [(s.peak_bytes, s.index) for s in steps if s.peak_bytes is not None]
    peak_bytes, peak_step = max(peaks, key=lambda p: (p[0], -p[1])) if peaks else (None, None)
    devices = {str(r.get("device", "")) for rs in per_step.values() for r in rs}
    return ProbeReport(
        ranks=sorted(ranks),
        steps=steps,
        step_times_s=[s.seconds for s in steps],
        peak_bytes=peak_bytes,
        peak_reserved_bytes=_most([s.peak_reserved_bytes for s in steps]),
        peak_step=peak_step,
        oom=_first_oom(ooms),
        device="cuda" if "cuda" in devices else ("cpu" if devices else ""),
        armed=armed,
        problems=all_problems,
        world_size=max(trained_world) if trained_world else None,
        backward_ats={source: v for source, v in backward_ats.items() if source not in before_training},
        torch_optimizers=torch_optimizers or bool(per_step),
        update_backwards=update_backwards,
        left_out=left_out,
    )


def _step(index: int, records: Sequence[Record]) -> ProbeStep:
    slowest = max(records, key=lambda r: _number(r.get("seconds")) or 0.0)
    cuda = [r for r in records if r.get("device") == "cuda"]
    return ProbeStep(
        index=index,
        seconds=float(slowest["seconds"]),
        peak_bytes=_most([r.get("allocated_peak") for r in cuda]) if cuda else _most([r.get("resident_peak") for r in records]),
        peak_reserved_bytes=_most([r.get("reserved_peak") for r in cuda]) if cuda else _most([r.get("address_peak") for r in records]),
        resident_peak_bytes=_most([r.get("resident_peak") for r in records]),
        retries=_most([r.get("retries") for r in records]),
        ranks=len(records),
        optimizers=int(slowest.get("optimizers", 0) or 0),
        skipped=int(slowest.get("skipped", 0) or 0),
        backwards=int(slowest["backwards"]) if isinstance(slowest.get("backwards"), int) else None,
        forwards=int(slowest["forwards"]) if isinstance(slowest.get("forwards"), int) else None,
        lr=_number(slowest.get("lr")),
    )


def backward_per_step(report: ProbeReport, warmup_steps: int) -> float | None:
    """The median backward passes per optimizer step after the warm-up; None where the probe did not count them."""
    counts = [s.backwards for s in report.steps[warmup_steps:] if s.backwards is not None]
    if not counts:
        return None
    ordered = sorted(counts)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def forward_per_step(report: ProbeReport, warmup_steps: int) -> float | None:
    """The median forward passes of the root modules per optimizer step after the warm-up (core/validity.py: a loop
    that averages its micro-batches' losses runs `accum` of them and one backward pass); None where not counted."""
    counts = [s.forwards for s in report.steps[warmup_steps:] if s.forwards is not None]
    return float(np.median(counts)) if counts else None


def backward_per_update(report: ProbeReport) -> float | None:
    """The median backward passes between the parameter updates the probe saw, over every process, where no
    torch.optim optimizer exists; None with fewer than two such gaps (a trainer whose updates left the watched
    parameter as it was, or too short a run). An update the watch missed makes one gap of two updates' passes, which
    the median rides over; a trainer that updates after every pass makes gaps of 1."""
    gaps = [after - before for indices in report.update_backwards.values() for before, after in zip(indices, indices[1:])]
    return float(np.median(gaps)) if len(gaps) >= 2 else None


def backward_step_times(report: ProbeReport, accum: int) -> list[float]:
    """Step times from backward passes alone, for a trainer whose update is no torch.optim step: a step
    ends at every `accum`-th backward pass of a rank; each step's time is the slowest rank's. The first
    step has no start the backward passes show, so it is left out (step i here is the trainer's step i+1)."""
    per_step: dict[int, float] = {}
    for _, ats in report.backward_ats.values():
        ends = ats[accum - 1 :: accum]
        for index, (before, after) in enumerate(zip(ends, ends[1:])):
            per_step[index] = max(per_step.get(index, 0.0), after - before)
    return [per_step[i] for i in sorted(per_step) if per_step[i] > 0]


def _first_oom(ooms: Sequence[tuple[float, Record]]) -> ProbeOom | None:
    if not ooms:
        return None
    _, record = min(ooms, key=lambda pair: pair[0])
    return ProbeOom(
        module=str(record.get("module", "")),
        where=str(record.get("where", "")),
        message=str(record.get("message", "")),
        rank=int(record.get("rank", 0) or 0),
        step=int(record.get("step", 0) or 0),
        inside=bool(record.get("inside", False)),
        via=str(record.get("via", "")),
    )


CompiledPhasePatterns = tuple[tuple[str, tuple["re.Pattern[str]", ...]], ...]
CompiledModulePatterns = CompiledPhasePatterns


def compile_phase_regexes(patterns: Mapping[str, Sequence[str] | str], label: str) -> CompiledPhasePatterns:
    """Validate and compile {phase: regex or regexes}; ValueError, one line starting with `label`, names a bad one.

    The one compiler for phase patterns: the log classifier's (on traceback frames) and the probe's (on
    module paths) differ only in their defaults and the setting they name."""
    if not isinstance(patterns, Mapping):
        raise ValueError(f"{label}: expected a mapping of phase -> regexes, got {type(patterns).__name__}")
    phases = [str(p) for p in OomPhase]
    out = []
    for phase, regexes in patterns.items():
        if phase not in phases:
            raise ValueError(f"{label}: unknown phase {phase!r}; valid phases: {', '.join(phases)}")
        compiled = []
        for regex in [regexes] if isinstance(regexes, str) else list(regexes):
            if not isinstance(regex, str):
                raise ValueError(f"{label}[{phase!r}]: expected regex strings, got {type(regex).__name__}")
            try:
                compiled.append(re.compile(regex))
            except re.error as e:
                raise ValueError(f"{label}[{phase!r}]: {regex!r} does not compile: {e}") from None
        out.append((str(phase), tuple(compiled)))
    return tuple(out)


def compile_module_phase_patterns(patterns: Mapping[str, Sequence[str] | str] | None) -> CompiledModulePatterns:
    """Validate and compile {phase: regexes}; None gives DEFAULT_MODULE_PHASE_PATTERNS. ValueError names a bad one."""
    return compile_phase_regexes(DEFAULT_MODULE_PHASE_PATTERNS if patterns is None else patterns, "module phase patterns")


def oom_phase_of(module_path: str, patterns: Mapping[str, Sequence[str] | str] | CompiledModulePatterns | None = None) -> OomPhase | None:
    """The OOM phase (encoder/joint/optimizer) a module path belongs to, or None if no pattern matches.

    Each regex is searched in one path component at a time, deepest first, so `joint.enc_proj` is the
    joint's (its own name says so) only when nothing deeper matches; the whole path is tried last
    (for patterns that span components)."""
    compiled = patterns if isinstance(patterns, tuple) else compile_module_phase_patterns(patterns)
    if not module_path:
        return None
    parts = module_path.split(".")
    for candidate in [*reversed(parts), module_path]:
        for phase, regexes in compiled:
            if any(r.search(candidate) for r in regexes):
                return OomPhase(phase)  # compile_phase_regexes let only OomPhase's names through
    return None
