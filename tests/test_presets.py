"""Framework presets: log lines written from each framework's own format strings, the figures read,
the conversion to samples/s or tokens/s, warm-up and intervals, and the shipped sweeps/<preset>.yaml."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support.parser_lines import LINES, parse

from sweep.core.confidence import DEFAULT_SE
from sweep.errors import ThroughputError
from sweep.parsers import (
    PRESETS,
    BatchContext,
    Measurement,
    convert,
    get_preset,
    make_parser,
    parser_settings,
    summarize,
)
from sweep.parsers.throughput import IGNORED, MEASURED, NOISE_FLOOR_FACTOR, WARMUP, interval

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind,line,expected", LINES)
def test_line_table(kind: str, line: str, expected: dict | None) -> None:
    found = parse(kind, line + "\n")
    if expected is None:
        assert found == []
        return
    assert len(found) == 1
    m = found[0]
    for name, value in expected.items():
        assert getattr(m, name) == value, name


def test_every_preset_has_lines_and_a_parser() -> None:
    assert set(PRESETS) == {"myrtle", "nanogpt", "megatron", "hf", "torchtitan", "lightning", "deepspeed", "fairseq",
                            "timm", "nanochat"}
    assert {k for k, _, e in LINES if e} == set(PRESETS) - {"myrtle"}  # myrtle's lines: tests/test_parsers.py
    for name, preset in PRESETS.items():
        assert type(make_parser({"type": name})).__name__.lower().startswith(name[:4])
        assert preset.units and preset.skip_first >= 0


@pytest.mark.parametrize("kind,line,expected", [row for row in LINES if row[2] is not None])
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 40), max_size=8))
def test_any_chunking_reads_the_same(kind: str, line: str, expected: dict, cuts: list[int]) -> None:
    assert parse(kind, line + "\n", cuts) == parse(kind, line + "\n")


def test_hf_progress_bar_redraws_and_the_eval_bar() -> None:
    # tqdm redraws with \r; the evaluation bar (another total) and the summary of eval must not count.
    bar = "".join(f"\r {i * 5}%|#         | {i}/20 [00:0{i % 10}<00:10,  {2.0 + i / 100:.2f}it/s]" for i in range(1, 9))
    evalbar = "".join(f"\r{i * 10}%|#         | {i}/13 [00:00<00:00, 40.{i}it/s]" for i in range(1, 4))
    log = f"{bar}\n{{'eval_loss': 2.3, 'eval_samples_per_second': 99.0}}\n{evalbar}\n{{'train_runtime': 9.0, 'train_samples_per_second': 140.0}}\n"
    found = parse("hf", log)
    assert [m.step for m in found if m.unit == "steps/s"] == list(range(1, 9))
    assert [m.value for m in found if m.unit == "samples/s"] == [140.0]
    s = parser_settings({"type": "hf"}).summarize(found, global_batch_size=64)
    assert s.unit == "samples/s" and s.measured == 3 and s.warmup == 5  # bar figures 6, 7, 8
    assert s.value == pytest.approx(64 * 2.07)
    assert [f.role for f in s.figures][-1] == IGNORED  # the run average: the bar is preferred


# --- conversion ------------------------------------------------------------------------

CTX = BatchContext(global_batch_size=256, num_devices=8, accum=4)
CONVERSIONS = [
    (Measurement(1000.0), CTX, "samples/s", 1000.0),
    (Measurement(500.0, unit="ms/step"), CTX, "samples/s", 512.0),
    (Measurement(0.5, unit="s/step"), CTX, "samples/s", 512.0),
    (Measurement(2.0, unit="steps/s"), CTX, "samples/s", 512.0),
    (Measurement(8.0, unit="batches/s"), CTX, "samples/s", 512.0),  # 8 micro-batches/s x 64 samples
    (Measurement(0.125, unit="s/batch"), CTX, "samples/s", 512.0),
    (Measurement(1000.0, unit="tokens/s", per_device=True), CTX, "tokens/s", 8000.0),
    (Measurement(500.0, unit="ms/step", global_batch_size=128), CTX, "samples/s", 256.0),  # the log's own batch wins
    (Measurement(500.0, unit="ms/step"), BatchContext(256, tokens_per_sample=1024), "tokens/s", 512.0 * 1024),
    (Measurement(30000.0, unit="tokens/s", tokens_per_sample=30.0), CTX, "samples/s", 1000.0),
    (Measurement(8192.0, unit="tokens/s"), BatchContext(tokens_per_sample=2048), "samples/s", 4.0),
]


@pytest.mark.parametrize("m,ctx,unit,expected", CONVERSIONS)
def test_convert(m: Measurement, ctx: BatchContext, unit: str, expected: float) -> None:
    assert convert(m, ctx, unit) == pytest.approx(expected)


@pytest.mark.parametrize(
    "m,ctx,unit,message",
    [
        (Measurement(500.0, unit="ms/step"), BatchContext(), "samples/s", "needs the global batch size (--global-batch-size)"),
        (Measurement(8.0, unit="batches/s"), BatchContext(256), "samples/s", "needs the accumulation steps"),
        (Measurement(1000.0, unit="tokens/s"), BatchContext(), "samples/s", "needs tokens_per_sample"),
        (Measurement(1000.0), BatchContext(), "tokens/s", "needs tokens_per_sample"),
    ],
)
def test_convert_errors_are_one_line(m: Measurement, ctx: BatchContext, unit: str, message: str) -> None:
    with pytest.raises(ThroughputError, match="^[^\n]*$") as info:
        convert(m, ctx, unit)
    assert message in str(info.value)


@given(gbs=st.integers(1, 10_000), ms=st.floats(0.01, 1e6), devices=st.integers(1, 64))
def test_step_time_and_rate_agree(gbs: int, ms: float, devices: int) -> None:
    ctx = BatchContext(global_batch_size=gbs, num_devices=devices)
    from_time = convert(Measurement(ms, unit="ms/step"), ctx, "samples/s")
    from_rate = convert(Measurement(1000.0 / ms, unit="steps/s"), ctx, "samples/s")
    assert from_time == pytest.approx(gbs * 1000.0 / ms) == pytest.approx(from_rate)


# --- warm-up, intervals, summary -------------------------------------------------------

def steps(values: list[float], unit: str = "ms/step", **kw) -> list[Measurement]:
    return [Measurement(v, step=i, unit=unit, line=i + 1, **kw) for i, v in enumerate(values)]


def test_warmup_then_median_and_interval() -> None:
    ms = steps([5000.0, 900.0] + [100.0 + i for i in range(10)])
    s = summarize(ms, BatchContext(global_batch_size=100), skip_first=2)
    assert [f.role for f in s.figures] == [WARMUP] * 2 + [MEASURED] * 10
    assert s.value == pytest.approx(statistics.median(100_000 / (100.0 + i) for i in range(10)))
    assert s.low is not None and s.high is not None and s.low < s.value < s.high
    assert s.low == pytest.approx(100_000 / 108) and s.high == pytest.approx(100_000 / 101)  # ranks 1 and 8 of 10
    assert s.interval_note == "" and s.after_warmup and s.unit == "samples/s" and s.warmup == 2


def test_one_figure_is_widened_by_the_noise_floor_not_x_x() -> None:
    s = summarize(steps([5000.0, 100.0]), BatchContext(global_batch_size=100), skip_first=1)
    assert s.value == pytest.approx(1000.0)
    assert s.low == pytest.approx(1000.0 / NOISE_FLOOR_FACTOR) and s.high == pytest.approx(1000.0 * NOISE_FLOOR_FACTOR)
    assert s.interval_note == "one figure only: interval widened by the +-10% noise floor, not measured"
    # The confidence score reads the same standard error back from that interval as it gives a bare result.
    assert (math.log(s.high) - math.log(s.low)) / (2 * 1.96) == pytest.approx(DEFAULT_SE)


def test_few_figures_say_their_coverage() -> None:
    low, high, note = interval([3.0, 1.0, 2.0])
    assert (low, high) == (1.0, 3.0) and note.startswith("only 3 figures") and "75% coverage" in note


def test_only_warmup_figures_is_flagged() -> None:
    s = summarize(steps([5000.0, 900.0]), BatchContext(global_batch_size=100), skip_first=5)
    assert not s.after_warmup and s.value == pytest.approx(100_000 / 900) and "includes warm-up" in s.note


def test_lowest_rank_and_last_redraw_count() -> None:
    ms = [
        Measurement(1000.0, step=1, unit="tokens/s", per_device=True, rank=1, line=1),
        Measurement(900.0, step=1, unit="tokens/s", per_device=True, rank=0, line=2),
        Measurement(950.0, step=1, unit="tokens/s", per_device=True, rank=0, line=3),  # redrawn
        Measurement(960.0, step=2, unit="tokens/s", per_device=True, rank=0, line=4),
    ]
    s = summarize(ms, BatchContext(num_devices=4), skip_first=0)
    assert [f.role for f in s.figures] == [IGNORED, IGNORED, MEASURED, MEASURED]
    assert s.unit == "tokens/s" and s.value == pytest.approx(4 * 955.0)


def test_preferred_unit_and_fallback() -> None:
    ms = [*steps([2.0] * 3, unit="s/step"), *steps([9.0] * 6, unit="batches/s")]
    ctx = BatchContext(global_batch_size=64, accum=2)
    s = summarize(ms, ctx, skip_first=1, prefer=("s/step", "batches/s"))
    assert s.value == pytest.approx(32.0) and s.measured == 2
    s = summarize(ms, ctx, skip_first=3, prefer=("s/step", "batches/s"))  # no s/step figure after the warm-up
    assert s.value == pytest.approx(9.0 * 32) and s.measured == 3


def test_myrtle_epochs_as_the_runner_picks_them() -> None:
    ms = [Measurement(t, epoch=e, line=e) for e, t in ((1, 800.0), (2, 1400.0), (3, 1300.0))]
    s = parser_settings({"type": "myrtle"}).summarize(ms, global_batch_size=1024)
    assert s.value == 1400.0 and s.low < 1400.0 < s.high and "epoch 2 average" in s.note


@given(values=st.lists(st.floats(0.5, 1e5), min_size=1, max_size=40), skip=st.integers(0, 5))
def test_summary_is_inside_its_interval(values: list[float], skip: int) -> None:
    s = summarize(steps(values, unit="samples/s"), BatchContext(), skip_first=skip)
    assert s.low is not None and s.high is not None
    assert s.low <= s.value <= s.high
    assert (s.low < s.high) or s.measured > 1  # one figure is never "[x, x]"
    assert s.measured + s.warmup == len(values)
    assert math.isfinite(s.value)


# --- settings, flags -------------------------------------------------------------------

def test_settings_defaults_and_overrides() -> None:
    assert parser_settings({"type": "nanogpt"}).skip_first == 5
    assert parser_settings({"type": "nanochat"}).skip_first == 10
    s = parser_settings({"type": "torchtitan", "skip_first": 0, "tokens_per_sample": 2048, "stop_after": 5})
    assert (s.skip_first, s.tokens_per_sample, s.stop_after, s.preset.per_device) == (0, 2048.0, 5, True)
    assert parser_settings(None).type == "myrtle" and parser_settings(None).warmup_by == "epochs"
    assert parser_settings({"type": "regex", "pattern": r"(?P<throughput>\d+) tok/s", "unit": "tokens/s"}).preset is None


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"type": "nanogtp"}, "parser.type='nanogtp' is not supported; valid types: jsonl, myrtle, regex, and the framework presets"),
        ({"type": "nanogpt", "skip_first": -1}, "parser.skip_first=-1 must be a whole number >= 0"),
        ({"type": "nanogpt", "tokens_per_sample": 0}, "parser.tokens_per_sample=0 must be a positive number"),
        ({"type": "nanogpt", "throughput_unit": "it/s"}, "parser.throughput_unit='it/s' is not one of samples/s, tokens/s"),
        ({"type": "regex", "pattern": r"(?P<throughput>\d+)", "unit": "mfu"}, "parser.unit='mfu' is not one of"),
        ({"type": "timm", "key": "x"}, "unknown key(s) key for type 'timm'; valid keys: none"),
    ],
)
def test_settings_errors_are_one_line(spec: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parser_settings(spec)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("nanogpt", "--batch_size=16 --gradient_accumulation_steps=16"),  # nanoGPT counts accumulation over all GPUs
        ("hf", "--per_device_train_batch_size=16 --gradient_accumulation_steps=2"),
        ("megatron", "--micro-batch-size=16 --global-batch-size=256"),
        ("torchtitan", "--training.local_batch_size=16 --training.global_batch_size=256"),
        ("lightning", "data.micro_batch_size=16 trainer.accumulate_grad_batches=2"),
        ("deepspeed", '"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2'),
        ("fairseq", "--batch-size=16 --update-freq=2"),
        ("timm", "--batch-size=16 --grad-accum-steps=2"),
        ("nanochat", "--device-batch-size=16"),  # --total-batch-size counts tokens: left as the user set it
        ("myrtle", "--grad_accumulation_batches=2"),
    ],
)
def test_recommendation_in_the_frameworks_flags(name: str, expected: str) -> None:
    assert get_preset(name).recommend(per_device_batch=16, accum=2, global_batch_size=256, num_devices=8) == expected


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="parser preset 'keras' is not known; valid presets: myrtle, nanogpt"):
        get_preset("keras")


# --- the shipped sweeps/<preset>.yaml ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(set(PRESETS) - {"myrtle"}))
def test_each_preset_ships_a_1d_sweep_with_its_own_flags(name: str) -> None:
    cfg = yaml.safe_load((ROOT / "sweeps" / f"{name}.yaml").read_text())
    wl = cfg["workload"]
    preset = get_preset(name)
    assert wl["splits_apply"] is False and wl["parser"]["type"] == name
    parser_settings(wl["parser"])
    argv = " ".join(wl["argv"])
    assert "{split}" not in argv and "{per_device_batch}" in argv
    assert preset.micro_batch_flag in argv
    assert (preset.accum_flag or preset.global_batch_flag) in argv
