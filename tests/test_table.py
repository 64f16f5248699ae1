"""The one sweep table model (core/table.py) and its renderers: plain, Markdown, rich, and trials.csv."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pandas as pd
import pytest
from support.results import trial_result

from sweep import report
from sweep.analysis.api import load
from sweep.core.memory_model import PeakPrediction
from sweep.core.ranking import SweepMeta, build_table, table_csv
from sweep.core.schema import FAILED, OK, OOM, TrialResult
from sweep.core.space import enumerate_candidates
from sweep.core.table import render_markdown, render_plain, sweep_table
from sweep.orchestration.display import format_table, landed_line

META = SweepMeta(sweep_id="t", machine="local", workload="command", global_batch_size=16, num_devices=1)


def result(accum: int, split: int, status=OK, **kw) -> TrialResult:
    base = {}
    if status == OK:
        base.update(throughput=100.0 * accum, throughput_low=90.0 * accum, throughput_high=110.0 * accum, steps_measured=12)
    return trial_result(accum, split, gbs=16, status=status, **{**base, **kw})


def rows(results: list[TrialResult], splits=(1, 2), **kw):
    cands = enumerate_candidates(16, 1, [1, 2, 4], list(splits))
    return build_table(META, cands, {r.key: r for r in results}, done=True, **kw)


def header(text: str) -> list[str]:
    return text.splitlines()[0].split()


@pytest.mark.parametrize(
    "results, in_header, not_in_header, in_text",
    [
        # The unit comes from the results: a tokens/s sweep is never labelled samples/s.
        ([result(1, 1, throughput_unit="tokens/s"), result(2, 1, throughput_unit="tokens/s")], ["tokens/s"], ["samples/s"], []),
        ([result(1, 1), result(2, 1)], ["samples/s", "steps"], ["tokens/s", "mark"], []),
        # Mixed units: a neutral header, each figure with its unit, and a footnote saying so.
        ([result(1, 1, throughput_unit="tokens/s"), result(2, 1)], ["throughput"], ["samples/s"],
         ["100.0 tokens/s", "200.0 samples/s", "throughput units differ between trials (samples/s, tokens/s)"]),
        # Marks and their one-line legend, only when a mark is shown.
        ([result(1, 1, tight=True), result(2, 1)], ["mark"], [], ["tight = ran ok with headroom below trial.memory_margin"]),
        ([result(1, 1, stopped_early="could not beat the leader"), result(2, 1)], ["mark"], [],
         ["early = stopped before its last step", "could not beat the leader", "ahead of every measured pair", "tied with its rivals"]),
        # tight on a row that did not run ok is not shown.
        ([result(1, 1, status=OOM, oom_phase="joint", error="out of memory", tight=True)], [], ["mark"], ["oom (joint): out of memory"]),
    ],
)
def test_plain_table_columns_marks_and_footnotes(results, in_header, not_in_header, in_text) -> None:
    text = format_table(rows(results))
    for h in in_header:
        assert h in header(text)
    for h in not_in_header:
        assert h not in header(text)
    for t in in_text:
        assert t in text
    # The legend is there exactly when the mark column is.
    assert ("tight = " in text or "early = " in text) == ("mark" in header(text))


def test_steps_column_shows_steps_measured() -> None:
    table = sweep_table(rows([result(1, 1, steps_measured=37)]))
    (cells,) = [c for r, c in zip(table.rows, table.cells()) if r.status == "ok"]
    assert cells[table.headers.index("steps")] == "37"


@pytest.mark.parametrize(
    "memory, shown",
    [
        # The peak that headroom and tight are counted on: the reserved (CUDA) or address-space (CPU) peak.
        (dict(peak_mem_gib=0.0154, peak_reserved_gib=0.0195, capacity_gib=0.02, headroom=0.025, tight=True), "0.0195"),
        (dict(peak_mem_gib=0.0154), "0.0154"),  # a trial that measured no reserved peak (command trials)
        ({}, ""),
        # A failed row shows how far it got: its address-space peak also holds the uncapped warm-up's.
        (dict(status=OOM, oom_phase="encoder", peak_mem_gib=0.0097, peak_reserved_gib=0.0232), "0.0097"),
    ],
)
def test_peak_column_shows_the_peak_headroom_counts(memory, shown) -> None:
    results = [result(1, 1, **memory)]
    table = sweep_table(rows(results))
    (cells,) = [c for r, c in zip(table.rows, table.cells()) if (r.accum, r.split) == (1, 1)]
    assert cells[table.headers.index("peak GiB")] == shown
    if results[0].status == OK:
        assert f"peak {shown} GiB" in landed_line(results[0]) if shown else "peak" not in landed_line(results[0])


def test_predicted_oom_row_shows_predicted_peak_and_capacity() -> None:
    from sweep.orchestration.racing import predicted_record

    pred = PeakPrediction(peak_gib=12.5, se_gib=0.5, dof=3, low_gib=11.0, high_gib=14.0)
    cand = next(c for c in enumerate_candidates(16, 1, [1], [1]) if c.key == "accum1_split1")
    # The orchestrator shows the record racing.Predictions keeps for a pair it did not launch.
    table_rows = rows([result(2, 1), predicted_record(cand, pred, 10.0, 16, 1)])
    row = next(r for r in table_rows if r["accum"] == 1 and r["split"] == 1)
    assert (row["status"], row["peak_mem_gib"], row["capacity_gib"]) == ("predicted_oom", 12.5, 10.0)
    text = format_table(table_rows)
    assert "accum=1 split=1 predicted_oom: predicted OOM: 12.5 GiB > 10 GiB" in text


def test_predicted_oom_without_a_reason_still_names_peak_and_capacity() -> None:
    row = {"accum": 1, "split": 1, "status": "predicted_oom", "peak_mem_gib": 12.5, "capacity_gib": 10.0, "reason": None}
    assert sweep_table([row]).notes == ("accum=1 predicted_oom: predicted peak 12.5 GiB > capacity 10 GiB",)


@pytest.mark.parametrize(
    "splits, show_split, has_split",
    [((1,), None, False), ((1, 2), None, True), ((1, 2), False, False), ((1,), True, True)],
)
def test_show_split_drops_split_and_joint(splits, show_split, has_split) -> None:
    table = sweep_table(rows([result(1, 1), result(2, 1)], splits=splits), show_split=show_split)
    assert ("split" in table.headers, "joint" in table.headers) == (has_split, has_split)
    assert all(len(c) == len(table.headers) for c in table.cells())


def test_one_d_sweep_drops_split_in_the_report_too(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "trials.csv").write_text(table_csv(rows([result(1, 1), result(2, 1)], splits=(1,))))
    df = load(sweep)
    md = render_markdown(report.report_table(df))
    assert md.splitlines()[0].startswith("| rank | accum | per_dev | status | samples/s |")
    assert "split" not in report.plain_table(df).splitlines()[0]


def test_skipped_and_invalid_are_counted_unless_listed() -> None:
    table_rows = rows([result(1, 1)], splits=(1, 2, 32))
    counted = sweep_table(table_rows)
    assert {r.status for r in counted.rows} == {"ok"}
    assert any("skipped" in c for c in counted.counts) and any("invalid" in c for c in counted.counts)
    listed = sweep_table(table_rows, show_invalid=True)
    assert {"skipped", "invalid"} <= {str(r.status) for r in listed.rows} and listed.counts == ()


def test_markdown_and_plain_render_the_same_cells() -> None:
    table = sweep_table(rows([result(1, 1, tight=True), result(2, 2), result(4, 1, status=FAILED, error="boom | bad")]))
    md, plain = render_markdown(table), render_plain(table)
    for cells in table.cells():
        assert "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" in md
        assert all(c in plain for c in cells)
    assert "- accum=4 split=1 failed: boom | bad" in md and "tight = ran ok" in md
    assert table.notes_title == "Not run ok:"  # a tight row (headroom, not growth) has no note
    assert "\nNot run ok:\n\n- accum=4" in md and "\nNot run ok:\n  accum=4" in plain


def test_rich_renders_the_model(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "trials.csv").write_text(table_csv(rows([result(1, 1, throughput_unit="tokens/s", tight=True)])))
    buf = io.StringIO()
    report.print_table(load(sweep), buf, use_rich=True, width=200)
    text = buf.getvalue()
    assert "tokens/s" in text and "samples/s" not in text and "tight = ran ok" in text


def test_new_trials_csv_columns_load_with_their_dtypes(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    res = result(1, 1, throughput_unit="tokens/s", tight=True, headroom=0.05, peak_reserved_gib=9.5, capacity_gib=10.0,
                 stopped_early="raced out")
    (sweep / "trials.csv").write_text(table_csv(rows([res, result(2, 1)])))
    df = load(sweep).set_index(["accum", "split"])
    assert df.loc[(1, 1), ["throughput_unit", "tight", "stopped_early"]].tolist() == ["tokens/s", True, "raced out"]
    assert df.loc[(1, 1), ["headroom", "peak_reserved_gib", "capacity_gib"]].tolist() == [0.05, 9.5, 10.0]
    assert not df.loc[(2, 1), "tight"] and df.loc[(4, 1), "tight"] is pd.NA
    assert str(df["tight"].dtype) == "boolean" and str(df["headroom"].dtype) == "float64"


def test_the_table_says_what_gave_each_figure(tmp_path: Path) -> None:
    """A trainer with no torch.optim step is timed by its backward passes: the table says so beside its figure."""
    sweep = tmp_path / "s"
    sweep.mkdir()
    res = [result(1, 1, measured_by="probe", probe_signal="backward passes"), result(2, 1, measured_by="probe", probe_signal="optimizer steps"),
           result(4, 1, measured_by="log")]
    (sweep / "trials.csv").write_text(table_csv(rows(res)))
    df = load(sweep).set_index(["accum", "split"])
    assert df.loc[(1, 1), "measured_by"] == "probe: backward passes" and df.loc[(4, 1), "measured_by"] == "log"


def test_an_older_trials_csv_without_the_new_columns_still_loads(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    old = pd.read_csv(io.StringIO(table_csv(rows([result(1, 1)]))), dtype=str, keep_default_na=False)
    old.loc[:, :"job_id"].to_csv(sweep / "trials.csv", index=False)  # every column appended after job_id dropped
    df = load(sweep)
    assert df["throughput_unit"].isna().all() and df["tight"].isna().all() and df["capacity_gib"].isna().all()
    assert df["measured_by"].isna().all()
    assert "samples/s" in report.plain_table(df).splitlines()[0]


def test_a_live_figure_without_a_unit_takes_the_sweeps_unit() -> None:
    cands = enumerate_candidates(16, 1, [1, 2, 4], [1])
    tokens_meta = dataclasses.replace(META, throughput_unit="tokens/s")  # the sweep.json of a tokens/s parser
    table_rows = build_table(tokens_meta, cands, {"accum1_split1": result(1, 1, throughput_unit="tokens/s")},
                             running={"accum2_split1"}, live_throughput={"accum2_split1": 150.0})
    table = sweep_table(table_rows)
    assert "tokens/s" in table.headers and "samples/s" not in table.headers and table.legend == ()
    assert ["150.0"] == [c[table.headers.index("tokens/s")] for r, c in zip(table.rows, table.cells()) if r.status == "running"]


def test_the_live_view_renders_the_same_model_with_its_legend() -> None:
    from rich.console import Console

    from sweep.orchestration.display import Display

    display = Display(live=False, stream=io.StringIO())
    display.update(rows([result(1, 1, stopped_early="raced"), result(2, 1)]), "2 finished, 0 running")
    buf = io.StringIO()
    Console(file=buf, width=200).print(display._render())
    text = buf.getvalue()
    assert text.split()[:3] == ["rank", "accum", "split"] and "steps" in text
    assert "early = stopped before its last step" in text and text.rstrip().endswith("2 finished, 0 running")


@pytest.mark.parametrize(
    "figures",
    [
        # A half-way figure: 6 significant digits in the CSV (1212.75) rounded again to 1,212.8 in summary.md,
        # while the terminal showed 1,212.7 for the same interval.
        dict(throughput=1212.76, throughput_low=1212.7499999, throughput_high=1212.8500001),
        dict(throughput=98765.4321, throughput_low=98765.04999, throughput_high=98765.45001),
        dict(throughput=0.123456789, throughput_low=0.1049999, throughput_high=0.15000001),
    ],
)
def test_every_output_renders_the_same_figures(tmp_path: Path, figures) -> None:
    """The terminal (rows in memory) and summary.md/sweep.load (trials.csv read back) show identical cells."""
    table_rows = rows([result(1, 1, **figures), result(2, 1)])
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "trials.csv").write_text(table_csv(table_rows))
    from_csv = report.report_table(load(sweep))
    assert from_csv.cells() == sweep_table(table_rows).cells()
    df = load(sweep)
    assert df.loc[(df["accum"] == 1) & (df["split"] == 1), "throughput_low_samples_per_s"].item() == figures["throughput_low"]  # exactly


@pytest.mark.parametrize(
    "status, step_times, steps_measured, shown",
    [
        (OOM, [0.1] * 4, None, ""),  # the steps before the OOM are no measurement: result.json says null
        (FAILED, [0.1, 0.2], None, ""),
        (OK, [0.1] * 9, 9, "9"),
        (OK, [0.1] * 9, None, "9"),  # a result from before steps_measured existed counts its step times
    ],
)
def test_steps_agree_with_the_result(tmp_path: Path, status, step_times, steps_measured, shown) -> None:
    extra = dict(oom_phase="joint", error="out of memory") if status == OOM else dict(error="boom") if status == FAILED else {}
    res = result(1, 1, status=status, step_times_s=step_times, steps_measured=steps_measured, **extra)
    (row,) = [r for r in rows([res]) if r["accum"] == 1 and r["split"] == 1]
    assert row["steps_measured"] == (int(shown) if shown else None)
    table = sweep_table([row])
    assert table.cells()[0][table.headers.index("steps")] == shown
