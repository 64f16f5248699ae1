"""Sweep any training script: run an argv template as one trial and read its log.

The command runs as an argv list, never through a shell, and its placeholders take
only the validated integers of the candidate, so no config value can inject a
command. Throughput comes from the log as it grows (sweep.parsers); failures are
classified from the log tail and the exit status.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import string
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweep.core.config import memory_margin
from sweep.core.measure import PROGRESS_FILE, measured_enough_for, progress_record, stop_requested, write_progress  # noqa: F401 (PROGRESS_FILE: the workload reads it from here)
from sweep.core.schema import Status, TrialResult, now_iso, write_result
from sweep.core.spec import TrialSpec
from sweep.errors import TemplateError  # defined there; still importable from here
from sweep.launch.memory import TreeMemorySampler, is_tight

PLACEHOLDERS = ("accum", "split", "per_device_batch", "joint_batch", "global_batch_size", "num_devices")
LOG_NAME = "command.log"


def template_fields(text: str) -> list[str]:
    """The placeholder names in one template string; format specs and attribute access are refused."""
    names = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise TemplateError(f"{text!r} is not a valid template ({e}); write placeholders as {{accum}}, literal braces as {{{{ }}}}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            raise TemplateError(
                f"{text!r} uses placeholder {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: "
                f"valid placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        names.append(name)
    return names


def check_template(argv: Sequence[str], env: Mapping[str, str]) -> None:
    if not argv:
        raise TemplateError("workload.argv is empty: give the training command as a list, e.g. [python, train.py, --grad_accumulation_batches={accum}]")
    for part in [*argv, *env.values()]:
        if not isinstance(part, str):
            raise TemplateError(f"workload.argv/env value {part!r} is not a string: quote it in YAML")
        template_fields(part)


def fill(text: str, values: Mapping[str, int]) -> str:
    template_fields(text)
    return text.format(**{k: int(values[k]) for k in PLACEHOLDERS})


def run_command_trial(spec: TrialSpec) -> TrialResult:
    """Run the user's command for one candidate and write the trial's result record."""
    from sweep.parsers import LogTail, ThroughputError, classify_failure, parser_settings, read_tail

    wl = spec.workload
    trial_dir = Path(spec.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    values = spec.numbers()
    argv = [fill(a, values) for a in wl.argv]
    env = {**os.environ, **{k: fill(str(v), values) for k, v in (wl.env or {}).items()}}
    cwd = wl.cwd or str(trial_dir)
    log_path = trial_dir / LOG_NAME
    settings = parser_settings(wl.parser)  # the preset's warm-up, unit and scope; checked before launch
    skip, stop_after = settings.skip_first, settings.stop_after
    parser = settings.make_parser()
    context = settings.context(global_batch_size=values["global_batch_size"], num_devices=values["num_devices"], accum=values["accum"])
    live_rate = functools.partial(live_throughput, context=context, unit=settings.throughput_unit)
    summarize = functools.partial(
        settings.summarize, global_batch_size=values["global_batch_size"], num_devices=values["num_devices"], accum=values["accum"]
    )
    timed = functools.partial(_timed_so_far, summarize=summarize, global_batch_size=values["global_batch_size"])
    limit = float(spec.trial.time_limit_s)
    started_at, t0 = now_iso(), time.monotonic()
    print(f"accum={values['accum']} split={values['split']}: running {argv} in {cwd}; log {log_path}", flush=True)

    with open(log_path, "ab") as log:
        # A new session, so a timeout can stop the whole process tree (dataloader workers, ranks).
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        tail = LogTail(log_path)
        sampler = _memory_sampler(proc.pid, spec).start()
        try:
            measurements, timed_out, stopped_early = _follow(proc, tail, parser, trial_dir, _Enough(spec.trial, skip, stop_after, timed), limit, t0, live_rate)
        except BaseException:
            # Interrupted (Ctrl-C reaches the job too): never leave the training command behind.
            _stop(proc)
            sampler.stop()
            raise
        measurements += parser.feed(tail.read_new()) + parser.close()
    code = proc.wait()
    memory = sampler.stop()

    summary, why_not = None, ""
    if measurements:
        try:
            summary = summarize(measurements)
        except ThroughputError as e:
            why_not = f": {e}"
    base = dict(
        **values, log=str(log_path), job_id=_job_id(), host=socket.gethostname(), device="command",
        started_at=started_at, finished_at=now_iso(), wall_s=round(time.monotonic() - t0, 3),
        peak_mem_gib=memory.peak_gib, capacity_gib=memory.capacity_gib, headroom=memory.headroom, fingerprint=spec.fingerprint,
    )
    if timed_out:
        result = TrialResult(status=Status.TIMEOUT, error=f"still running after trial.time_limit_s={limit:g}s; stopped", **base)
    elif summary is not None and (code == 0 or stopped_early):
        result = _ok_result(base, summary)
        if stopped_early not in ("", _Enough.REASON):
            result.stopped_early = stopped_early  # racing: the orchestrator's reason
    elif code == 0:
        result = TrialResult(status=Status.FAILED, error=f"exited 0 but printed no throughput the {settings.type} parser recognises{why_not}; see {log_path}", **base)
    else:
        verdict = classify_failure(read_tail(log_path), exit_code=code, phase_patterns=wl.phase_patterns)
        result = TrialResult(status=verdict.status if verdict.status != Status.OK else Status.FAILED, oom_phase=verdict.oom_phase, error=verdict.reason, **base)
    result.tight = is_tight(result.status == Status.OK, result.headroom, memory_margin(spec.trial, spec.machine))
    write_result(result, trial_dir)
    print(f"accum={values['accum']} split={values['split']}: {result.status} {result.error}", flush=True)
    return result


def _memory_sampler(pid: int, spec: TrialSpec) -> TreeMemorySampler:
    """GPU profile: NVML, else the emulated cards. CPU profile: resident memory against the host's, even
    on a host with GPUs, since nothing holds a user's command to machine.memory_gib there."""
    if spec.machine.device == "cuda":
        return TreeMemorySampler(pid, capacity_gib=float(spec.machine.memory_gib) * spec.num_devices)
    return TreeMemorySampler(pid, capacity_gib=None, nvml_factory=lambda: None)


def _job_id() -> str:
    """This trial's submitit job id; empty outside a submitit job."""
    import submitit

    try:
        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:
        return ""


def _follow(
    proc: subprocess.Popen, tail: Any, parser: Any, trial_dir: Path, enough: _Enough, limit: float, t0: float, rate: Any = None
) -> tuple[list[Any], bool, str]:
    """Read the log as it grows until the command ends, overruns its time, has measured enough, or is told to stop.

    The last element says why the command was stopped: "" (it ended by itself), _Enough.REASON, or racing's reason.
    """
    measurements: list[Any] = []
    while True:
        code = proc.poll()
        new = parser.feed(tail.read_new())
        if new:
            measurements += new
            _write_progress(trial_dir, measurements, enough, rate)
        if code is not None:
            return measurements, False, ""
        why = enough.reason_to_stop(measurements, trial_dir)
        if why:
            _stop(proc)
            return measurements, False, why
        if time.monotonic() - t0 > limit:
            _stop(proc)
            return measurements, True, ""
        time.sleep(0.2)


class _Enough:
    """When to stop the user's command: parser.stop_after figures after the warm-up if set, else once
    core/measure.py's measured_enough_for holds for the measured figures; or when racing's stop.json appears."""

    REASON = "measured enough"

    def __init__(self, trial: Any, skip: int, stop_after: Any, timed: Any) -> None:
        self.trial, self.skip, self.stop_after, self._timed = trial, skip, stop_after, timed
        self._cached: tuple[int, list[float]] = (0, [])

    def timed(self, measurements: list[Any]) -> list[float]:
        """The measured step times so far; summarised once per new figure, not once per poll."""
        if self._cached[0] != len(measurements):
            self._cached = (len(measurements), self._timed(measurements))
        return self._cached[1]

    def reason_to_stop(self, measurements: list[Any], trial_dir: Path) -> str:
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


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
