"""What every log parser shares: measurements, line splitting, rank prefixes.

Logs are handled as bytes and cut into lines before decoding, so a chunk
boundary can fall anywhere (inside a line, between \\r and \\n, inside a UTF-8
sequence) without changing what is parsed. UTF-8 never uses the bytes \\r or
\\n inside a multi-byte character, so cutting bytes at them is safe.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

# A line longer than this is cut: a log with no newline for a gigabyte (a
# binary dump, a progress bar drawn with backspaces) must not grow the buffer.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class Measurement:
    """One figure read from a log: a rate or a step time, in `unit` (sweep.parsers.throughput converts it).

    The built-in formats (myrtle, regex, jsonl) read samples/s; the framework presets
    also read tokens/s, step times and progress-bar rates, marked by `unit`.
    """

    throughput: float  # the figure as printed, in `unit` (named for the samples/s the first formats read)
    epoch: int | None = None
    step: int | None = None  # optimizer step (or iteration) the figure is for; None: an epoch average
    step_time_s: float | None = None  # seconds that step took, where the log says
    epoch_time_s: float | None = None  # seconds the epoch took, for an epoch average
    line: int = 0  # 1-based line number in the log; a lone \r also ends a line
    rank: int | None = None  # from an interleaved-rank prefix such as "[rank1]:" or "1: "
    unit: str = "samples/s"  # one of sweep.parsers.throughput.FIGURE_UNITS
    per_device: bool = False  # the figure is one device's share (torchtitan's tps): scaled by the device count
    global_batch_size: int | None = None  # samples per optimizer step, where the line prints it (Megatron)
    tokens_per_sample: float | None = None  # where the line prints it (fairseq: wpb / bsz)

    @property
    def value(self) -> float:
        """The figure as printed, in `unit`."""
        return self.throughput


@dataclass(frozen=True)
class Selection:
    """The figure a trial reports, and one line saying which one it is."""

    measurement: Measurement
    note: str
    after_warmup: bool  # True when the figure is known to come after the skipped warm-up epochs

    @property
    def throughput(self) -> float:
        return self.measurement.throughput


def select_measurement(measurements: Sequence[Measurement], skip_first_epochs: int = 1) -> Selection | None:
    """Pick the figure to report: the epoch after the warm-up epochs, else the last one.

    The first epoch includes warm-up (cuDNN autotuning, allocator growth, data
    loader start-up), so Myrtle's recipe compares the second epoch. Epoch
    averages are preferred over per-step figures of the same epoch. Epochs are
    counted in the order they appear, so a resumed run that starts at epoch 5
    still skips its own first epoch. None when there are no measurements.
    """
    if skip_first_epochs < 0:
        raise ValueError(f"skip_first_epochs={skip_first_epochs} must be >= 0")
    if not measurements:
        return None
    averages = [m for m in measurements if m.epoch is not None and m.step is None]
    pool = averages or [m for m in measurements if m.epoch is not None]
    if not pool:
        last = measurements[-1]
        return Selection(last, f"last figure in the log (line {last.line}); the log numbers no epochs", False)
    epochs = list(dict.fromkeys(m.epoch for m in pool))
    what = "average" if averages else "last step"
    if len(epochs) > skip_first_epochs:
        target = epochs[skip_first_epochs]
        chosen = [m for m in pool if m.epoch == target][-1]
        note = f"epoch {target} {what} (line {chosen.line}); skipped {skip_first_epochs} warm-up epoch(s)"
        return Selection(chosen, note, True)
    chosen = pool[-1]
    note = (
        f"epoch {chosen.epoch} {what} (line {chosen.line}) includes warm-up: "
        f"only {len(epochs)} epoch(s) logged, {skip_first_epochs} to skip"
    )
    return Selection(chosen, note, skip_first_epochs == 0)


# Rank numbers are capped at 6 digits: int() refuses very long digit strings.
_RANK_PREFIX = re.compile(
    r"^[ \t]*(?:"
    r"\[(?:rank|default)(?P<torchrun>\d{1,6})\]:"  # torchrun --tee / --log-line-prefix-template
    r"|\[\d+,(?P<mpirun>\d{1,6})\]<std(?:out|err)>:"  # mpirun --tag-output
    r"|(?P<srun>\d{1,6}): "  # srun --label
    r") ?"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """(rank, rest) for a line a launcher prefixed with its rank, else (None, text)."""
    m = _RANK_PREFIX.match(text)
    if m is None:
        return None, text
    return int(m.group("torchrun") or m.group("mpirun") or m.group("srun")), text[m.end():]


def clean_line(text: str) -> tuple[int | None, str]:
    """Strip colour codes and a rank prefix: (rank, text)."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return split_rank_prefix(text)


def to_float(value: Any) -> float | None:
    """A finite, non-negative number from a JSON value or log text; None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip().replace(",", "").replace("_", "")
        if len(value) > 64:  # no real figure is this long; float() on megabytes of digits is slow
            return None
        try:
            value = float(value)
        except ValueError:
            return None
    if not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:  # a huge JSON integer
        return None
    return value if math.isfinite(value) and value >= 0 else None


def to_int(value: Any) -> int | None:
    """An index (epoch, step) from a JSON value or log text; None if it is not a whole number."""
    f = to_float(value)
    return int(f) if f is not None and f.is_integer() else None


class LineSplitter:
    """Cuts a byte stream into lines at \\n, \\r\\n or a lone \\r, however it is chunked.

    A lone \\r ends a line because progress bars (tqdm) redraw with it; each
    redraw is a line of its own. Lines are cut to max_line_bytes.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()  # the unfinished last line
        self._after_cr = False  # the stream so far ends in a \r: a \n next is part of that line break
        self._discarding = False  # the unfinished line reached _max; drop bytes up to its end

    def feed(self, chunk: bytes) -> list[bytes]:
        if isinstance(chunk, str):
            raise TypeError("feed() takes bytes; open the log in binary mode or encode the text")
        chunk = bytes(chunk)
        if self._after_cr and chunk:
            self._after_cr = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        lines: list[bytes] = []
        if self._discarding:
            cut = first_break(chunk)
            if cut < 0:
                return lines
            lines.append(bytes(self._buf))
            self._buf.clear()
            self._discarding = False
            chunk = self._skip_break(chunk, cut)
        if not chunk:
            return lines
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if end < 0:
            self._buf += chunk
            self._check_overflow()
            return lines
        if self._buf:
            block = bytes(self._buf) + chunk[: end + 1]
            self._buf.clear()
        else:
            block = chunk[: end + 1]
        self._buf += chunk[end + 1 :]
        self._after_cr = chunk[end] == 0x0D and end + 1 == len(chunk)
        limit = self._max
        lines.extend(line if len(line) <= limit else line[:limit] for line in block.splitlines())
        self._check_overflow()
        return lines

    def close(self) -> list[bytes]:
        """The unterminated last line, if any (a log cut off mid-line)."""
        self._after_cr = self._discarding = False
        if not self._buf:
            return []
        line = bytes(self._buf)
        self._buf.clear()
        return [line]

    def _skip_break(self, chunk: bytes, cut: int) -> bytes:
        """The chunk after the line break at `cut`, treating \\r\\n as one break."""
        if chunk[cut] == 0x0D:
            if cut + 1 == len(chunk):
                self._after_cr = True
            elif chunk[cut + 1] == 0x0A:
                cut += 1
        return chunk[cut + 1 :]

    def _check_overflow(self) -> None:
        if len(self._buf) > self._max:
            del self._buf[self._max :]
            self._discarding = True


def first_break(data: bytes) -> int:
    lf, cr = data.find(b"\n"), data.find(b"\r")
    return lf if cr < 0 else cr if lf < 0 else min(lf, cr)


class LineParser(ABC):
    """An incremental log parser: feed() it byte chunks, close() it at the end.

    Subclasses parse one decoded line, with any rank prefix and colour codes
    already removed. They must not raise on any input: a log is never wrong.
    """

    # Bytes every matching line contains; lines without them are skipped
    # undecoded, which keeps gigabyte logs cheap. None: look at every line.
    needle: ClassVar[bytes | None] = None

    def __init__(self) -> None:
        self._splitter = LineSplitter()
        self._lines = 0

    @property
    def lines_seen(self) -> int:
        return self._lines

    def feed(self, chunk: bytes) -> list[Measurement]:
        return self._parse_lines(self._splitter.feed(chunk))

    def close(self) -> list[Measurement]:
        """Parse a truncated last line. The parser stays usable (e.g. after a log restarts)."""
        return self._parse_lines(self._splitter.close())

    @abstractmethod
    def parse_line(self, text: str) -> Measurement | None:
        """The measurement on one line, or None; line and rank are filled in by the caller."""

    def _parse_lines(self, lines: list[bytes]) -> list[Measurement]:
        out: list[Measurement] = []
        first = self._lines + 1
        self._lines += len(lines)
        needle = self.needle
        for number, raw in enumerate(lines, first):
            if needle is not None and needle not in raw:
                continue
            rank, text = clean_line(raw.decode("utf-8", errors="replace"))
            m = self.parse_line(text)
            if m is not None:
                out.append(replace(m, line=number, rank=rank))
        return out
