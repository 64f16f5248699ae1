"""The PNG plots tell the truth: the heatmap marks the recommended and tight pairs and draws pairs within
the noise of the best alike; the scaling plot keeps its ideal line in view and shows the OOM pairs.

Synthetic sweep dirs (support.results.make_sweep) for the parametrized cases; tests/golden/sweeps holds the
trials.csv and recommendation.yaml of real CPU demo sweeps (a grid, and a staircase whose fastest pair is tight).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from support.results import make_sweep

from sweep.analysis import plots
from sweep.analysis.api import load
from sweep.report import write_report

GOLDEN = Path(__file__).parent / "golden" / "sweeps"
RANKED_COLUMNS = ["ranked_throughput_samples_per_s", "ranked_throughput_low_samples_per_s", "ranked_throughput_high_samples_per_s"]


def cell_texts(fig) -> dict[tuple[int, int], str]:
    """{(x, y) cell: its text} of the heatmap (the axes' texts sit at the cell centres)."""
    ax = fig.axes[0]
    return {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in ax.texts}


def cell_of(df: pd.DataFrame, accum: int, split: int) -> tuple[int, int]:
    accums, splits = sorted(df["accum"].unique()), sorted(df["split"].unique())
    return splits.index(split), accums.index(accum)


def outlines(fig, colour: str) -> list[tuple[float, float]]:
    """Lower-left corners of the unfilled rectangles drawn in this edge colour."""
    from matplotlib.colors import to_rgba

    return [tuple(p.get_xy()) for p in fig.axes[0].patches if not p.get_fill() and p.get_edgecolor() == to_rgba(colour)]


def with_tight(df: pd.DataFrame, pairs: set[tuple[int, int]]) -> pd.DataFrame:
    df = df.copy()
    df["tight"] = [(int(a), int(s)) in pairs if st == "ok" else pd.NA for a, s, st in zip(df["accum"], df["split"], df["status"])]
    df["tight"] = df["tight"].astype("boolean")
    return df


@pytest.mark.parametrize("n_tight", [0, 1, 2])
def test_heatmap_marks_the_recommended_and_the_tight_pairs(tmp_path: Path, n_tight: int) -> None:
    """The n fastest pairs are tight: the recommendation is the next one, and each tight pair says so."""
    df = load(make_sweep(tmp_path, "s"))
    ok = df[df["status"] == "ok"].sort_values("throughput_samples_per_s", ascending=False)
    by_speed = [(int(a), int(s)) for a, s in ok[["accum", "split"]].values]
    tight_pairs = set(by_speed[:n_tight])
    df = with_tight(df, tight_pairs)
    fig = plots.heatmap_figure(df)
    texts = cell_texts(fig)
    rec = plots.recommended_pair(df)
    assert rec == by_speed[n_tight]  # the fastest pair that is not tight
    assert "rec" in texts[cell_of(df, *rec)].split()
    assert len(outlines(fig, plots.RECOMMENDED_EDGE)) == 1
    for pair in tight_pairs:
        # The tight fastest pair keeps its rank (#1) but is marked tight, and is not outlined as recommended.
        assert "tight" in texts[cell_of(df, *pair)] and "rec" not in texts[cell_of(df, *pair)].split()
    assert len(outlines(fig, plots.TIGHT_EDGE)) == len(tight_pairs)
    assert sum("tight" in t for t in texts.values()) == len(tight_pairs)


def colour_at(fig, x: int, y: int) -> tuple[float, ...]:
    image = fig.axes[0].images[0]
    return tuple(np.round(image.to_rgba(image.get_array()[y, x]), 6))


@pytest.mark.parametrize("behind, noise, same", [(0.03, 0.07, True), (0.03, 0.01, False), (0.01, 0.01, True), (0.30, 0.07, False)])
def test_heatmap_colours_pairs_within_the_noise_alike(tmp_path: Path, behind, noise, same) -> None:
    """A colour bar spanning 1062-1098 drew a pair 3% behind as far worse; within the noise it is the best's colour."""
    df = load(make_sweep(tmp_path, "s")).drop(columns=RANKED_COLUMNS)  # cells then show each trial's own figure
    ok = df["status"] == "ok"
    best = df.loc[ok, "throughput_samples_per_s"].max()
    df.loc[ok, "throughput_samples_per_s"] = best * 0.5  # the rest well behind
    first, second = df.index[ok][:2]
    df.loc[first, "throughput_samples_per_s"] = best
    df.loc[second, "throughput_samples_per_s"] = best * (1 - behind)
    fig = plots.heatmap_figure(df, noise=noise)
    a = colour_at(fig, *cell_of(df, int(df.loc[first, "accum"]), int(df.loc[first, "split"])))
    b = colour_at(fig, *cell_of(df, int(df.loc[second, "accum"]), int(df.loc[second, "split"])))
    assert (a == b) == same


@pytest.mark.parametrize("noise", [0.0, 0.01, 0.07, 0.19, 0.49])
def test_heatmap_colour_scale_stays_positive_and_spans_the_noise(tmp_path: Path, noise) -> None:
    """A noisy host's 19% (the drift check's) once drew a colour bar from -200 to 100 samples/s; at 49% one stopped at
    211 beside cells of 635 and 819. The bar spans every cell, and from the tie line up the colour is the best's."""
    df = load(make_sweep(tmp_path, "s"))
    image = plots.heatmap_figure(df, noise=noise).axes[0].images[0]
    ok = df.loc[df["status"] == "ok", "ranked_throughput_samples_per_s"]
    best = ok.max()
    assert 0 < image.norm.vmin <= ok.min() and image.norm.vmax == pytest.approx(best)
    tie = best * np.exp(-1.96 * 2**0.5 * noise)
    if noise:
        assert tuple(image.to_rgba(tie * 1.0001)) == tuple(image.to_rgba(best))  # within the noise: the best's colour
        assert tuple(image.to_rgba(tie * 0.97)) != tuple(image.to_rgba(best))


@pytest.mark.parametrize("name", ["grid", "staircase_tight"])
def test_scaling_keeps_the_ideal_line_in_view_and_shows_ooms(name: str) -> None:
    df = load(GOLDEN / name)
    fig = plots.scaling_figure(df)
    ax = fig.axes[0]
    (ideal,) = [line for line in ax.get_lines() if str(line.get_label()).startswith("ideal")]
    low, high = ax.get_ylim()
    assert low <= min(ideal.get_ydata()) and max(ideal.get_ydata()) <= high
    ooms = df[df["status"] == "oom"]
    marks = [c for c in ax.collections if c.get_label().startswith("out of memory")]
    assert len(marks) == 1 and len(marks[0].get_offsets()) == ooms["per_device_batch"].nunique()
    shown = {t.get_text() for t in ax.texts}
    for batch, n in ooms.groupby("per_device_batch").size().items():
        assert f"{n} OOM" in shown
        assert float(batch) in [float(t) for t in ax.get_xticks()]


def test_real_staircase_with_a_tight_leader(tmp_path: Path) -> None:
    """A real CPU demo sweep at trial.memory_margin=0.25: its fastest pair is tight, the recommendation the next one."""
    df = load(GOLDEN / "staircase_tight")
    rec = yaml.safe_load((GOLDEN / "staircase_tight" / "recommendation.yaml").read_text())
    assert plots.recommended_pair(df) == (rec["accum"], rec["split"])
    fig = plots.heatmap_figure(df, noise=rec["run_to_run_noise"])
    texts = cell_texts(fig)
    (tight,) = df[df["tight"].fillna(False).astype(bool)].itertuples()
    assert texts[cell_of(df, tight.accum, tight.split)].startswith("#1 ") and "tight" in texts[cell_of(df, tight.accum, tight.split)]
    assert "rec" in texts[cell_of(df, rec["accum"], rec["split"])].split()


def test_report_writes_both_plots_from_a_real_sweep(tmp_path: Path) -> None:
    import shutil

    sweep = tmp_path / "grid"
    shutil.copytree(GOLDEN / "grid", sweep)
    written = write_report(sweep)
    assert {p.name for p in written} == {"summary.md", "heatmap.png", "scaling.png"}
    assert all(p.stat().st_size > 5_000 for p in written if p.suffix == ".png")
