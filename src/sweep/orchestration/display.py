"""What the user watches: a live table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from sweep.core.memory_model import counted_peak
from sweep.core.table import Row, SweepTable, render_plain, sweep_table, table_rows

if TYPE_CHECKING:
    from rich.console import Group
    from rich.live import Live
    from rich.table import Table

    from sweep.core.drift import Drift
    from sweep.core.recommendation import Recommendation
    from sweep.core.schema import TrialResult

# Row colours on a terminal, by status.
STATUS_STYLE = {
    "ok": "green", "oom": "red", "predicted_oom": "red", "running": "yellow", "failed": "magenta",
    "timeout": "magenta", "cancelled": "magenta", "invalid": "dim", "pending": "dim", "skipped": "dim",
}


# The live view's columns, least needed first: dropped in this order until the table fits the terminal
# (rich would otherwise cut every header to "r… ac…"). accum, split, status and the throughput stay.
DROP_FIRST = ("wall s", "peak GiB", "joint", "per_dev", "rank", "steps", "95% interval", "speedup", "mark")
# Finished pairs first (ok ranked, then why the others did not run ok), then what is still coming.
_LIVE_ORDER = {"ok": 0, "oom": 1, "predicted_oom": 1, "failed": 1, "timeout": 1, "cancelled": 1, "running": 2, "pending": 3}
_COLUMN_GAP = 2  # rich's default padding: one space either side of each cell


def table_width(table: SweepTable) -> int:
    """Characters one line of this table takes in the live view."""
    widths = [max([len(h)] + [len(row[i]) for row in table.cells()]) for i, h in enumerate(table.headers)]
    return sum(widths) + _COLUMN_GAP * len(widths)


def fit_columns(table: SweepTable, width: int) -> SweepTable:
    """The table with the least needed columns dropped until it fits `width` (never a cut header)."""
    for header in DROP_FIRST:
        if table_width(table) <= width:
            break
        table = replace(table, columns=tuple(c for c in table.columns if c.header != header))
    return table


def live_rows(rows: Sequence[Row], height: int) -> tuple[list[Row], str]:
    """The rows the live view shows in `height` lines, finished first, and a line counting what it left out.

    Pending pairs are only counted. When finished and running rows are more than fit, running rows stay,
    and the lines left are shared between the fastest ok rows and the rows that did not run ok (OOMs show).
    """
    shown = sorted((r for r in rows if str(r.status) in _LIVE_ORDER), key=lambda r: _LIVE_ORDER[str(r.status)])
    ok = [r for r in shown if r.status == "ok"]
    not_ok = [r for r in shown if _LIVE_ORDER[str(r.status)] == 1]
    running = [r for r in shown if r.status == "running"]
    pending = sum(r.status == "pending" for r in shown)
    budget = max(2, height - len(running))
    if len(ok) + len(not_ok) > budget:
        n_not_ok = min(len(not_ok), max(budget // 2, budget - len(ok)))
        n_ok = budget - n_not_ok
        left_out = len(ok) - n_ok + len(not_ok) - n_not_ok
        ok, not_ok = ok[:n_ok], not_ok[:n_not_ok]
    else:
        left_out = 0
    more = [f"{left_out} more finished (all in trials.csv)"] if left_out else []
    more += [f"{pending} pending"] if pending else []
    return ok + not_ok + running, ", ".join(more)


def format_table(rows: Sequence[Row | Mapping[str, Any]], with_reasons: bool = True, show_invalid: bool = False) -> str:
    """The plain-text sweep table (core/table.py): ranked rows, why the others did not run ok, the legend.

    Invalid and skipped pairs (never launched) are only counted unless show_invalid: the dry run lists them.
    """
    return render_plain(sweep_table(rows, show_invalid=show_invalid), with_notes=with_reasons)


def rich_table(table: SweepTable, framed: bool = False) -> Table:
    """The same model as a rich Table (a terminal); the caller prints notes and footer under it.

    framed: column rules (the report); the live view stays bare so it redraws compactly.
    """
    from rich.table import Table

    out = Table(show_edge=False, header_style="bold") if framed else Table(box=None, header_style="bold")
    for header, right in zip(table.headers, table.right):
        out.add_column(header, justify="right" if right else "left", no_wrap=True)
    for row, cells in zip(table.rows, table.cells()):
        out.add_row(*cells, style=STATUS_STYLE.get(str(row.status), ""))
    return out


class Display:
    """Plain lines (CI logs, pipes) or a rich live table (a terminal)."""

    def __init__(self, live: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self._live: Live | None = None
        self._rows: Sequence[Row] = []
        self._progress = ""

    def __enter__(self) -> Display:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.stream)
            self._live = Live(self._render(), console=self._console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(kind, exc, tb)
            self._live = None

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {message}"
        if self._live is not None:
            self._console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def update(self, rows: Sequence[Row], progress: str) -> None:
        self._rows, self._progress = rows, progress
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Group:
        # The live console's size; without one (not live: nothing is drawn) a wide view, the whole model.
        console = getattr(self, "_console", None)
        width, height = console.size if console is not None else (200, 50)
        return live_view(self._rows, self._progress, width, height)

    def final(self, rows: Sequence[Row], summary: Sequence[str]) -> None:
        print(file=self.stream)
        print(format_table(rows), file=self.stream)
        print(file=self.stream)
        for line in summary:
            print(line, file=self.stream)
        self.stream.flush()


def live_view(rows: Sequence[Row | Mapping[str, Any]], progress: str, width: int, height: int) -> Group:
    """What the live view draws on a width x height terminal: the table (finished first, columns that fit), the
    legend, what was left out, and the progress line. Log lines scroll above it, so it takes at most half the
    height (and never fewer than 8 lines)."""
    import io

    from rich.console import Console, Group
    from rich.text import Text

    typed = table_rows(rows)
    full = sweep_table(typed)
    lines = max(8, height // 2)
    legend = [Text(line, style="dim", overflow="fold") for line in full.legend]
    # As rich wraps them (at word boundaries: more lines than their length over the width).
    measure = Console(file=io.StringIO(), width=max(1, width))
    legend_lines = sum(len(text.wrap(measure, max(1, width))) for text in legend)
    body = lines - 2 - legend_lines - 1  # the header, the "more" line, the legend and the progress line
    shown, more = live_rows(typed, body)
    table = fit_columns(sweep_table(shown, show_split="split" in full.headers), width)  # a split axis if the sweep has one
    tail = [Text(more, style="dim")] if more else []
    return Group(rich_table(table), *tail, *legend, Text(progress, style="bold"))


def landed_line(res: TrialResult) -> str:
    head = f"accum={res.accum} split={res.split}: {res.status}"
    if res.status == "ok" and res.throughput:
        counted = counted_peak(res)
        peak = f", peak {counted:.3g} GiB" if counted is not None else ""
        return f"{head} {res.throughput:.1f} {res.throughput_unit} [{res.throughput_low:.1f}, {res.throughput_high:.1f}]{peak}"
    phase = f" in {res.oom_phase}" if res.oom_phase else ""
    log = f" (log {res.log})" if res.log and res.log not in res.error else ""
    return f"{head}{phase}: {res.error}{log}"


def summary_lines(results: dict[str, TrialResult], rec: Recommendation | None, drift: Drift | None, scaling: bool,
                  answer: bool = True) -> list[str]:
    """The lines under the final table: the trials' statuses, the recommendation and its flags (not answer: none, as a
    screening sweep's rows only nominate pairs), the drift check's verdict, and for search=powers the scaling check."""
    from sweep.core.recommendation import recommendation_line

    counts: dict[str, int] = {}
    for r in results.values():
        counts[r.status] = counts.get(r.status, 0) + 1
    lines = ["trials: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    if answer:
        lines.append(recommendation_line(rec))
        lines += [f"flags: {rec.flags}"] if rec is not None else []
    if drift is not None:
        lines.append(drift.line())
    if answer and rec is not None and rec.busy_host_note:  # once, under the answer it qualifies
        lines.append(rec.busy_host_note)
    return lines + (scaling_lines(results) if scaling else [])


def scaling_lines(results: dict[str, TrialResult]) -> list[str]:
    """The tuning playbook's check: doubling the batch should nearly double throughput."""
    from sweep.core.scaling import SCALING_FLAG_RATIO, scaling_report

    lines = ["scaling (fastest pair per per-device batch):"]
    for step in scaling_report(results):
        verdict = step["note"] or "keeps pace"
        lines.append(
            f"  per_device_batch {step['per_device_batch_from']} -> {step['per_device_batch_to']}: "
            f"{step['throughput_ratio']:.2f}x throughput ({verdict})"
        )
    if len(lines) == 1:
        lines.append("  fewer than two per-device batch sizes ran ok")
    lines.append(f"  (bar: {SCALING_FLAG_RATIO}x per doubling)")
    return lines
