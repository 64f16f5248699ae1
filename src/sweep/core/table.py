"""The one sweep table model (pure): headers and typed rows, built once, rendered anywhere.

`sweep_table(rows)` takes typed `Row`s, or what `table_rows` makes them from: the table rows of
`ranking.build_table` (one dict per candidate, the trials.csv columns, built from the TrialResults and
the SweepMeta; the orchestrator types them once and hands the display Rows) or the records of
`sweep.load()`'s frame (missing values as None), and decides everything a reader sees:
which columns, their headers (the throughput unit comes from the results), the cell text,
the marks (`tight`, `early`, `stalls`, `retimed`), the notes on rows that did not run ok, and the lines under
the table. Renderers only lay it out: `render_plain` here, rich on a terminal
(orchestration/display.py), Markdown in the report (sweep/report.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweep.core.growth import GROWTH_PREFIX, RETRIES_PREFIX, RISK_PREFIXES
from sweep.core.memory_model import counted_peak_of
from sweep.core.schema import Status
from sweep.core.stats import STALL_PREFIX

DEFAULT_UNIT = "samples/s"

# Marks shown in the `mark` column, and the legend line naming them.
TIGHT_MARK = "tight"
EARLY_MARK = "early"
STALLS_MARK = "stalls"
RETIMED_MARK = "retimed"
_LEGEND = {
    TIGHT_MARK: "tight = ran ok with headroom below trial.memory_margin, its reserved peak still growing at its end, "
    "or the CUDA allocator retrying in timed steps: may OOM in real training",
    # Short enough to take three lines of a 60-column live view (the live view keeps its rows above it).
    EARLY_MARK: "early = stopped before its last step: more steps could not change the answer (it could not beat the leader, "
    "was ahead of every measured pair, or tied with its rivals or inside one's interval), or provisionally as the first pair",
    STALLS_MARK: "stalls = some steps ran far slower than the typical step, again and again, or from some step on (a starved data loader, a periodic "
    "sync or flush): the figure is samples over wall time, stalls included, the speed training runs at",
    RETIMED_MARK: "retimed = timed again by the drift check: its figure is the geometric mean of both timings, the one every "
    "ranking of the sweep rests on (each timing below)",
}

# Rows that never ran and say so in one count line instead of a row each (the dry run lists them).
_COUNTED = (Status.INVALID, Status.SKIPPED)
_NOT_NOTED = (Status.OK, Status.PENDING, Status.RUNNING, Status.SKIPPED)


@dataclass(frozen=True)
class Row:
    """One candidate, typed: what the cells are made from."""

    accum: int
    split: int
    status: Status
    rank: int | None = None
    per_device_batch: int | None = None
    joint_batch: int | None = None
    oom_phase: str | None = None
    throughput: float | None = None
    throughput_low: float | None = None
    throughput_high: float | None = None
    throughput_unit: str | None = None  # None: not known for this row (a running trial's live figure)
    speedup: float | None = None
    steps_measured: int | None = None
    # An ok row's: the peak that meets the capacity (memory_model.counted_peak: reserved where measured,
    # else used), so that it and capacity_gib explain `tight`. A failed row's: the used peak it reached
    # (on CPU an OOM's address-space peak is its uncapped warm-up's, above the cap: no figure of the
    # failure). A predicted_oom row's: the predicted peak.
    peak_gib: float | None = None
    capacity_gib: float | None = None
    wall_s: float | None = None
    tight: bool = False
    stopped_early: str = ""
    reason: str = ""
    stalls: str = ""  # an ok row's stall note (core/stats.py stall_note): its steps stall, and the figure counts them
    # A pair the drift check re-timed: throughput (and its interval) is then the figure it is ranked on, the geometric
    # mean of both timings; these are the two timings themselves (trials.csv's own and retimed columns).
    measured: float | None = None
    retimed: float | None = None

    @property
    def marks(self) -> tuple[str, ...]:
        marks = []
        if self.tight and self.status == Status.OK:
            marks.append(TIGHT_MARK)
        if self.stopped_early:
            marks.append(EARLY_MARK)
        if self.stalls and self.status == Status.OK:
            marks.append(STALLS_MARK)
        if self.retimed is not None and self.status == Status.OK:
            marks.append(RETIMED_MARK)
        return tuple(marks)

    @property
    def note(self) -> str:
        """Why it did not run ok, one line; a predicted OOM names its predicted peak and the capacity."""
        if self.status == Status.OK and self.tight and self.reason.startswith(RISK_PREFIXES):
            return "; ".join(filter(None, (self.reason, self.stalls)))  # the figure that shows why it is tight (growth or retries)
        if self.status == Status.OK and self.stalls:
            return self.stalls
        if self.status in _NOT_NOTED:
            return ""
        first = self.reason.splitlines()[0] if self.reason else ""
        if self.status == Status.PREDICTED_OOM and self.peak_gib is not None and self.capacity_gib is not None:
            if "GiB" not in first:  # a reason from the memory model already names both
                peak = f"predicted peak {self.peak_gib:.3g} GiB > capacity {self.capacity_gib:.3g} GiB"
                first = f"{peak}: {first}" if first else peak
        return first


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Row], str]
    right: bool = True  # numbers right-aligned, words left


@dataclass(frozen=True)
class SweepTable:
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    notes: tuple[str, ...]  # one line per shown row that did not run ok (or ran ok, growing or retrying), with its reason
    legend: tuple[str, ...]  # what the marks mean; the unit footnote of a mixed-unit sweep
    counts: tuple[str, ...]  # rows not shown (skipped, invalid), counted

    @property
    def footer(self) -> tuple[str, ...]:
        return self.legend + self.counts

    @property
    def notes_title(self) -> str:
        """The heading over the notes. An ok row has one only when its reserved peak was still growing or its
        allocator retried in timed steps; the heading names which, so it never contradicts an ok row under it."""
        ok_notes = [r.note for r in self.rows if r.status == Status.OK and r.note]
        why = [w for prefix, w in ((GROWTH_PREFIX, "still growing"), (RETRIES_PREFIX, "retrying allocations"), (STALL_PREFIX, "stalling"))
               if any(n.startswith(prefix) or f"; {prefix}" in n for n in ok_notes)]
        return f"Not run ok, or ok but {' or '.join(why)}:" if why else "Not run ok:"

    @property
    def headers(self) -> list[str]:
        return [c.header for c in self.columns]

    @property
    def right(self) -> list[bool]:
        return [c.right for c in self.columns]

    def cells(self) -> list[list[str]]:
        return [[c.cell(r) for c in self.columns] for r in self.rows]


def _missing(value: Any) -> bool:
    # None, NaN and pandas' NA (whose bool() raises) all count as missing.
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:
        return True


def _opt(value: Any, kind: type) -> Any:
    return None if _missing(value) or value == "" else kind(value)


def table_rows(rows: Iterable[Row | Mapping[str, Any]]) -> list[Row]:
    """Typed rows: a Row as it is, a table dict (build_table) or a load() record through row_from_mapping."""
    return [r if isinstance(r, Row) else row_from_mapping(r) for r in rows]


def row_from_mapping(r: Mapping[str, Any]) -> Row:
    """A Row from a table dict (build_table) or a load() record; unknown/missing fields take defaults."""
    unit = r.get("throughput_unit")
    used = _opt(r.get("peak_mem_gib"), float)
    status = Status(str(r["status"]))
    # The figure shown is the one the rank rests on (ranked_*, a re-timed pair's pooled figure); a row without one (not
    # ok, a running trial's live figure, a trials.csv from before the drift check's columns) shows its own.
    own = _opt(r.get("throughput_samples_per_s"), float)
    ranked = _opt(r.get("ranked_throughput_samples_per_s"), float)
    retimed = _opt(r.get("retimed_throughput_samples_per_s"), float)
    low, high = (
        (_opt(r.get("ranked_throughput_low_samples_per_s"), float), _opt(r.get("ranked_throughput_high_samples_per_s"), float))
        if ranked is not None
        else (_opt(r.get("throughput_low_samples_per_s"), float), _opt(r.get("throughput_high_samples_per_s"), float))
    )
    return Row(
        accum=int(r["accum"]),
        split=int(r["split"]),
        status=status,
        rank=_opt(r.get("rank"), int),
        per_device_batch=_opt(r.get("per_device_batch"), int),
        joint_batch=_opt(r.get("joint_batch"), int),
        oom_phase=_opt(r.get("oom_phase"), str),
        throughput=own if ranked is None else ranked,
        throughput_low=low,
        throughput_high=high,
        throughput_unit=None if _missing(unit) or not unit else str(unit),
        speedup=_opt(r.get("speedup"), float),
        steps_measured=_opt(r.get("steps_measured"), int),
        peak_gib=counted_peak_of(used, _opt(r.get("peak_reserved_gib"), float)) if status == Status.OK else used,
        capacity_gib=_opt(r.get("capacity_gib"), float),
        wall_s=_opt(r.get("wall_s"), float),
        tight=bool(_opt(r.get("tight"), bool) or False),
        stopped_early=_opt(r.get("stopped_early"), str) or "",
        reason=_opt(r.get("reason"), str) or "",
        stalls=_opt(r.get("stalls"), str) or "",
        measured=own if retimed is not None else None,
        retimed=retimed,
    )


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None or not math.isfinite(value) else fmt.format(value)


def _int(value: int | None) -> str:
    return "" if value is None else str(value)


def interval_cell(r: Row) -> str:
    if r.throughput_low is None or r.throughput_high is None:
        return ""
    return f"{r.throughput_low:,.1f}-{r.throughput_high:,.1f}"


def status_cell(r: Row) -> str:
    return f"{r.status} ({r.oom_phase})" if r.status == Status.OOM and r.oom_phase else str(r.status)


def sweep_table(
    rows: Iterable[Row | Mapping[str, Any]],
    *,
    show_split: bool | None = None,
    show_invalid: bool = False,
) -> SweepTable:
    """The table for these rows (Rows, table dicts or load() records, in the order to show them).

    show_split: False drops the split and joint columns (a 1-D sweep: the workload's splits do not
    apply); None decides from the rows (every candidate has split 1). show_invalid: list invalid and
    skipped rows (the dry run) instead of counting them under the table.
    """
    typed = table_rows(rows)
    if show_split is None:
        show_split = any(r.split != 1 for r in typed)
    shown = typed if show_invalid else [r for r in typed if r.status not in _COUNTED]

    # The header is the results' unit; a row that does not say (a live figure, an old trials.csv) is in the
    # sweep's unit, samples/s only when no row says otherwise.
    all_units = {r.throughput_unit for r in shown if r.throughput is not None and r.throughput_unit}
    mixed = len(all_units) > 1
    unit = next(iter(all_units)) if len(all_units) == 1 else DEFAULT_UNIT
    if mixed:
        def with_unit(r: Row) -> str:
            return "" if r.throughput is None else f"{r.throughput:,.1f} {r.throughput_unit or '(unit unknown)'}"

        tp = Column("throughput", with_unit)
    else:
        tp = Column(unit, lambda r: _num(r.throughput, "{:,.1f}"))

    columns = [Column("rank", lambda r: _int(r.rank)), Column("accum", lambda r: _int(r.accum))]
    if show_split:
        columns.append(Column("split", lambda r: _int(r.split)))
    columns.append(Column("per_dev", lambda r: _int(r.per_device_batch)))
    if show_split:
        columns.append(Column("joint", lambda r: _int(r.joint_batch)))
    columns += [
        Column("status", status_cell, right=False),
        tp,
        Column("95% interval", interval_cell),
        Column("speedup", lambda r: _num(r.speedup, "{:.2f}x")),
        Column("steps", lambda r: _int(r.steps_measured)),
        Column("peak GiB", lambda r: _num(r.peak_gib, "{:.3g}")),
        Column("wall s", lambda r: _num(r.wall_s, "{:.1f}")),
    ]
    marks = [m for m in _LEGEND if any(m in r.marks for r in shown)]
    if marks:
        columns.append(Column("mark", lambda r: " ".join(r.marks), right=False))

    def pair(r: Row) -> str:
        return f"accum={r.accum} split={r.split}" if show_split else f"accum={r.accum}"

    notes = tuple(f"{pair(r)} {status_cell(r)}: {r.note}" for r in shown if r.note)

    legend = []
    if marks:
        legend.append("; ".join(_LEGEND[m] for m in marks))
    both = [r for r in shown if RETIMED_MARK in r.marks]
    if both:  # both timings of each re-timed pair, beside the figure it is ranked on
        legend.append("re-timed: " + "; ".join(
            f"{pair(r)} {_num(r.measured, '{:,.1f}')} in the sweep and {_num(r.retimed, '{:,.1f}')} in the drift check, "
            f"ranked on {_num(r.throughput, '{:,.1f}')}" for r in both) + f" {unit}")
    if mixed:
        legend.append(f"throughput units differ between trials ({', '.join(sorted(all_units))}): each figure carries its own")
    counts = []
    if not show_invalid:
        skipped = sum(r.status == Status.SKIPPED for r in typed)
        invalid = sum(r.status == Status.INVALID for r in typed)
        if skipped:
            counts.append(f"{skipped} pair(s) skipped: the search ruled them out (OOM implied, or they cannot beat the leader)")
        if invalid:
            counts.append(f"{invalid} invalid pair(s) not launched (a batch size would not be an integer); dry_run=true lists them")
    return SweepTable(tuple(columns), tuple(shown), notes, tuple(legend), tuple(counts))


def render_plain(table: SweepTable, with_notes: bool = True) -> str:
    """Aligned plain text (pipes, CI logs): the table, the notes on rows not run ok, then the footer."""
    cells = table.cells()
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(table.headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right else c.ljust(w) for c, w, right in zip(row, widths, table.right)).rstrip()

    lines = [line(table.headers)] + [line(row) for row in cells]
    if with_notes and table.notes:
        lines += ["", table.notes_title] + [f"  {n}" for n in table.notes]
    # Blank lines between blocks, as the sweep has always printed them.
    if table.legend:
        lines += [""] + list(table.legend)
    for count in table.counts:
        lines += ["", count]
    return "\n".join(lines)


def render_markdown(table: SweepTable) -> str:
    """A GitHub Markdown table, the notes as a list, the footer as plain lines."""
    return markdown_grid(table.headers, table.cells(), table.right) + _markdown_tail(table)


def _markdown_tail(table: SweepTable) -> str:
    out = ""
    if table.notes:
        out += f"\n\n{table.notes_title}\n\n" + "\n".join(f"- {n}" for n in table.notes)
    if table.footer:
        out += "\n\n" + "\n".join(f"{line}  " if i < len(table.footer) - 1 else line for i, line in enumerate(table.footer))
    return out


def markdown_grid(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    esc = [[c.replace("|", "\\|") for c in row] for row in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    return "\n".join(out + ["| " + " | ".join(row) + " |" for row in esc])
