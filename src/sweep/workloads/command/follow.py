"""How a command trial is followed while it runs: its log read as it grows, its progress written for racing,
and when it is stopped (measured enough, racing's stop.json, the time limit; on several nodes, node 0's
decision: nodes.py). Figures from the log are turned into step times by the same rules the record uses."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from sweep.core.measure import measured_enough_for, progress_record
from sweep.records import stop_requested, write_progress
from sweep.workloads.command.nodes import Team


def follow(
    proc: subprocess.Popen, tail: Any, parser: Any, trial_dir: Path, enough: Enough | Obey, limit: float, t0: float, rate: Any, stop: Any
) -> tuple[list[Any], bool, str]:
    """Read the log as it grows until the command ends, overruns its time, has measured enough, or is told to stop.

    The last element says why the command was stopped: "" (it ended by itself), Enough.REASON, racing's reason, or
    on several nodes the reason node 0 decided on (nodes.py). `stop(why)` ends the command (node 0: its decision first).
    """
    measurements: list[Any] = []
    shown = 0
    while True:
        code = proc.poll()
        new = [m for chunk in tail.drain() for m in parser.feed(chunk)]  # all that is new, not one chunk a poll
        measurements += new
        probed = enough.probe_timed()
        if not isinstance(enough, Enough):
            pass  # node k > 0 (Obey) times nothing and writes no progress: node 0 does, from every node's records
        elif probed and len(probed) != shown:
            shown = len(probed)
            write_progress(trial_dir, progress_record(probed, throughput=enough.probe.rate(probed[-1]), throughput_unit=enough.probe.unit,
                                                      measurements=shown, warmup_measurements=enough.probe.warmup_steps, measured_by="probe"))
        elif new and not probed and enough.writes_progress:
            write_log_progress(trial_dir, measurements, enough, rate)
        if code is not None:
            return measurements, False, ""
        why = enough.reason_to_stop(measurements, trial_dir)
        if why:
            stop(why)
            return measurements, False, why
        if time.monotonic() - t0 > limit:
            stop(f"still running after trial.time_limit_s={limit:g}s")
            return measurements, True, ""
        time.sleep(0.2)


class Enough:
    """When to stop the user's command: once core/measure.py's measured_enough_for holds for the probe's
    timed steps; without them, parser.stop_after figures after the warm-up if set, else measured_enough_for
    on the log's figures; or when racing's stop.json appears."""

    REASON = "measured enough"
    writes_progress = True  # node 0's (or the only node's): racing reads it

    def __init__(self, trial: Any, skip: int, stop_after: Any, timed: Any, probe: Any = None, team: Team | None = None) -> None:
        self.trial, self.skip, self.stop_after, self._timed, self.probe, self.team = trial, skip, stop_after, timed, probe, team
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
        peer = self.team.failed_peer() if self.team is not None else None
        if self.team is not None and peer is not None:  # its ranks are gone: ours would wait on them in their next collective
            self.team.peer = peer
            return f"node {peer.node} ({peer.host}) ended: {peer.status}"
        probed = self.probe_timed()
        if probed:
            if measured_enough_for(probed, self.trial, timed_steps=len(self.probe.after_warmup())):
                return self.REASON
            return stop_requested(trial_dir) or ""
        if self.probe is not None and self.probe.signal:
            # The probe times this command's steps (its records are read once a second): its figure decides, never the log's
            # per-step figures that came first, or a trial would end on a few probe steps (a regex reading micro-batches).
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


class Obey:
    """Node k > 0 of a multi-node trial: stops when node 0 has decided, never on its own measurement."""

    writes_progress = False  # its ranks are part of the trial: node 0 writes the progress, from every node's records

    def __init__(self, team: Team) -> None:
        self.team = team

    def probe_timed(self) -> list[float]:
        return []

    def reason_to_stop(self, measurements: list[Any], trial_dir: Path) -> str:
        return self.team.stop_reason()


def timed_so_far(measurements: list[Any], summarize: Any, global_batch_size: int) -> list[float]:
    """Seconds per optimizer step of the figures measured so far, by the same rules the trial's record
    uses (one rank, redrawn bars once, the preset's warm-up); empty before any figure after the warm-up."""
    from sweep.errors import ThroughputError

    try:
        summary = summarize(measurements)
    except ThroughputError:
        return []
    return measured_step_times(summary, global_batch_size) if summary.after_warmup else []


def measured_step_times(summary: Any, global_batch_size: int) -> list[float]:
    """Seconds per optimizer step of each measured figure, for the confidence score's spread and for
    racing; for tokens/s only where the log printed its step time. Empty unless every figure has one."""
    from sweep.parsers.throughput import MEASURED, SAMPLES_PER_S

    used = [f for f in summary.figures if f.role == MEASURED]
    if summary.unit == SAMPLES_PER_S:
        times = [global_batch_size / f.throughput for f in used if f.throughput]
    else:
        times = [f.measurement.step_time_s for f in used if f.measurement.step_time_s]
    return times if len(times) == len(used) else []


def live_throughput(m: Any, *, context: Any, unit: str | None) -> tuple[float | None, str]:
    """A figure as the trial will record it (samples/s or tokens/s, global), for the live table; None if it cannot be."""
    from sweep.errors import ThroughputError
    from sweep.parsers.throughput import convert, output_unit

    out = output_unit(m.unit, context, unit)
    try:
        return convert(m, context, out), out
    except ThroughputError:
        return None, out


def write_log_progress(trial_dir: Path, measurements: list[Any], enough: Enough, rate: Any = None) -> None:
    last = measurements[-1]
    value, unit = rate(last) if rate is not None else (last.throughput, "samples/s")
    record = progress_record(
        enough.timed(measurements), throughput=value, throughput_unit=unit, measurements=len(measurements), warmup_measurements=enough.skip
    )
    write_progress(trial_dir, record)
