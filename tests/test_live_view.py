"""The live view fits the terminal: finished pairs (OOMs included) first, columns dropped before any header is cut,
pending pairs counted. Rendered with rich at fixed sizes from real CPU demo sweeps (tests/golden/sweeps)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sweep.analysis.api import load
from sweep.core.table import table_rows
from sweep.orchestration.display import DROP_FIRST, live_rows, live_view

GOLDEN = Path(__file__).parent / "golden" / "sweeps"
ALL_HEADERS = ["rank", "accum", "split", "per_dev", "joint", "status", "samples/s", "95% interval", "speedup", "steps", "peak GiB", "wall s"]


def records(name: str, running: int = 0, pending: int = 0) -> list[dict]:
    """The sweep's rows as the live view gets them, with some ok rows turned back into running/pending ones."""
    rows = [{k: (None if v is None or v != v else v) for k, v in r.items()} for r in load(GOLDEN / name).to_dict("records")]
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok[len(ok) - running - pending:]:
        r.update(status="running" if running else "pending", rank=None, throughput_samples_per_s=None,
                 throughput_low_samples_per_s=None, throughput_high_samples_per_s=None, speedup=None)
        running = max(0, running - 1) if r["status"] == "running" else running
    return rows


def render(rows: list[dict], width: int, height: int) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height, force_terminal=False, color_system=None)
    console.print(live_view(rows, "20 finished, 1 running, of 35 valid pairs", width, height))
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("width, height", [(80, 24), (100, 30), (160, 50), (60, 20)])
@pytest.mark.parametrize("name, running, pending", [("grid", 0, 0), ("grid", 1, 5), ("staircase_tight", 1, 0)])
def test_live_view_fits_without_cut_headers_and_shows_ooms(name, running, pending, width, height) -> None:
    rows = records(name, running, pending)
    lines = render(rows, width, height)
    assert all(len(line) <= width for line in lines)
    assert len(lines) <= max(8, height // 2)  # the log lines scroll above it
    header = lines[0].split()
    assert "…" not in lines[0]  # a header is shown whole or not at all
    assert {"accum", "status", "samples/s"} <= set(header)
    kept = [h for h in ALL_HEADERS if h.split()[0] in header]
    dropped = [h for h in ALL_HEADERS if h not in kept]
    assert all(h in DROP_FIRST for h in dropped)
    # Dropped least-needed first: everything dropped comes before anything kept in DROP_FIRST's order.
    order = [h for h in DROP_FIRST if h in ALL_HEADERS]
    assert order[: len(dropped)] == [h for h in order if h in dropped]
    text = "\n".join(lines)
    assert "oom (encoder)" in text or "oom (joint)" in text  # OOM rows above the fold
    if running:
        assert "running" in text
    if pending:
        assert f"{pending} pending" in text
    assert lines[-1] == "20 finished, 1 running, of 35 valid pairs"


@pytest.mark.parametrize("height", [4, 8, 12, 40])
def test_live_rows_put_finished_first_and_keep_running_and_oom_rows(height) -> None:
    rows = records("grid", running=1, pending=3)
    shown, more = live_rows(table_rows(rows), height)
    order = [str(r.status) for r in shown]
    assert order.index("running") > max(i for i, s in enumerate(order) if s in ("ok", "oom"))
    assert "oom" in order and "running" in order and "pending" not in order
    assert "3 pending" in more
    finished = sum(str(r["status"]) in ("ok", "oom") for r in rows)
    left = finished - sum(s in ("ok", "oom") for s in order)
    assert (f"{left} more finished" in more) == (left > 0)
