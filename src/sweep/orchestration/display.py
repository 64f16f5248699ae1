"""What the user watches: a live table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sweep.core.memory_model import counted_peak
from sweep.core.table import SweepTable, render_plain, sweep_table

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult

# Row colours on a terminal, by status.
STATUS_STYLE = {
    "ok": "green", "oom": "red", "predicted_oom": "red", "running": "yellow", "failed": "magenta",
    "timeout": "magenta", "cancelled": "magenta", "invalid": "dim", "pending": "dim", "skipped": "dim",
}


def format_table(rows: Sequence[Mapping[str, Any]], with_reasons: bool = True, show_invalid: bool = False) -> str:
    """The plain-text sweep table (core/table.py): ranked rows, why the others did not run ok, the legend.

    Invalid and skipped pairs (never launched) are only counted unless show_invalid: the dry run lists them.
    """
    return render_plain(sweep_table(rows, show_invalid=show_invalid), with_notes=with_reasons)


def rich_table(table: SweepTable, framed: bool = False) -> Any:
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

    def __init__(self, live: bool | None = None, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self._live: Any = None
        self._rows: Sequence[Mapping[str, Any]] = []
        self._progress = ""

    def __enter__(self) -> Display:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self.stream)
            self._live = Live(self._render(), console=self._console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {message}"
        if self._live is not None:
            self._console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def update(self, rows: Sequence[Mapping[str, Any]], progress: str) -> None:
        self._rows, self._progress = rows, progress
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        table = sweep_table(self._rows)
        legend = [Text(line, style="dim") for line in table.legend]
        return Group(rich_table(table), *legend, Text(self._progress, style="bold"))

    def final(self, rows: Sequence[Mapping[str, Any]], summary: Sequence[str]) -> None:
        print(file=self.stream)
        print(format_table(rows), file=self.stream)
        print(file=self.stream)
        for line in summary:
            print(line, file=self.stream)
        self.stream.flush()


def landed_line(res: TrialResult) -> str:
    head = f"accum={res.accum} split={res.split}: {res.status}"
    if res.status == "ok" and res.throughput:
        counted = counted_peak(res)
        peak = f", peak {counted:.3g} GiB" if counted is not None else ""
        return f"{head} {res.throughput:.1f} {res.throughput_unit} [{res.throughput_low:.1f}, {res.throughput_high:.1f}]{peak}"
    phase = f" in {res.oom_phase}" if res.oom_phase else ""
    log = f" (log {res.log})" if res.log and res.log not in res.error else ""
    return f"{head}{phase}: {res.error}{log}"


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
