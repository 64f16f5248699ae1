"""A 1-D sweep (a framework with no batch split) says nothing about a split: the recommendation line and
its export forms are in the framework's own flags, and the plots draw no split axis; its unit is shown."""

from __future__ import annotations

import pandas as pd
import pytest

from sweep.analysis import export, plots
from sweep.core.ranking import SweepMeta
from sweep.core.recommendation import recommendation, recommendation_line
from sweep.core.schema import TrialResult

NANOGPT = "--batch_size={per_device_batch} --gradient_accumulation_steps={accum}"


def results(split: int = 1) -> dict[str, TrialResult]:
    out = {}
    for accum, tp in ((1, 900.0), (2, 1000.0), (4, 950.0)):
        r = TrialResult(accum=accum, split=split, per_device_batch=64 // accum, joint_batch=64 // accum // split,
                        global_batch_size=64, num_devices=1, status="ok", throughput=tp, throughput_low=tp * 0.99,
                        throughput_high=tp * 1.01, throughput_unit="tokens/s", steps_measured=5)
        out[r.key] = r
    return out


def meta(**kw) -> SweepMeta:
    return SweepMeta("s1", "local", "command", 64, 1, **kw)


def test_1d_recommendation_is_in_the_frameworks_flags() -> None:
    rec = recommendation(meta(parser="nanogpt", throughput_unit="tokens/s", splits_apply=False, flags_template=NANOGPT), results(), 80)
    assert rec is not None
    assert (rec.flags, rec.throughput_unit, rec.splits_apply) == (
        "--batch_size=32 --gradient_accumulation_steps=2", "tokens/s", False)
    line = recommendation_line(rec)
    assert line == "recommended --batch_size=32 --gradient_accumulation_steps=2 (accum=2): 1.11x the accum=1 baseline, confidence 80/100"
    assert "split" not in line
    assert export.flags(rec) == "--batch_size=32 --gradient_accumulation_steps=2"
    assert "batch_split_factor" not in export.yaml_snippet(rec) and "per_device_batch_size: 32" in export.yaml_snippet(rec)
    assert "--gradient_accumulation_steps=2" in export.render("slurm", rec)


def test_2d_recommendation_is_unchanged() -> None:
    rec = recommendation(meta(), results(split=2), 80)
    assert rec is not None and rec.flags == "--grad_accumulation_batches=2 --batch_split_factor=2"
    assert recommendation_line(rec).startswith("recommended accum=2 split=2: ")
    assert "batch_split_factor: 2" in export.yaml_snippet(rec)


def table(split: int, unit: str | None = "tokens/s") -> pd.DataFrame:
    rows = []
    for r in results(split).values():
        rows.append(dict(sweep_id="s1", machine="local", workload="command", global_batch_size=64, num_devices=1, rank=None,
                         accum=r.accum, split=r.split, per_device_batch=r.per_device_batch, joint_batch=r.joint_batch,
                         status="ok", oom_phase=None, throughput_samples_per_s=r.throughput,
                         throughput_low_samples_per_s=r.throughput_low, throughput_high_samples_per_s=r.throughput_high,
                         speedup=None))
    rows[1]["rank"] = 1
    df = pd.DataFrame(rows)
    if unit:
        df["throughput_unit"] = unit
    return df


@pytest.mark.parametrize("split,one_d", [(1, True), (2, False)])
def test_plots_draw_a_split_axis_only_for_2d(split: int, one_d: bool) -> None:
    ax = plots.heatmap_figure(table(split)).axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert (ax.get_xlabel(), ticks) == (("", [""]) if one_d else ("batch_split_factor (split)", ["2"]))
    scaling = plots.scaling_figure(table(split)).axes[0]
    labels = [t.get_text() for t in scaling.get_legend().get_texts()]
    assert any(label.startswith("split=") for label in labels) is not one_d
    assert scaling.get_ylabel() == "throughput (tokens/s)"


def test_plots_default_to_samples_per_s_without_a_unit_column(tmp_path) -> None:
    assert plots.scaling_figure(table(1, unit=None)).axes[0].get_ylabel() == "throughput (samples/s)"
    path = plots.heatmap(table(1), tmp_path / "h.png", one_d=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_1d_line_when_the_leader_is_the_baseline() -> None:
    res = results()
    res["accum1_split1"].throughput = 2000.0
    rec = recommendation(meta(splits_apply=False, flags_template=NANOGPT, parser="nanogpt"), res, 90)
    assert recommendation_line(rec) == (
        "recommended --batch_size=64 --gradient_accumulation_steps=1 (accum=1): the least accumulation that ran ok is the fastest, "
        "confidence 90/100")
