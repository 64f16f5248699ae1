"""Sweep any training script: run an argv template as one trial and read its log.

The command runs as an argv list, never through a shell, and its placeholders take
only the validated integers of the candidate, so no config value can inject a
command. Throughput comes from the log as it grows (sweep.parsers); failures are
classified from the log tail and the exit status.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep.core.config import memory_margin
from sweep.core.measure import PROGRESS_FILE, measured_enough_for, progress_record  # noqa: F401 (PROGRESS_FILE: the workload reads it from here)
from sweep.core.schema import Status, TrialResult, now_iso
from sweep.core.spec import TrialSpec
from sweep.errors import TemplateError  # noqa: F401 (defined there; still importable from here)
from sweep.launch.memory import TreeMemorySampler, is_tight
from sweep.launch.tree import PROCESSES_FILE, TreeTracker, become_subreaper, end_processes
from sweep.records import stop_requested, write_progress, write_result
from sweep.workloads.command.launching import attempt_log, command_env, launch_values
from sweep.workloads.command.launching import job_id as _job_id
from sweep.workloads.command.template import PLACEHOLDERS, check_template, fill, missing_paths, template_fields  # noqa: F401 (re-exported)


def run_command_trial(spec: TrialSpec) -> TrialResult:
    """Run the user's command for one candidate (one launcher on each node) and write the trial's result record."""
    from sweep.launch import evidence
    from sweep.parsers import LogTail, parser_settings

    wl = spec.workload
    trial_dir = Path(spec.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    launch = launch_values(spec)
    writes = launch["node_rank"] == 0
    values = {**spec.numbers(), **launch}
    argv = [fill(a, values) for a in wl.argv]
    env = command_env(spec, {k: fill(str(v), values) for k, v in (wl.env or {}).items()})
    cwd = wl.cwd or os.getcwd()
    log_path = attempt_log(trial_dir, int(launch["node_rank"]))
    settings = parser_settings(wl.parser)  # the preset's warm-up, unit and scope; checked before launch
    parser = settings.make_parser()
    gbs = values["global_batch_size"]
    context = settings.context(global_batch_size=gbs, num_devices=values["num_devices"], accum=values["accum"])
    summarize = functools.partial(settings.summarize, global_batch_size=gbs, num_devices=values["num_devices"], accum=values["accum"])
    probe = _probe_follower(spec, trial_dir, log_path, settings) if getattr(wl, "probe", False) else None
    if probe is not None:
        from sweep.probe import probe_env

        env.update(probe_env(probe.record_dir, base_env=env))
    limit = float(spec.trial.time_limit_s)
    started_at, t0 = now_iso(), time.monotonic()
    base = dict(**spec.numbers(), log=str(log_path), job_id=_job_id(), host=socket.gethostname(), device="command", started_at=started_at, fingerprint=spec.fingerprint)
    missing = missing_paths(argv, cwd)  # checked before launch where trials run here; on a cluster, here on the node
    if missing:
        return _finish(spec, trial_dir, TrialResult(status=Status.FAILED, error=missing, finished_at=now_iso(), **base), writes=writes)
    print(f"accum={values['accum']} split={values['split']}: running {argv} in {cwd}; log {log_path}", flush=True)

    # Orphans of the command (a `setsid` child, a double fork) come back to this process, which
    # records every descendant as it appears and ends them all when the trial ends, however it ends.
    become_subreaper()
    tracker = TreeTracker(trial_dir / PROCESSES_FILE if writes else None).start()
    oom_kills_before = evidence.oom_kill_count()
    enough = _Enough(spec.trial, settings.skip_first, settings.stop_after, functools.partial(_timed_so_far, summarize=summarize, global_batch_size=gbs), probe)
    live_rate = functools.partial(live_throughput, context=context, unit=settings.throughput_unit)
    with open(log_path, "ab") as log:
        # A new session, so a stop reaches the whole process group (dataloader workers, ranks) at once.
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        tracker.poll()
        tail = LogTail(log_path)
        sampler = _memory_sampler(proc.pid, spec).start()
        try:
            measurements, timed_out, stopped_early = _follow(proc, tail, parser, trial_dir, enough, limit, t0, live_rate, functools.partial(_stop, proc, tracker))
        except BaseException:
            # Interrupted (the sweep cancelled this job): never leave the training command behind.
            _stop(proc, tracker)
            sampler.stop()
            raise
        for chunk in tail.drain():  # to the end of the file: the last figures are often the ones that count
            measurements += parser.feed(chunk)
        measurements += parser.close()
    code = proc.wait()
    memory = sampler.stop()
    _stop(proc, tracker)  # whatever the command left behind (forked or setsid children)
    if probe is not None:
        probe.poll(force=True)

    base.update(
        finished_at=now_iso(), wall_s=round(time.monotonic() - t0, 3),
        peak_mem_gib=memory.peak_gib, capacity_gib=memory.capacity_gib, headroom=memory.headroom,
    )
    if probe is not None:
        base.update(probe.memory_fields(spec.machine.device, float(spec.machine.memory_gib) if spec.machine.device == "cuda" else None))
        base.update(probe.provenance_fields())
    ended = _Ended(code, timed_out, stopped_early, memory, set(tracker.seen) | {proc.pid}, oom_kills_before)
    result = _result(spec, settings, _summary(summarize, measurements), probe, ended, base, log_path)
    return _finish(spec, trial_dir, result, writes=writes)


@dataclass
class _Ended:
    """How the command ended, and what is known about its memory if it was killed."""

    code: int
    timed_out: bool
    stopped_early: str  # "" (ended by itself), _Enough.REASON, or racing's reason
    memory: Any  # the sampler's MemoryReading
    pids: set[int]  # every process of the trial's tree
    oom_kills_before: int | None


def _summary(summarize: Any, measurements: list[Any]) -> tuple[Any, str]:
    """(the log's summary, or None, and why not: ": <reason>" or "")."""
    from sweep.parsers import ThroughputError

    if not measurements:
        return None, ""
    try:
        return summarize(measurements), ""
    except ThroughputError as e:
        return None, f": {e}"


def _result(spec: TrialSpec, settings: Any, log_summary: tuple[Any, str], probe: Any, ended: _Ended, base: dict[str, Any], log_path: Path) -> TrialResult:
    """The trial's record: measured by the probe where it timed steps, else from the log; failures classified."""
    from sweep.launch import evidence
    from sweep.parsers import KillEvidence, classify_failure, read_tail

    limit = float(spec.trial.time_limit_s)
    summary_or_none, why_not = log_summary
    probe_times = probe.timed() if probe is not None else []
    if ended.timed_out:
        return TrialResult(status=Status.TIMEOUT, error=f"still running after trial.time_limit_s={limit:g}s; stopped", **base)
    if ended.code == 0 or ended.stopped_early:
        if probe_times:
            result = TrialResult(status=Status.OK, measured_by="probe", **probe.ok_fields(), **base)
            summary = summary_or_none
            if summary is not None and summary.unit == result.throughput_unit:
                result.log_throughput = summary.value  # the cross-check core/validity.py makes
        elif summary_or_none is not None:
            result = _ok_result(base, summary_or_none)
            result.measured_by = "log"
        else:
            note = "" if probe is None else ("; the probe saw no optimizer step" if probe.report is not None and probe.report.armed else "; the probe never armed (no torch import)")
            return TrialResult(
                status=Status.FAILED, error=f"exited 0 but printed no throughput the {settings.type} parser recognises{why_not}{note}; see {log_path}", **base
            )
        if ended.stopped_early not in ("", _Enough.REASON):
            result.stopped_early = ended.stopped_early  # racing: the orchestrator's reason
        return result
    kill = None
    if ended.code in (-9, 137):
        kill = KillEvidence(
            oom_kills=_rise(ended.oom_kills_before, evidence.oom_kill_count()),
            kernel_oom=evidence.kernel_log_names_oom(ended.pids),
            peak_fraction=_peak_fraction(ended.memory),
        )
    verdict = classify_failure(read_tail(log_path), exit_code=ended.code, phase_patterns=spec.workload.phase_patterns, kill_evidence=kill)
    status = verdict.status if verdict.status != Status.OK else Status.FAILED
    result = TrialResult(status=status, oom_phase=verdict.oom_phase, error=verdict.reason, **base)
    oom = probe.oom() if probe is not None else None
    if oom is not None:
        from sweep.probe import oom_phase_of

        if status == Status.OOM:
            # The probe saw where: the module that was running, whatever the traceback's frames say.
            result.oom_phase = oom_phase_of(oom.module) or result.oom_phase
            result.error = f"{verdict.reason} (probe: in {oom.module or 'no module'} during {oom.where}, step {oom.step}, rank {oom.rank})"
    return result


def _probe_follower(spec: TrialSpec, trial_dir: Path, log_path: Path, settings: Any) -> Any:
    from sweep.parsers.throughput import SAMPLES_PER_S, BatchContext, output_unit
    from sweep.workloads.command.probed import ProbeFollower, other_nodes_glob, probe_dir

    figure = settings.prefer[0] if settings.prefer else settings.parser_spec.get("unit", SAMPLES_PER_S)
    unit = output_unit(figure, BatchContext(tokens_per_sample=settings.tokens_per_sample), settings.throughput_unit)
    return ProbeFollower(
        probe_dir(trial_dir, log_path), int(spec.trial.warmup_steps), int(spec.global_batch_size), settings.tokens_per_sample, unit,
        accum=int(spec.accum), other_nodes_glob=other_nodes_glob(_job_id()) if int(spec.machine.nodes or 1) > 1 else "",
    )


def _finish(spec: TrialSpec, trial_dir: Path, result: TrialResult, writes: bool) -> TrialResult:
    """Check the figure (core/validity.py) and write the trial's record (node 0's launcher alone: the trial
    dir is shared by every node)."""
    from sweep.core.validity import validated

    validated(result)
    result.tight = is_tight(result.status == Status.OK, result.headroom, memory_margin(spec.trial, spec.machine))
    if writes:
        write_result(result, trial_dir)
    print(f"accum={spec.accum} split={spec.split}: {result.status} {result.error}", flush=True)
    return result


def _rise(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else max(0, after - before)


def _peak_fraction(memory: Any) -> float | None:
    """Sampled peak over the capacity it is held to (on CPU, the host's memory)."""
    import psutil

    if memory.peak_gib is None:
        return None
    capacity = memory.capacity_gib or psutil.virtual_memory().total / 1024**3
    return float(memory.peak_gib) / capacity if capacity else None


def _memory_sampler(pid: int, spec: TrialSpec) -> TreeMemorySampler:
    """GPU profile: NVML, else the emulated cards. CPU profile: resident memory against the host's, even
    on a host with GPUs, since nothing holds a user's command to machine.memory_gib there."""
    if spec.machine.device == "cuda":
        return TreeMemorySampler(pid, capacity_gib=float(spec.machine.memory_gib) * spec.num_devices)
    return TreeMemorySampler(pid, capacity_gib=None, nvml_factory=lambda: None)


def _follow(
    proc: subprocess.Popen, tail: Any, parser: Any, trial_dir: Path, enough: _Enough, limit: float, t0: float, rate: Any, stop: Any
) -> tuple[list[Any], bool, str]:
    """Read the log as it grows until the command ends, overruns its time, has measured enough, or is told to stop.

    The last element says why the command was stopped: "" (it ended by itself), _Enough.REASON, or racing's reason.
    """
    measurements: list[Any] = []
    shown = 0
    while True:
        code = proc.poll()
        new = [m for chunk in tail.drain() for m in parser.feed(chunk)]  # all that is new, not one chunk a poll
        measurements += new
        probed = enough.probe_timed()
        if probed and len(probed) != shown:
            shown = len(probed)
            write_progress(trial_dir, progress_record(probed, throughput=enough.probe.rate(probed[-1]), throughput_unit=enough.probe.unit,
                                                      measurements=shown, warmup_measurements=enough.probe.warmup_steps, measured_by="probe"))
        elif new and not probed:
            _write_progress(trial_dir, measurements, enough, rate)
        if code is not None:
            return measurements, False, ""
        why = enough.reason_to_stop(measurements, trial_dir)
        if why:
            stop()
            return measurements, False, why
        if time.monotonic() - t0 > limit:
            stop()
            return measurements, True, ""
        time.sleep(0.2)


class _Enough:
    """When to stop the user's command: once core/measure.py's measured_enough_for holds for the probe's
    timed steps; without them, parser.stop_after figures after the warm-up if set, else measured_enough_for
    on the log's figures; or when racing's stop.json appears."""

    REASON = "measured enough"

    def __init__(self, trial: Any, skip: int, stop_after: Any, timed: Any, probe: Any = None) -> None:
        self.trial, self.skip, self.stop_after, self._timed, self.probe = trial, skip, stop_after, timed, probe
        self._cached: tuple[int, list[float]] = (0, [])

    def probe_timed(self) -> list[float]:
        """The probe's timed steps so far (read at most every probed.READ_EVERY_S); [] without the probe."""
        if self.probe is None:
            return []
        self.probe.poll()
        return self.probe.timed()

    def timed(self, measurements: list[Any]) -> list[float]:
        """The measured step times so far; summarised once per new figure, not once per poll."""
        if self._cached[0] != len(measurements):
            self._cached = (len(measurements), self._timed(measurements))
        return self._cached[1]

    def reason_to_stop(self, measurements: list[Any], trial_dir: Path) -> str:
        probed = self.probe_timed()
        if probed:
            if measured_enough_for(probed, self.trial, timed_steps=len(self.probe.after_warmup())):
                return self.REASON
            return stop_requested(trial_dir) or ""
        times = self.timed(measurements)
        if self.stop_after is not None:
            if len(measurements) >= self.skip + int(self.stop_after):
                return self.REASON
        elif times and measured_enough_for(times, self.trial):
            return self.REASON
        if times:
            return stop_requested(trial_dir) or ""
        return ""


def _timed_so_far(measurements: list[Any], summarize: Any, global_batch_size: int) -> list[float]:
    """Seconds per optimizer step of the figures measured so far, by the same rules the trial's record
    uses (one rank, redrawn bars once, the preset's warm-up); empty before any figure after the warm-up."""
    from sweep.parsers import ThroughputError

    try:
        summary = summarize(measurements)
    except ThroughputError:
        return []
    return _measured_step_times(summary, global_batch_size) if summary.after_warmup else []


def _measured_step_times(summary: Any, global_batch_size: int) -> list[float]:
    """Seconds per optimizer step of each measured figure, for the confidence score's spread and for
    racing; for tokens/s only where the log printed its step time. Empty unless every figure has one."""
    from sweep.parsers.throughput import MEASURED, SAMPLES_PER_S

    used = [f for f in summary.figures if f.role == MEASURED]
    if summary.unit == SAMPLES_PER_S:
        times = [global_batch_size / f.throughput for f in used if f.throughput]
    else:
        times = [f.measurement.step_time_s for f in used if f.measurement.step_time_s]
    return times if len(times) == len(used) else []


def _ok_result(base: dict[str, Any], summary: Any) -> TrialResult:
    """The median of the post-warm-up figures, its 95% interval and unit, as sweep.parsers summarised them."""
    return TrialResult(
        status=Status.OK, step_times_s=_measured_step_times(summary, base["global_batch_size"]), throughput=summary.value,
        throughput_low=summary.low, throughput_high=summary.high, throughput_unit=summary.unit,
        steps_measured=summary.measured, warmup_steps=summary.warmup, **base,
    )


def live_throughput(m: Any, *, context: Any, unit: str | None) -> tuple[float | None, str]:
    """A figure as the trial will record it (samples/s or tokens/s, global), for the live table; None if it cannot be."""
    from sweep.parsers.throughput import ThroughputError, convert, output_unit

    out = output_unit(m.unit, context, unit)
    try:
        return convert(m, context, out), out
    except ThroughputError:
        return None, out


def _write_progress(trial_dir: Path, measurements: list[Any], enough: _Enough, rate: Any = None) -> None:
    last = measurements[-1]
    value, unit = rate(last) if rate is not None else (last.throughput, "samples/s")
    record = progress_record(
        enough.timed(measurements), throughput=value, throughput_unit=unit, measurements=len(measurements), warmup_measurements=enough.skip
    )
    write_progress(trial_dir, record)


def _stop(proc: subprocess.Popen, tracker: TreeTracker) -> None:
    """End the command and everything it started: its process group, then every descendant ever seen."""
    import signal

    if proc.poll() is None:  # once it is reaped, its pid (and group id) may be another's: the tracker has its group
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=3.0)
        except subprocess.TimeoutExpired:
            pass
    tracker.stop()
    end_processes(tracker.seen.items())
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
