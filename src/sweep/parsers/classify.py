"""Why a trial stopped, from its exit status and the tail of its log.

The statuses are results.py's: an out-of-memory error (with the phase of the
training step it hit, when the traceback shows it) is "oom" -- the sweep
treats that candidate as too big, not as broken; anything else that went
wrong is "failed", with the one line a person should read first.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sweep.core.probe_report import CompiledPhasePatterns, compile_phase_regexes
from sweep.core.schema import (
    CANCELLED,
    FAILED,
    OK,
    OOM,
    PHASE_ENCODER,
    PHASE_JOINT,
    PHASE_OPTIMIZER,
    TIMEOUT,
    OomPhase,
    Status,
)
from sweep.parsers.lines import clean_line

MAX_REASON_CHARS = 300


@dataclass(frozen=True)
class Classification:
    status: Status  # one of FINISHED_STATUSES
    oom_phase: OomPhase | None  # when status is OOM and the traceback shows it
    reason: str  # one line, at most MAX_REASON_CHARS; "" for ok


# A sampled peak at or above this fraction of the capacity makes a SIGKILL an OOM. The sampler
# polls (every 0.2 s for a command), so the true peak is at least the sampled one and usually
# above it: a step that was sampled at 90% can reach the limit between two samples. Below that,
# a kill needs a jump of over a tenth of the device (or host) between samples, which the cgroup's
# or the kernel's own record would show; without that record the kill is not called an OOM.
OOM_PEAK_FRACTION = 0.9


@dataclass(frozen=True)
class KillEvidence:
    """What the launcher could find out about memory when something in the trial was SIGKILLed.

    None in a field means that source could not be read, which is not evidence either way.
    """

    oom_kills: int | None = None  # the cgroup's memory.events oom_kill count rose during the trial by this much
    kernel_oom: bool | None = None  # the kernel log names this process tree as OOM-killed
    peak_fraction: float | None = None  # sampled peak / capacity

    def shows_oom(self) -> bool:
        """True when any source says the memory ran out."""
        return bool(self.oom_kills) or self.kernel_oom is True or (
            self.peak_fraction is not None and self.peak_fraction >= OOM_PEAK_FRACTION
        )

    def describe(self) -> str:
        """The evidence as a phrase, for a reason line."""
        parts = []
        if self.oom_kills is not None:
            parts.append(f"the cgroup's oom_kill count rose by {self.oom_kills}" if self.oom_kills > 0
                         else "the cgroup's oom_kill count did not rise")
        if self.kernel_oom is not None:
            parts.append("the kernel log names it as OOM-killed" if self.kernel_oom
                         else "the kernel log names no OOM kill of it")
        if self.peak_fraction is not None:
            parts.append(f"sampled peak {self.peak_fraction:.2g} of capacity")
        return "; ".join(parts) or "no memory evidence could be read"


# Searched in each traceback frame line, `File "<path>", line <n>, in <function>`,
# so a pattern can name a function (", in joint$") or a module path.
# Defaults: the built-in RNN-T step's functions plus common generic names.
DEFAULT_PHASE_PATTERNS: dict[str, tuple[str, ...]] = {
    PHASE_ENCODER: (
        r", in (?:encode|_encode|encoder|forward_encoder|backward_encoder|predict|_predict|prediction|predictor)$",
    ),
    PHASE_JOINT: (
        r", in (?:joint_and_loss|joint|_joint|joint_net|rnnt_loss|transducer_loss|loss|compute_loss|loss_fn)$",
    ),
    PHASE_OPTIMIZER: (
        r"[/\\]torch[/\\]optim[/\\]",  # Optimizer.step and its per-algorithm kernels
        r"[/\\]apex[/\\]optimizers[/\\]",
        r"grad_scaler\.py\", line \d+, in (?:step|unscale_|_unscale_grads_)$",
        r", in (?:optimizer_step|all_reduce|allreduce|_all_reduce|all_reduce_coalesced|clip_grad_norm_)$",
    ),
}

CompiledPatterns = CompiledPhasePatterns


def compile_phase_patterns(patterns: Mapping[str, Sequence[str] | str] | None) -> CompiledPatterns:
    """Validate and compile phase patterns; None gives the defaults.

    Patterns given replace the defaults entirely, so a user's own script is not
    matched against names from the built-in model; to extend the defaults,
    merge DEFAULT_PHASE_PATTERNS in first. Raises ValueError, one line.
    """
    return compile_phase_regexes(DEFAULT_PHASE_PATTERNS if patterns is None else patterns, "phase_patterns")


# An allocation failure on the device (or in the process): the candidate needs too much memory.
# CUDNN_STATUS_NOT_ENOUGH_WORKSPACE counts: cuDNN could not get its workspace because
# activations filled the device, and a smaller micro-batch is the fix, as for any OOM.
_DEVICE_OOM = re.compile(
    r"(?:CUDA|HIP|MPS|XPU) out of memory"
    r"|CUDA error: out of memory"
    r"|OutOfMemoryError"
    r"|CUBLAS_STATUS_ALLOC_FAILED"
    r"|CUDNN_STATUS_ALLOC_FAILED|CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"
    r"|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
    r"|^(?:[A-Za-z_][\w.]*\.)?_?\w*MemoryError\b"  # Python's MemoryError, numpy's _ArrayMemoryError
    r"|Cuda failure (?:\d+ )?'?out of memory|Failed to CUDA calloc"  # NCCL's WARN, old and new (with the code)
    r"|RESOURCE_EXHAUSTED: Out of memory|ResourceExhaustedError"
    # Trainers' own words for an OOM they caught (the allocator's message may be elsewhere, or not in the tail):
    r"|attempting to recover from OOM in forward/backward pass|OOM in all workers, skipping update"  # fairseq
    r"|Your GPU ran out of memory with the current max_duration setting"  # icefall's pessimistic-batch scan
    r"|^\s*Current gap: \S*\.\.\.\s*OOM!",  # NeMo's OOMptimizer, for a step it ran out of memory in
    re.IGNORECASE,
)
# The host ran out: the kernel's or the cgroup's OOM killer, as the kernel, Slurm or torch report it.
_HOST_OOM = re.compile(
    r"\boom[-_ ]?kill"  # "invoked oom-killer", "oom_kill event", "Detected 1 oom-kill event(s)"
    r"|Out of memory: Kill(?:ed)? process"
    r"|Memory cgroup out of memory"
    r"|\bOUT_OF_MEMORY\b"
    r"|task \d+: Out Of Memory"  # srun
    r"|exceeded (?:job |step )?memory limit",
    re.IGNORECASE,
)
_SLURM_STOP = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?P<why>.*?)\*\*\*")
# Something was SIGKILLed. The OOM killer is one sender among several (a user, a scheduler,
# a watchdog), so a kill is an OOM only with KillEvidence that says so.
_KILLED = re.compile(
    r"Signal 9 \(SIGKILL\) received"  # torchrun's summary of a failed rank
    r"|is killed by signal: Killed"  # a DataLoader worker
    r"|exitcode\s*:\s*-9\b"
    r"|terminated with signal SIGKILL"  # torch.multiprocessing.spawn
    r"|^(?:.*: line \d+: +)?\d+ Killed\b"  # bash: "line 3: 12345 Killed   python train.py"
    r"|^Killed$"
)
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*_?[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure)\b(?::.*)?$")
# Launchers' exceptions that only say a child failed; the child's own error says why.
_WRAPPER = re.compile(r"ChildFailedError|CalledProcessError|ProcessRaisedException|ProcessExitedException")
# What follows an OOM because of it: the ranks that did not run out fail in their next
# collective (NCCL, gloo, the c10d store, the watchdog), torchrun stops the rest with a
# signal, a launcher reports its child, DataLoader workers lose their parent.
_CONSEQUENCE = re.compile(
    r"DistBackendError|DistNetworkError|DistStoreError|NCCL (?:error|communicator)|\bnccl\w*Error"
    r"|Watchdog caught collective|ProcessGroup(?:NCCL|Gloo)|\bgloo\b|\[c10d\]"
    r"|Connection (?:closed|reset) by peer|ConnectionResetError|BrokenPipeError|SignalException"
    r"|gradients are inconsistent between workers"  # fairseq, after the rank that skipped its OOM batch
)
_CHAINED = re.compile(
    r"^(?:The above exception was the direct cause of the following exception"
    r"|During handling of the above exception, another exception occurred):"
)
_STOPPED = re.compile(r"^(?:[\w.]+\.)?(?:KeyboardInterrupt|SignalException)\b")
_ERRORISH = re.compile(
    r"error|fatal|NCCL WARN|segmentation fault|terminate called|what\(\)|abort|core dumped|killed", re.IGNORECASE
)
_TB_HEADER = re.compile(r"^Traceback \(most recent call last\):")
_FRAME = re.compile(r'^\s+File "[^"]*", line \d+, in \S')
_CANCEL_SIGNALS = {_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP}
_SPLIT = re.compile(r"\r\n|\r|\n")


def classify_failure(
    log_tail: str,
    exit_code: int | None,
    signal: int | None = None,
    phase_patterns: Mapping[str, Sequence[str] | str] | None = None,
    *,
    exit_zero_is_failure: bool = False,
    kill_evidence: KillEvidence | None = None,
) -> Classification:
    """Classify a finished trial from the end of its log and how it exited.

    exit_code follows subprocess (negative: killed by that signal) or the shell
    (128 + signal); `signal` may be given on its own. Exit 0 is "ok" unless
    exit_zero_is_failure (the caller found no throughput): then the log is
    examined as for a crash. Call it only for trials sweep itself did not stop:
    its own time-limit kill is a timeout, which this cannot tell from the OOM killer.
    kill_evidence: what the launcher read about memory; a SIGKILL (of the
    command or of a child the log names) is "oom" only when it shows_oom().
    """
    patterns = compile_phase_patterns(phase_patterns)
    sig = _signal_number(exit_code, signal)
    if exit_code == 0 and sig is None and not exit_zero_is_failure:
        return Classification(OK, None, "")
    log = _Log(log_tail)

    # The exception that ended the process decides, so an OOM counts only when nothing
    # independent of it was raised later: an OOM the script caught and lived past is not
    # why it died. What an OOM causes does not count against it: the other ranks failing
    # in their next collective, the launcher's report, an exception chained to it.
    hit = next((line for line in log.lines if _DEVICE_OOM.search(line.text) and log.ended_by(line)), None)
    if hit is not None:
        return Classification(OOM, _phase(log.frames_before(hit), patterns), log.reason(hit))
    hit = log.last(_HOST_OOM)
    if hit is not None:
        return Classification(OOM, None, log.reason(hit))
    hit = log.last(_SLURM_STOP)
    if hit is not None:
        why = _SLURM_STOP.search(hit.text).group("why")  # type: ignore[union-attr]
        status = TIMEOUT if "TIME LIMIT" in why else FAILED if "NODE FAIL" in why else CANCELLED
        return Classification(status, None, log.reason(hit))

    exc = log.last_exception()
    cause = exc if exc is not None and not _WRAPPER.search(exc.text) and not _KILLED.search(exc.text) else None
    what = _describe(exit_code, sig)
    killed = log.last(_KILLED)
    evidence = kill_evidence or KillEvidence()
    if (sig == _signal.SIGKILL or killed is not None or evidence.shows_oom()) and cause is None:
        if sig != _signal.SIGKILL and killed is not None:
            what = log.reason(killed)  # a child was killed; the launcher itself exited normally
        if evidence.shows_oom():
            return Classification(OOM, None, one_line(f"{what}: out of memory ({evidence.describe()})"))
        if sig == _signal.SIGKILL or killed is not None:
            return Classification(FAILED, None, one_line(
                f"{what} with no sign of running out of memory ({evidence.describe()})"))
    if cause is not None and _STOPPED.match(cause.text):
        return Classification(CANCELLED, None, log.reason(cause))
    if sig in _CANCEL_SIGNALS and cause is None:
        return Classification(CANCELLED, None, one_line(f"stopped: {what}"))
    if exc is not None:
        return Classification(FAILED, None, log.reason(cause or exc))
    line = log.last(_ERRORISH) or log.last(re.compile(r"\S"))
    if exit_code == 0 and sig is None:
        what = "exited 0 without a throughput figure"
    tail = f": {log.reason(line)}" if line is not None else "; the log tail is empty"
    return Classification(FAILED, None, one_line(what + tail))


def no_throughput_reason(log_path: str | Path, parser_type: str | None = None) -> str:
    """One line for a trial that exited 0 but whose log gave no throughput."""
    path = Path(log_path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return one_line(f"no throughput: the log {path} was never written")
    except OSError as e:
        return one_line(f"no throughput: cannot read the log {path} ({e.strerror})")
    if size == 0:
        return one_line(f"no throughput: the log {path} is empty")
    fmt = f" in {parser_type!r} format" if parser_type else ""
    return one_line(
        f"no throughput line{fmt} in {path} ({size} bytes); "
        "check the workload's parser: section against what the command prints"
    )


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """Text as one line of at most `limit` characters."""
    text = " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class _Line:
    text: str
    rank: int | None
    pos: int  # index within its rank's stream
    index: int  # index within the whole log


class _Log:
    """A log tail as lines, each also filed under the rank that printed it.

    Ranks' tracebacks interleave line by line when they fail together; read
    per rank, each is whole again.
    """

    def __init__(self, text: str) -> None:
        self.lines: list[_Line] = []
        self.streams: dict[int | None, list[_Line]] = {}
        for raw in _SPLIT.split(text):
            rank, line = clean_line(raw)
            stream = self.streams.setdefault(rank, [])
            entry = _Line(line.rstrip(), rank, len(stream), len(self.lines))
            stream.append(entry)
            self.lines.append(entry)

    def first(self, rx: re.Pattern[str]) -> _Line | None:
        return next((line for line in self.lines if rx.search(line.text)), None)

    def last(self, rx: re.Pattern[str]) -> _Line | None:
        return next((line for line in reversed(self.lines) if rx.search(line.text)), None)

    def last_exception(self) -> _Line | None:
        """The last exception line, preferring one that is not a launcher's wrapper."""
        found = [line for line in self.lines if _EXCEPTION.match(line.text)]
        causes = [line for line in found if not _WRAPPER.search(line.text)]
        return (causes or found)[-1] if found else None

    def ended_by(self, hit: _Line) -> bool:
        """True when no exception independent of `hit` comes after it.

        Independent: not an OOM itself, not a consequence (_CONSEQUENCE, a launcher's
        wrapper), and not chained to `hit` by Python's "direct cause" or "during
        handling" lines in hit's own stream.
        """
        chained_to_hit = self._chained_after(hit)
        for line in self.lines[hit.index + 1:]:
            if not _EXCEPTION.match(line.text) or line.index in chained_to_hit:
                continue
            if not (_DEVICE_OOM.search(line.text) or _CONSEQUENCE.search(line.text) or _WRAPPER.search(line.text)):
                return False
        return True

    def _chained_after(self, hit: _Line) -> set[int]:
        """Log indexes of the exceptions after `hit` in its stream that chain back to it."""
        chained, linked, pending = set(), True, False
        for line in self.streams[hit.rank][hit.pos + 1:]:
            if _CHAINED.match(line.text):
                pending = True
            elif _TB_HEADER.match(line.text):
                linked, pending = linked and pending, False
            elif linked and _EXCEPTION.match(line.text):
                chained.add(line.index)
        return chained

    def frames_before(self, hit: _Line) -> list[str]:
        """Frame lines of the traceback that ends at `hit`, outermost first."""
        stream = self.streams[hit.rank]
        i = hit.pos - 1
        # Step back over the rest of a multi-line exception message (NCCL's are).
        for _ in range(8):
            if i < 0 or stream[i].text[:1].isspace():
                break
            if not stream[i].text or _TB_HEADER.match(stream[i].text):
                return []
            i -= 1
        frames: list[str] = []
        while i >= 0:
            text = stream[i].text
            if _FRAME.match(text):
                frames.append(text.strip())
            elif not text[:1].isspace():
                break  # the header, a blank line, or output before the traceback
            i -= 1
        frames.reverse()
        return frames

    def reason(self, line: _Line) -> str:
        return one_line(line.text if line.rank is None else f"rank {line.rank}: {line.text}")


def _phase(frames: list[str], patterns: CompiledPatterns) -> OomPhase | None:
    """The phase of the innermost frame any pattern matches."""
    phase = None
    for frame in frames:
        for name, regexes in patterns:
            if any(rx.search(frame) for rx in regexes):
                phase = OomPhase(name)  # compile_phase_regexes let only OomPhase's names through
                break
    return phase


def _signal_number(exit_code: int | None, sig: int | None) -> int | None:
    if sig:
        return sig
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code <= 128 + 64:  # the shell's way of saying "killed by signal N"
        return exit_code - 128
    return None


def _describe(exit_code: int | None, sig: int | None) -> str:
    if sig is None:
        return "no exit status" if exit_code is None else f"exit status {exit_code}"
    try:
        name = _signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return f"killed by {name}" + ("" if exit_code is None else f" (exit status {exit_code})")
