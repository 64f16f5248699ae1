"""Run one trial: the function a submitit job calls.

One (accum, split) pair: build the RNN-T workload, cap device memory at the
machine's budget, run warm-up then timed optimizer steps, and record the
outcome (ok with throughput, oom with the phase, or failed) atomically in
`<trial_dir>/result.json`. Lines printed here go to the job's log.

It is measured as a command trial is: by the probe (sweep.probe), armed in this
process, writing to `<trial_dir>/probe/`. Step times, memory peaks and the OOM's
module (hence its phase) are the probe's; this file keeps what is not
measurement: the memory budget, the ranks' agreement on an OOM, adaptive
stopping and racing, the progress record.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from sweep import probe
from sweep.core.config import memory_margin
from sweep.core.measure import measured_enough_for, progress_record
from sweep.core.memory_model import counted_peak
from sweep.core.probe_report import ProbeReport
from sweep.core.schema import OomPhase, Status, TrialResult, now_iso
from sweep.core.spec import TrialSpec
from sweep.core.stats import special, throughput_summary
from sweep.core.steady import steady_steps
from sweep.core.validity import validated
from sweep.launch.memory import headroom, is_tight
from sweep.launch.tree import process_age_s
from sweep.records import stop_requested, write_progress, write_result
from sweep.workloads.rnnt.memory import (
    DeviceOOM,
    MemoryBaseline,
    MemoryBudget,
    SmallObjectReserve,
    configure_cpu_allocator,
    is_oom_error,
)
from sweep.workloads.rnnt.model import RNNTWorkload

GIB = 1024**3
_startup_counted = False  # whether an earlier run_trial in this process already counted start-up
PROBE_SUBDIR = "probe"  # <trial_dir>/probe/: the probe's records, one file per rank


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")[:300]


def _job_environment():
    """submitit's view of this job, or None outside a submitit job."""
    try:
        import submitit

        return submitit.JobEnvironment()
    except RuntimeError:
        return None


def _init_distributed(num_devices: int, backend: str) -> tuple[int, int, int]:
    """(rank, world_size, local_rank); starts torch.distributed when this trial has several ranks.

    Inside a submitit job, one process per device (tasks_per_node), and submitit
    says who is who; under torchrun, the usual variables do. Otherwise one process.
    """
    job = _job_environment()
    if job is not None and job.num_tasks > 1:
        if job.num_tasks != num_devices:
            raise ValueError(
                f"num_devices={num_devices} but this job has {job.num_tasks} tasks: "
                "launch one task per device (tasks_per_node * nodes = num_devices)"
            )
        import submitit.helpers

        # Keep CUDA_VISIBLE_DEVICES as the launcher set it: each rank takes cuda:local_rank of those.
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    elif int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        if num_devices > 1:
            print(
                f"sweep: not inside a multi-task job: running 1 process for num_devices={num_devices}; "
                "it trains one rank's share, so throughput leaves out gradient all-reduce",
                flush=True,
            )
        return 0, 1, 0
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))


def _record_memory(result: TrialResult, report: ProbeReport, open_step: dict, baseline: MemoryBaseline,
                   memory_gib: float | None, margin: float) -> None:
    """Peak, capacity, headroom and tight, from the probe's per-step figures (the largest over ranks; ranks
    train alike) and, for a step an OOM cut short, what the probe saw of it so far (this rank's).

    Headroom counts what the budget counts: on CUDA the reserved peak (the allocator keeps what it
    reserved) against the card, capped at machine.memory_gib; on CPU the address-space peak against
    the emulated budget (its cap is on address space, RLIMIT_AS). Used memory is above the baseline
    taken once start-up and warm-up were done (memory.MemoryBaseline)."""
    cuda = baseline.device.type == "cuda"
    used_key, counted_key = ("allocated_peak", "reserved_peak") if cuda else ("resident_peak", "address_peak")
    used = max([b for b in (report.peak_bytes, open_step.get(used_key)) if b is not None], default=None)
    counted = max([b for b in (report.peak_reserved_bytes, open_step.get(counted_key)) if b is not None], default=None)
    if used is not None:
        result.peak_mem_gib = baseline.used_above(used) / GIB
    if counted is not None:
        result.peak_reserved_gib = baseline.counted_above(counted) / GIB
    result.step_peak_reserved_gib = [
        baseline.counted_above(s.peak_reserved_bytes) / GIB for s in report.steps if s.peak_reserved_bytes is not None
    ]
    result.step_alloc_retries = report.step_retries  # CUDA only; a retry in a timed step puts the pair at risk
    result.peak_step = report.peak_step
    capacity = float(memory_gib) if memory_gib is not None else math.inf  # None: no budget set, the card's
    if cuda:
        capacity = min(capacity, torch.cuda.get_device_properties(baseline.device).total_memory / GIB)
    result.capacity_gib = capacity
    result.headroom = headroom(counted_peak(result), capacity)
    result.tight = is_tight(result.status == Status.OK, result.headroom, margin)


def _probe_report(probe_dir: Path, world_size: int, status: Status) -> ProbeReport:
    """Every rank's probe records; ranks that finished alike wait for each other's last step record first."""
    if world_size > 1 and status in (Status.OK, Status.OOM):  # all ranks are here (after an agreed end)
        dist.barrier()
    return probe.read_probe(probe_dir)


def _oom_phase(exc: DeviceOOM, report: ProbeReport, patterns) -> tuple[OomPhase, str]:
    """The OOM's phase from the module the probe saw running, and that module's path.

    The workload's own phase (where its step was) stands only where the probe named no module that
    maps to a phase (an OOM between modules before any ran)."""
    oom = report.oom
    if oom is not None:
        phase = probe.oom_phase_of(oom.module, patterns)
        if phase is not None:
            return OomPhase(phase), oom.module
    return OomPhase(exc.phase), oom.module if oom is not None else ""


def _rank_log(job, rank: int, default: str) -> tuple[str, str]:
    """(the log of task `rank` of this job, " (rank R on HOST)"); the default log and no host outside a submitit job."""
    if job is None:
        return default, f" (rank {rank})"
    from submitit.core.utils import JobPaths

    per_node = max(1, job.num_tasks // max(1, job.num_nodes))
    hosts = list(job.hostnames)
    host = hosts[rank // per_node] if rank // per_node < len(hosts) else "?"
    return str(JobPaths(os.environ.get("SUBMITIT_FOLDER", job.paths.folder), job_id=job.job_id, task_id=rank).stdout), f" (rank {rank} on {host})"


def _agree(enough: bool, stop: str, device: torch.device) -> tuple[bool, str]:
    """Rank 0's decision, broadcast so every rank leaves the step loop together (none waits in a collective)."""
    flags = torch.tensor([int(enough), int(bool(stop))], device=device)
    dist.broadcast(flags, src=0)
    return bool(flags[0].item()), (stop or "stopped by the orchestrator") if int(flags[1].item()) else ""


def run_trial(spec: TrialSpec, extra_startup_s: float = 0.0) -> TrialResult:
    """Run one (accum, split) trial as `spec` says; rank 0 writes the result record and returns it.

    extra_startup_s: start-up this trial owes that another process paid (a warm worker's interpreter
    and imports, for the first trial it forks)."""
    global _startup_counted
    started_at, t_start = now_iso(), time.perf_counter()
    # A process's first trial owns its interpreter and torch start-up; a warm worker's later ones do not.
    startup_s = extra_startup_s + (0.0 if _startup_counted else (process_age_s() or 0.0))
    _startup_counted = True
    machine, trial = spec.machine, spec.trial
    accum, split = spec.accum, spec.split
    per_device_batch, global_batch = spec.per_device_batch, spec.global_batch_size
    warmup = int(trial.warmup_steps)
    device_type = machine.device
    job = _job_environment()
    result = TrialResult(
        **spec.numbers(),
        status=Status.FAILED,
        fingerprint=spec.fingerprint,  # only a sweep with the same settings adopts this record
        warmup_steps=warmup,
        # Task 0's stdout, where submitit puts this job's log (stderr too, by default).
        log=str(job.paths.stdout) if job is not None else "",
        job_id=str(job.job_id) if job is not None else "",
        host=socket.gethostname(),
        device=device_type,
        started_at=started_at,
    )
    rank, world_size = 0, 1
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    budget: MemoryBudget | None = None
    baseline: MemoryBaseline | None = None
    measured = None  # the probe in this process, once armed
    probe_dir = Path(spec.trial_dir) / PROBE_SUBDIR
    oom: DeviceOOM | None = None
    error: BaseException | None = None
    try:
        if machine.cpu_threads:
            torch.set_num_threads(int(machine.cpu_threads))
        rank, world_size, local_rank = _init_distributed(result.num_devices, "nccl" if device_type == "cuda" else "gloo")
        if world_size > 1:
            say = lambda msg: print(f"[rank {rank}] {msg}", flush=True)  # noqa: E731
        device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
        # scipy.special (the step statistics') imported before the allocator is set up and the cap enforced (core/stats.py):
        # imported later, just before the cap, the trial's counted peak read 2 MiB (10%) higher on the CPU demo.
        special()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            configure_cpu_allocator()
        probe.install(probe_dir)  # after the process group: the probe tells ranks apart by it
        measured = probe.runtime().PROBE
        say(
            f"sweep trial accum={accum} split={split} per_device_batch={per_device_batch} "
            f"joint_batch={result.joint_batch} global_batch_size={global_batch} num_devices={result.num_devices} "
            f"device={device} memory_gib={machine.memory_gib}"
        )
        workload = RNNTWorkload(spec.workload, device, rank=rank, world_size=world_size, data_seed=int(trial.seed))
        measured.name_modules(workload.model)
        workload.on_oom = lambda exc: measured.record_oom(exc, "caller")
        # On CPU at the trial's own batch, so oneDNN's shape-specialised primitives exist before the cap.
        workload.warm_up(per_device_batch if device.type == "cpu" else 1)
        workload.sync()
        budget = MemoryBudget(device, machine.memory_gib)
        reserve = SmallObjectReserve() if device.type == "cpu" else None  # noqa: F841 - kept until the trial ends
        measured.reset_peaks()  # first: its own first reading belongs to the baseline, not to the steps
        baseline = MemoryBaseline(device)
        budget.enforce()
        step = 0
        steady: list[float] = []  # the timed steps after any warm-up that outlasted trial.warmup_steps (core/steady.py)
        # Adaptive: time steps until the median is known to +-target_precision (measure_steps..max_measure_steps),
        # or until the orchestrator says this trial cannot win (racing). Rank 0 decides for all ranks.
        while True:
            enough, stop = False, ""
            if step >= warmup and rank == 0:
                enough = measured_enough_for(steady, trial, timed_steps=len(result.step_times_s))  # slow leading steps: warm-up
                # A stop request counts once a timed step exists: there is a partial measurement to keep.
                stop = "" if enough or not result.step_times_s else (stop_requested(spec.trial_dir) or "")
            if world_size > 1:
                enough, stop = _agree(enough, stop, device)
            if enough:
                break
            if stop:
                result.stopped_early = stop
                say(f"stopping early: {stop}")
                break
            measured.begin_step()  # the step starts here, not where the last one ended: the checks above are not its
            workload.train_step(per_device_batch, accum, split, step_index=step)
            record = measured.end_step()
            if record is None:
                raise RuntimeError(f"the probe saw no optimizer step in step {step}: the step cannot be timed")
            dt = float(record["seconds"])
            if step >= warmup:
                result.step_times_s.append(dt)
                # Judged afresh every step while short, every 16th step in a long run (the judging then costs more).
                n = len(result.step_times_s)
                steady = steady_steps(result.step_times_s) if n <= 64 or n % 16 == 0 else [*steady, dt]
                if rank == 0:
                    write_progress(spec.trial_dir, progress_record(steady, global_batch_size=global_batch))
            step += 1
            # Out of the most it may run: the warm-up plus trial.max_measure_steps timed steps.
            say(f"step {step}/{warmup + int(trial.max_measure_steps)}{' (warm-up)' if step <= warmup else ''}: {dt:.3f} s")
        budget.lift()
        result.status = Status.OK
    except DeviceOOM as exc:
        if budget is not None:
            budget.lift()
        oom = exc
        # On the rank that ran out, unless a hook saw it already: an op between modules on CPU.
        if exc.rank == rank and measured is not None:
            measured.note_oom(str(exc))
        result.status, result.oom_phase, result.error = Status.OOM, OomPhase(exc.phase), str(exc)
        if exc.traceback_text:
            print(exc.traceback_text, file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded, then re-raised below
        if budget is not None:
            budget.lift()
        error = exc
        result.error = _one_line(exc)
        if is_oom_error(exc):  # outside a step: no (accum, split) can fix it, so not an "oom" candidate
            result.error = f"out of memory before the first step (the model does not fit): {result.error}"
    if measured is not None and baseline is not None:
        open_step = measured.open_step_memory()
        report = _probe_report(probe_dir, world_size, result.status)
        result.measured_by, result.ranks_seen = "probe", len(report.ranks) or None  # None: no step finished
        result.world_size, result.probe_signal = report.world_size, "optimizer steps"
        if result.status == Status.OK:
            # The slowest rank's figures, warm-up (and leading steps still warming up) left out; rank 0 decided
            # when to stop on its own.
            timed = report.step_times_s[warmup:]
            result.step_times_s = steady_steps(timed)
            result.transient_steps = len(timed) - len(result.step_times_s)
            result.warmup_steps = warmup + result.transient_steps
            result.steps_measured = len(result.step_times_s)
            result.throughput, result.throughput_low, result.throughput_high = throughput_summary(result.step_times_s, global_batch)
        if oom is not None:
            result.oom_phase, result.oom_module = _oom_phase(oom, report, None)
            where = ""
            if world_size > 1:
                # The traceback is in the log of the rank that ran out, on its node: the record names both.
                result.log, where = _rank_log(job, oom.rank, result.log)
            result.error = f"{str(oom).rsplit(' in phase ', 1)[0]}{where} in phase {result.oom_phase}"
        _record_memory(result, report, open_step, baseline, machine.memory_gib, memory_margin(trial, machine))
    result.finished_at = now_iso()
    result.wall_s = startup_s + time.perf_counter() - t_start
    validated(result)  # the figure counts only if it measured what was asked (core/validity.py)
    if result.status == Status.OK:
        say(
            f"result ok: {result.throughput:.1f} samples/s (95% {result.throughput_low:.1f}-{result.throughput_high:.1f}), "
            f"peak {result.peak_mem_gib:.3f} GiB used, {counted_peak(result):.3f} GiB counted, wall {result.wall_s:.1f} s, {result.steps_measured} timed steps"
            + (f"; stopped early: {result.stopped_early}" if result.stopped_early else "")
        )
    else:
        say(f"result {result.status}{' in phase ' + result.oom_phase if result.oom_phase else ''}: {result.error}")
    if rank == 0:
        write_result(result, Path(spec.trial_dir))
    if world_size > 1:
        dist.destroy_process_group()
    if error is not None:
        raise error
    return result
