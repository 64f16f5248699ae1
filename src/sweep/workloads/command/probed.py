"""A command trial measured by the probe (sweep.probe): its step times, memory and OOM from inside its
own Python processes; the log preset is the fallback (probe off, or never armed: not a PyTorch
trainer) and the cross-check.

The probe's steps are optimizer steps, the slowest rank's, so throughput is the global batch over a
step's time (tokens/s where parser.tokens_per_sample says how many tokens a sample holds). The first
trial.warmup_steps probe steps are not timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
READ_EVERY_S = 1.0  # the records are re-read at most this often while the command runs
PROBE_PREFIX = "probe"


def probe_dir(trial_dir: Path, log_path: Path) -> Path:
    """The attempt's own record dir, beside its log: command-3.log -> probe-3 (a rerun never reads old records)."""
    return trial_dir / log_path.stem.replace("command", PROBE_PREFIX, 1)


@dataclass
class ProbeFollower:
    """What the probe has measured so far in one trial; read_probe at most every READ_EVERY_S."""

    record_dir: Path
    warmup_steps: int  # probe steps not timed (trial.warmup_steps)
    global_batch_size: int
    tokens_per_sample: float | None  # parser.tokens_per_sample: turns samples/s into tokens/s
    unit: str  # the sweep's throughput unit
    report: Any = None
    _read_at: float = 0.0

    def poll(self, force: bool = False) -> Any:
        from sweep.probe import read_probe

        if force or time.monotonic() - self._read_at >= READ_EVERY_S:
            self._read_at = time.monotonic()
            try:
                self.report = read_probe(self.record_dir)
            except OSError:
                pass  # a record dir that vanished or cannot be read: what was read before stands
        return self.report

    @property
    def can_measure(self) -> bool:
        """Whether the probe's steps can give the sweep's unit (tokens/s needs parser.tokens_per_sample)."""
        return self.unit == "samples/s" or self.tokens_per_sample is not None

    def timed(self) -> list[float]:
        """Seconds per optimizer step after the warm-up, the slowest rank's; [] before any (or unarmed)."""
        report = self.report
        if report is None or not report.armed or not self.can_measure:
            return []
        return [float(t) for t in report.step_times_s[self.warmup_steps :] if t > 0]

    def rate(self, seconds: float) -> float:
        samples = self.global_batch_size / seconds
        return samples * float(self.tokens_per_sample) if self.unit == "tokens/s" and self.tokens_per_sample else samples

    def ok_fields(self) -> dict[str, Any]:
        """The measured fields of an ok result, from the timed steps."""
        from sweep.core.stats import throughput_summary

        times = self.timed()
        factor = self.rate(1.0) / (self.global_batch_size / 1.0)
        value, low, high = throughput_summary(times, self.global_batch_size)
        return dict(
            step_times_s=times, throughput=value * factor, throughput_low=low * factor, throughput_high=high * factor,
            throughput_unit=self.unit, steps_measured=len(times), warmup_steps=min(self.warmup_steps, len(self.report.step_times_s)),
        )

    def memory_fields(self, device: str, capacity_gib: float | None) -> dict[str, Any]:
        """Peaks from the allocator (CUDA: per device, against one device's capacity); {} where the probe saw none.

        On CPU the sampled resident memory of the whole tree stays the figure (ranks share the host's memory)."""
        report = self.report
        if report is None or not report.armed:
            return {}
        fields: dict[str, Any] = {"ranks_seen": len(report.ranks) or None, "peak_step": report.peak_step}
        if device == "cuda" and report.peak_bytes is not None:
            peak = report.peak_bytes / GIB
            fields.update(peak_mem_gib=peak, capacity_gib=capacity_gib, headroom=None if not capacity_gib else 1 - peak / capacity_gib)
            if report.peak_reserved_bytes is not None:
                fields["peak_reserved_gib"] = report.peak_reserved_bytes / GIB
            fields["step_peak_reserved_gib"] = [
                round(s.peak_reserved_bytes / GIB, 6) for s in report.steps if s.peak_reserved_bytes is not None
            ]
        return fields

    def oom(self) -> Any:
        report = self.report
        return report.oom if report is not None else None
