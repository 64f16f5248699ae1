"""What the user watches: a live table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from sweep.core.schema import TrialResult

# (header, column, format) for the printed table; the CSV keeps every column.
_SHOWN = [
    ("rank", "rank", "{}"),
    ("accum", "accum", "{}"),
    ("split", "split", "{}"),
    ("per_dev", "per_device_batch", "{}"),
    ("joint", "joint_batch", "{}"),
    ("status", "status", "{}"),
    ("phase", "oom_phase", "{}"),
    ("samples/s", "throughput_samples_per_s", "{:.1f}"),
    ("95% interval", None, ""),
    ("speedup", "speedup", "{:.2f}x"),
    ("peak GiB", "peak_mem_gib", "{:.3g}"),
    ("wall s", "wall_s", "{:.1f}"),
]


def _cell(row: Mapping[str, Any], column: str | None, fmt: str) -> str:
    if column is None:
        lo, hi = row.get("throughput_low_samples_per_s"), row.get("throughput_high_samples_per_s")
        return f"{lo:.1f}-{hi:.1f}" if lo is not None and hi is not None else ""
    value = row.get(column)
    return "" if value is None or value == "" else fmt.format(value)


def format_table(rows: Sequence[Mapping[str, Any]], with_reasons: bool = True, show_invalid: bool = False) -> str:
    """A plain-text table: the ranked rows, then why the others did not run ok.

    Invalid pairs (never launched) are only counted unless show_invalid: the dry run lists them.
    """
    invalid = [r for r in rows if r["status"] == "invalid"]
    skipped = sum(r["status"] == "skipped" for r in rows)
    if not show_invalid:
        rows = [r for r in rows if r["status"] not in ("invalid", "skipped")]
    body = [[_cell(r, col, fmt) for _, col, fmt in _SHOWN] for r in rows]
    headers = [h for h, _, _ in _SHOWN]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths)) for b in body]
    if with_reasons:
        notes = [
            f"  accum={r['accum']} split={r['split']} {r['status']}: {r['reason']}"
            for r in rows
            if r.get("reason") and r["status"] not in ("ok", "pending", "running", "skipped")
        ]
        if notes:
            lines += ["", "Not run ok:"] + notes
    if skipped:
        lines += ["", f"{skipped} pair(s) skipped: the search ruled them out (OOM implied, or they cannot beat the leader)"]
    if invalid and not show_invalid:
        lines += ["", f"{len(invalid)} invalid pair(s) not launched (a batch size would not be an integer); dry_run=true lists them"]
    return "\n".join(lines)


class Display:
    """Plain lines (CI logs, pipes) or a rich live table (a terminal)."""

    def __init__(self, live: bool | None = None, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.t0 = time.monotonic()
        self._live: Any = None
        self._rows: Sequence[Mapping[str, Any]] = []
        self._progress = ""

    def __enter__(self) -> "Display":
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
        from rich.table import Table
        from rich.text import Text

        table = Table(box=None, header_style="bold")
        for header, _, _ in _SHOWN:
            table.add_column(header, justify="right")
        colours = {"ok": "green", "oom": "red", "running": "yellow", "failed": "magenta", "timeout": "magenta"}
        for row in self._rows:
            if row["status"] == "invalid":
                continue
            style = colours.get(row["status"], "")
            table.add_row(*[_cell(row, col, fmt) for _, col, fmt in _SHOWN], style=style)
        return Group(table, Text(self._progress, style="bold"))

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
        peak = f", peak {res.peak_mem_gib:.3g} GiB" if res.peak_mem_gib is not None else ""
        return f"{head} {res.throughput:.1f} samples/s [{res.throughput_low:.1f}, {res.throughput_high:.1f}]{peak}"
    phase = f" in {res.oom_phase}" if res.oom_phase else ""
    log = f" (log {res.log})" if res.log and res.log not in res.error else ""
    return f"{head}{phase}: {res.error}{log}"


def scaling_lines(results: dict[str, TrialResult]) -> list[str]:
    """The tuning playbook's check: doubling the batch should nearly double throughput."""
    from sweep.core.strategies import SCALING_FLAG_RATIO, scaling_report

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
