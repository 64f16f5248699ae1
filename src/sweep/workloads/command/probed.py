"""A command trial measured by the probe (sweep.probe): its step times, memory and OOM from inside its
own Python processes; the log preset is the fallback (probe off, or never armed: not a PyTorch
trainer) and the cross-check.

The probe's steps are optimizer steps, the slowest rank's, so throughput is the global batch over a
step's time (tokens/s where parser.tokens_per_sample says how many tokens a sample holds). A trainer
whose update is no torch.optim step (fastai's own optimizer, Keras 3 on torch, a hand-written update)
is timed by its backward passes instead, `accum` of them a step (core/probe_report.backward_step_times).
The first trial.warmup_steps probe steps are not timed, nor leading steps still warming up after them
(core/steady.py).
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
    """The attempt's own record dir, beside its log: command-3.log -> probe-3 (a rerun never reads old records);
    node k of a multi-node job: command-job<J>-node<k>.log -> probe-job<J>-node<k>."""
    return trial_dir / log_path.stem.replace("command", PROBE_PREFIX, 1)


def other_nodes_glob(tag: str) -> str:
    """The record dirs of an attempt's nodes other than node 0 (probe_dir of their logs; tag: nodes.attempt_tag)."""
    return f"{PROBE_PREFIX}-job{tag}-node*" if tag else ""


def recorded_by_every_rank(report: Any) -> list[float]:
    """Each step's seconds, less trailing steps some rank has not recorded yet.

    A step is over when every rank's is: the slowest rank's time is only known once all have written it. Another
    node's records land later than this node's own (over a shared file system, seconds later), and ranks stopped
    mid-step leave a last step some never finished; counting those, this node's faster view would stand in for
    the slowest rank's. Steps before the last whole one stay as they are (a rank armed late never records its first)."""
    everyone = len(report.ranks)
    whole = [i for i, step in enumerate(report.steps) if step.ranks >= everyone]
    return report.step_times_s[: whole[-1] + 1] if whole else []


@dataclass
class ProbeFollower:
    """What the probe has measured so far in one trial; read_probe at most every READ_EVERY_S."""

    record_dir: Path
    warmup_steps: int  # probe steps not timed (trial.warmup_steps)
    global_batch_size: int
    tokens_per_sample: float | None  # parser.tokens_per_sample: turns samples/s into tokens/s
    unit: str  # the sweep's throughput unit
    accum: int = 1  # micro-batches a step: backward passes per step where no optimizer step is seen
    other_nodes_glob: str = ""  # record dirs of this job's other nodes, beside record_dir (multi-node trials)
    report: Any = None
    reach: Any = None  # reach.ReachWatch: the command's Python processes the probe could not get into
    _read_at: float = 0.0

    def __post_init__(self) -> None:
        from sweep.probe import BOOT_DIR
        from sweep.workloads.command.reach import ReachWatch

        if self.reach is None:  # made before the command starts: it tells the command's processes from others
            self.reach = ReachWatch(Path(self.record_dir).resolve(), BOOT_DIR)

    def poll(self, force: bool = False, running: bool = True) -> Any:
        """The report, re-read if due (force: now). running=False once the command has ended: until then a process
        that stepped and exited is a preparation, not the training (core/probe_report.training_sources)."""
        from sweep.probe import read_probe

        if force or time.monotonic() - self._read_at >= READ_EVERY_S:
            self._read_at = time.monotonic()
            self.reach.scan()
            try:
                others = sorted(self.record_dir.parent.glob(self.other_nodes_glob)) if self.other_nodes_glob else []
                self.report = read_probe(self.record_dir, *others, running=running)
            except OSError:
                pass  # a record dir that vanished or cannot be read: what was read before stands
        return self.report

    @property
    def can_measure(self) -> bool:
        """Whether the probe's steps can give the sweep's unit (tokens/s needs parser.tokens_per_sample)."""
        return self.unit == "samples/s" or self.tokens_per_sample is not None

    @property
    def signal(self) -> str:
        """What times a step: "optimizer steps", "backward passes" (no torch.optim step seen), or "" (nothing yet)."""
        report = self.report
        if report is None or not report.armed:
            return ""
        if report.step_times_s:
            return "optimizer steps"
        # Backward passes time a step only where no torch.optim optimizer exists: one that has not stepped yet
        # (the trainer is still warming up, or checking gradients) will.
        return "backward passes" if report.backward_ats and not report.torch_optimizers else ""

    def after_warmup(self) -> list[float]:
        """Seconds per step after trial.warmup_steps, the slowest rank's, by the signal there is; [] before any."""
        from sweep.core.probe_report import backward_step_times

        report = self.report
        if report is None or not report.armed or not self.can_measure:
            return []
        if self.signal == "optimizer steps":
            times = recorded_by_every_rank(report)[self.warmup_steps :]
        elif self.signal == "backward passes":  # backward_step_times leaves out the first step, whose start none shows
            times = backward_step_times(report, self.accum)[max(0, self.warmup_steps - 1) :]
        else:
            times = []
        return [float(t) for t in times if t > 0]

    def timed(self) -> list[float]:
        """The steps the figure rests on: after the warm-up, less leading steps still warming up (core/steady.py)."""
        from sweep.core.steady import steady_steps

        return steady_steps(self.after_warmup())

    def rate(self, seconds: float) -> float:
        samples = self.global_batch_size / seconds
        return samples * float(self.tokens_per_sample) if self.unit == "tokens/s" and self.tokens_per_sample else samples

    def ok_fields(self) -> dict[str, Any]:
        """The measured fields of an ok result, from the timed steps."""
        from sweep.core.stats import throughput_summary
        from sweep.core.steady import steady_steps

        every = self.after_warmup()
        times = steady_steps(every)  # timed(), without reading the report's steps a second time
        transient = len(every) - len(times)
        factor = self.rate(1.0) / (self.global_batch_size / 1.0)
        value, low, high = throughput_summary(times, self.global_batch_size)
        return dict(
            untrimmed_throughput=throughput_summary(every, self.global_batch_size)[0] * factor if transient else value * factor,
            step_times_s=times, throughput=value * factor, throughput_low=low * factor, throughput_high=high * factor,
            throughput_unit=self.unit, steps_measured=len(times), transient_steps=transient,
            warmup_steps=min(self.warmup_steps, len(self.report.step_times_s) or len(times) + transient) + transient,
            probe_signal=self.signal,
        )

    def provenance_fields(self) -> dict[str, Any]:
        """What core/validity.py checks a figure against: the ranks' world size, backward passes per step, any OOM."""
        from sweep.core.probe_report import backward_per_step, backward_per_update, forward_per_step

        report = self.report
        if report is None or not report.armed:
            return {}
        oom = report.oom
        return dict(
            world_size=report.world_size,
            backward_per_step=backward_per_step(report, self.warmup_steps),
            forward_per_step=forward_per_step(report, self.warmup_steps) if report.step_times_s else None,
            backward_per_update=backward_per_update(report) if self.signal == "backward passes" else None,
            probe_oom="" if oom is None else (
                f"in {oom.module or 'no module'} during {oom.where}, step {oom.step}, rank {oom.rank}: {oom.message}"[:400]
            ),
            oom_module="" if oom is None else oom.module,
        )

    def memory_fields(self, device: str, capacity_gib: float | None) -> dict[str, Any]:
        """Peaks from the allocator (CUDA: per device, against one device's capacity); {} where the probe saw none.

        On CPU the sampled resident memory of the whole tree stays the figure (ranks share the host's memory)."""
        report = self.report
        if report is None or not report.armed:
            return {}
        trained = len(report.ranks) or len({rank for rank, _ in report.backward_ats.values()})
        fields: dict[str, Any] = {"ranks_seen": trained or None, "peak_step": report.peak_step}
        if device == "cuda" and report.peak_bytes is not None:
            peak = report.peak_bytes / GIB
            fields.update(peak_mem_gib=peak, capacity_gib=capacity_gib, headroom=None if not capacity_gib else 1 - peak / capacity_gib)
            if report.peak_reserved_bytes is not None:
                fields["peak_reserved_gib"] = report.peak_reserved_bytes / GIB
            fields["step_peak_reserved_gib"] = [
                round(s.peak_reserved_bytes / GIB, 6) for s in report.steps if s.peak_reserved_bytes is not None
            ]
            # By step, as the warm-up count (ok_fields) reads them: a retry in a timed step puts the pair at risk.
            fields["step_alloc_retries"] = report.step_retries
        return fields

    def no_figure_note(self) -> str:
        """Why the probe has no figure for a command that exited 0 (a clause of its failure line): the processes
        it could not reach and why (reach.py), and whether it saw anything at all."""
        report = self.report
        unreached = self.reach.note() if self.reach is not None else ""
        if report is not None and report.armed:
            seen = "the probe saw no optimizer step or backward pass"
            return f"{seen}; {unreached}" if unreached else seen
        return unreached or "the probe never armed: no Python process of the command imported torch"

    def oom(self) -> Any:
        report = self.report
        return report.oom if report is not None else None
