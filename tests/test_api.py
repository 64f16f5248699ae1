"""sweep.load / sweep.compare against sweep dirs written the way the orchestrator writes them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from support.results import make_sweep

from sweep.analysis import api
from sweep.analysis.api import load
from sweep.analysis.compare import COMPARE_COLUMNS, compare
from sweep.core.ranking import TABLE_COLUMNS
from sweep.core.schema import ALL_STATUSES, OOM_PHASES
from sweep.errors import LoadError

GOLDEN = Path(__file__).parent / "golden" / "trials_header.csv"


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    return tmp_path / "outputs"


@pytest.fixture
def done_sweep(outputs: Path) -> Path:
    return make_sweep(outputs, "2024-05-01_10-00-00")


def golden() -> tuple[list[str], list[str]]:
    header, dtypes = GOLDEN.read_text().splitlines()
    return header.split(","), dtypes.split(",")


# -- schema -------------------------------------------------------------------------------------------
def test_golden_header_matches_table_columns_and_written_csv(done_sweep: Path) -> None:
    names, _ = golden()
    assert names == TABLE_COLUMNS
    assert (done_sweep / "trials.csv").read_text().splitlines()[0] == ",".join(names)


def test_load_columns_and_dtypes_match_golden(done_sweep: Path) -> None:
    names, dtypes = golden()
    df = load(done_sweep)
    assert list(df.columns) == names
    assert [str(df[c].dtype) for c in names] == dtypes
    assert list(df["status"].cat.categories) == list(ALL_STATUSES)
    assert list(df["oom_phase"].cat.categories) == list(OOM_PHASES)
    assert not df["status"].cat.ordered
    empty = api.empty_frame()
    assert list(empty.columns) == names and [str(empty[c].dtype) for c in names] == dtypes


def test_load_values_of_a_finished_sweep(done_sweep: Path) -> None:
    df = load(done_sweep)
    assert len(df) == 25  # 5 accum x 5 split candidates, invalid ones included
    assert df["sweep_id"].unique().tolist() == ["2024-05-01_10-00-00"]
    assert set(df["machine"]) == {"dgx-a100"} and set(df["global_batch_size"]) == {1024}
    counts = df["status"].value_counts()
    assert counts["ok"] == 10 and counts["oom"] == 8 and counts["failed"] == 1 and counts["invalid"] == 6
    ok = df[df["status"] == "ok"]
    assert sorted(ok["rank"]) == list(range(1, 11))
    assert (ok["throughput_low_samples_per_s"] <= ok["throughput_samples_per_s"]).all()
    assert (ok["throughput_samples_per_s"] <= ok["throughput_high_samples_per_s"]).all()
    assert ok["steps_measured"].eq(8).all()
    # The baseline is split=1 at the smallest accum that ran ok: accum=8 (accum=4 split=1 OOMs in the joint).
    base = df[(df["accum"] == 8) & (df["split"] == 1)].iloc[0]
    assert base["speedup"] == pytest.approx(1.0)
    oom = df[df["status"] == "oom"]
    assert set(oom.loc[oom["accum"] == 1, "oom_phase"]) == {"encoder"}
    assert set(oom.loc[oom["accum"] > 1, "oom_phase"]) == {"joint"}
    assert df.loc[df["status"] != "oom", "oom_phase"].isna().all()
    invalid = df[df["status"] == "invalid"]
    assert invalid["reason"].str.contains("not an integer").all()
    assert invalid.loc[invalid["accum"] == 3, "per_device_batch"].isna().all()
    assert df["rank"].isna().sum() == 15


def test_load_a_running_sweep(outputs: Path) -> None:
    finished = {(8, 1), (8, 2), (4, 2), (1, 1)}
    sweep = make_sweep(outputs, "run", finished=finished, running=[(8, 4), (4, 4)])
    df = load(sweep)
    counts = df["status"].value_counts()
    assert counts["running"] == 2 and counts["pending"] == 13 and counts["ok"] == 3 and counts["oom"] == 1
    running = df[df["status"] == "running"]
    assert set(zip(running["accum"], running["split"])) == {(8, 4), (4, 4)}
    assert running["throughput_samples_per_s"].isna().all() and running["rank"].isna().all()
    assert [str(t) for t in df.dtypes] == golden()[1]
    # Ranked rows first, then what is still coming.
    assert df["status"].tolist()[:6] == ["ok"] * 3 + ["running"] * 2 + ["pending"]


# -- sources ------------------------------------------------------------------------------------------
def test_load_latest_symlink_and_trials_csv_path(outputs: Path) -> None:
    make_sweep(outputs, "a")
    b = make_sweep(outputs, "b", machine="dgx-h100")
    via_link = load(outputs / "latest")
    assert via_link["sweep_id"].unique().tolist() == ["b"]
    pd.testing.assert_frame_equal(via_link, load(b / "trials.csv"))
    pd.testing.assert_frame_equal(via_link, load(str(b)))


def test_load_glob_and_list_of_sweeps(outputs: Path) -> None:
    make_sweep(outputs, "a")
    make_sweep(outputs, "b", machine="dgx-h100")
    (outputs / "notes.txt").write_text("not a sweep")
    df = load(str(outputs / "*"))  # matches latest -> b too; it must not be counted twice
    assert df.groupby("sweep_id").size().to_dict() == {"a": 25, "b": 25}
    assert df["sweep_id"].drop_duplicates().tolist() == ["a", "b"]
    assert df.index.is_unique and [str(t) for t in df.dtypes] == golden()[1]
    listed = load([outputs / "b", outputs / "a"])
    assert listed["sweep_id"].drop_duplicates().tolist() == ["b", "a"]
    assert set(df.loc[df["sweep_id"] == "b", "machine"]) == {"dgx-h100"}


def test_missing_path_is_one_line_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(LoadError, match="nope: no such file or directory") as e:
        load(missing)
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(LoadError, match="matches no sweep dir"):
        load(str(tmp_path / "outputs-*"))


def test_parent_dir_of_sweeps_gets_a_glob_hint(outputs: Path) -> None:
    make_sweep(outputs, "a")
    with pytest.raises(LoadError, match=r"not a sweep dir.*'.*outputs/\*'"):
        load(outputs)


def test_old_sweep_json_schema_version(done_sweep: Path) -> None:
    meta = json.loads((done_sweep / "sweep.json").read_text())
    meta["schema_version"] = 0
    (done_sweep / "sweep.json").write_text(json.dumps(meta))
    with pytest.raises(LoadError) as e:
        load(done_sweep)
    msg = str(e.value)
    assert str(done_sweep / "sweep.json") in msg and "schema_version=0" in msg and "rerun" in msg and "\n" not in msg


def test_old_trials_csv_missing_columns(done_sweep: Path) -> None:
    csv = done_sweep / "trials.csv"
    df = pd.read_csv(csv)
    df.drop(columns=["oom_phase", "steps_measured"]).to_csv(csv, index=False)
    with pytest.raises(LoadError, match=r"trials\.csv: missing column\(s\) oom_phase, steps_measured: .*rerun"):
        load(done_sweep)


def test_unknown_status_is_an_error_not_a_silent_nan(done_sweep: Path) -> None:
    csv = done_sweep / "trials.csv"
    csv.write_text(csv.read_text().replace(",invalid,", ",vanished,", 1))
    with pytest.raises(LoadError, match="column status has unknown value"):
        load(done_sweep)


# -- round trips --------------------------------------------------------------------------------------
def test_parquet_round_trip_keeps_dtypes(tmp_path: Path, done_sweep: Path) -> None:
    df = load(done_sweep)
    df.to_parquet(tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(back, df)
    assert list(back["status"].cat.categories) == list(ALL_STATUSES)


def test_csv_round_trip_through_load(tmp_path: Path, outputs: Path) -> None:
    df = load(make_sweep(outputs, "run", finished={(8, 1), (2, 4)}, running=[(8, 2)]))
    df.to_csv(tmp_path / "trials.csv", index=False)
    pd.testing.assert_frame_equal(load(tmp_path / "trials.csv"), df)


# -- compare -----------------------------------------------------------------------------------------
def test_compare_overlapping_sweeps(outputs: Path) -> None:
    a = make_sweep(outputs, "a", accums=(2, 4, 8), splits=(1, 2, 4))
    b = make_sweep(outputs, "b", machine="dgx-h100", accums=(4, 8, 16), splits=(1, 2, 4), scale=1.5)
    cmp = compare([a, b])
    assert list(cmp.columns) == COMPARE_COLUMNS
    assert len(cmp) == 4 * 3 * 2  # union of accum {2,4,8,16} x split {1,2,4}, once per sweep
    assert cmp["sweep_order"].tolist()[:2] == [0, 1]
    assert str(cmp["status"].dtype) == "category" and str(cmp["within_noise"].dtype) == "boolean"
    row = cmp[(cmp["accum"] == 8) & (cmp["split"] == 2)].set_index("sweep_id")
    assert row.loc["a", "ratio_vs_first"] == pytest.approx(1.0)
    assert row.loc["b", "ratio_vs_first"] == pytest.approx(1.5, rel=1e-3)
    assert row.loc["b", "within_noise"] == False  # noqa: E712  (1.5x is far outside ~2% intervals)
    only_b = cmp[(cmp["accum"] == 16) & (cmp["split"] == 1)].set_index("sweep_id")
    assert pd.isna(only_b.loc["a", "status"]) and math.isnan(only_b.loc["a", "throughput_samples_per_s"])
    assert only_b.loc["a", "machine"] == "dgx-a100"  # sweep-level columns filled in for absent pairs
    assert only_b.loc["b", "status"] == "ok" and math.isnan(only_b.loc["b", "ratio_vs_first"])
    assert pd.isna(only_b.loc["b", "within_noise"])


def test_compare_disjoint_sweeps(outputs: Path) -> None:
    a = make_sweep(outputs, "a", accums=(4, 8), splits=(1, 2))
    b = make_sweep(outputs, "b", accums=(16, 32), splits=(4, 8))
    cmp = compare([str(a), str(b)])
    assert len(cmp) == 8 * 2
    assert cmp["ratio_vs_first"].drop(cmp.index[cmp["sweep_order"] == 0]).isna().all()
    assert cmp["within_noise"].isna().all()
    present = cmp.dropna(subset=["status"])
    assert set(present.groupby("sweep_id").size()) == {4}


def test_compare_marks_noise(outputs: Path) -> None:
    a = make_sweep(outputs, "a", accums=(4, 8), splits=(2, 4, 8))
    b = make_sweep(outputs, "b", accums=(4, 8), splits=(2, 4, 8),
                   scale_pairs={(8, 2): 1.2, (8, 4): 0.8, (8, 8): 1.005})
    cmp = compare([load(a), load(b)])  # DataFrames work as well as paths
    b_rows = cmp[cmp["sweep_id"] == "b"].set_index(["accum", "split"])["within_noise"]
    assert b_rows[(8, 2)] == False and b_rows[(8, 4)] == False  # noqa: E712
    assert b_rows[(8, 8)] == True and b_rows[(4, 2)] == True  # noqa: E712
    assert cmp.loc[cmp["sweep_order"] == 0, "within_noise"].isna().all()


@pytest.mark.parametrize("gbs_b, nd_b, slower", [(512, 8, 0.74), (1024, 4, 0.74), (512, 8, 1.0)])
def test_compare_of_other_per_device_batches_warns_and_judges_no_noise(outputs: Path, gbs_b, nd_b, slower) -> None:
    """Global batch 1024 vs 512 (or 8 vs 4 devices): one (accum, split) is another per-device batch in each."""
    from sweep.errors import IncomparableSweepsWarning

    a = make_sweep(outputs, "a", accums=(4, 8), splits=(1, 2))
    b = make_sweep(outputs, "b", gbs=gbs_b, nd=nd_b, accums=(4, 8), splits=(1, 2), scale=slower)
    with pytest.warns(IncomparableSweepsWarning, match=rf"a: global batch 1024 on 8 device\(s\), b: global batch {gbs_b} on {nd_b}"):
        cmp = compare([a, b])
    b_rows = cmp[cmp["sweep_id"] == "b"]
    assert b_rows["ratio_vs_first"].notna().any()  # the raw ratio is kept
    assert b_rows["within_noise"].isna().all()  # a 26% drop is never "within noise"


def test_compare_of_one_setting_does_not_warn(outputs: Path) -> None:
    import warnings

    a = make_sweep(outputs, "a", accums=(4, 8), splits=(1, 2))
    b = make_sweep(outputs, "b", accums=(4, 8), splits=(1, 2), scale=0.74)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cmp = compare([a, b])
    assert not cmp.loc[cmp["sweep_id"] == "b", "within_noise"].any()


def test_compare_a_glob_and_needs_two_sweeps(outputs: Path) -> None:
    make_sweep(outputs, "a", accums=(8,), splits=(1, 2))
    make_sweep(outputs, "b", accums=(8,), splits=(1, 2))
    cmp = compare([str(outputs / "*")])
    assert cmp["sweep_id"].drop_duplicates().tolist() == ["a", "b"]
    with pytest.raises(LoadError, match="at least two sweeps, got 1"):
        compare([outputs / "a", outputs / "a"])


# -- import weight ------------------------------------------------------------------------------------
def test_api_and_report_do_not_import_matplotlib() -> None:
    code = "import sys, sweep.analysis.api, sweep.analysis.compare, sweep.report, sweep.analysis.export; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "MPLBACKEND": ""})
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("bad", [None, 3])
def test_load_of_no_sweep_is_one_clear_error(bad):
    with pytest.raises(LoadError) as err:
        api.load(bad)
    assert f"load({bad!r})" in str(err.value) and "sweep dir" in str(err.value) and "\n" not in str(err.value)


def test_files_are_written_with_the_users_umask(tmp_path):
    import os
    import stat

    from sweep.records import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "group-readable.json", "{}")
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "group-readable.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
