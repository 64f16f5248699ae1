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

from sweep.core.confidence import DEFAULT_SE
from sweep.parsers import (
    PRESETS,
    BatchContext,
    Measurement,
    ThroughputError,
    convert,
    get_preset,
    make_parser,
    parser_settings,
    summarize,
)
from sweep.parsers.throughput import IGNORED, MEASURED, NOISE_FLOOR_FACTOR, WARMUP, interval

ROOT = Path(__file__).resolve().parents[1]
ESC = "\x1b"


def parse(kind: str, data: str, chunks: list[int] | None = None) -> list[Measurement]:
    parser = make_parser({"type": kind})
    raw = data.encode()
    out: list[Measurement] = []
    if chunks is None:
        out += parser.feed(raw)
    else:
        pos = 0
        for size in chunks:
            out += parser.feed(raw[pos : pos + size])
            pos += size
        out += parser.feed(raw[pos:])
    return out + parser.close()


# (preset, line, expected fields or None). Each line follows its framework's format string; the
# source file is named above each group.
LINES = [
    # karpathy/nanoGPT train.py: print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
    ("nanogpt", "iter 12: loss 3.2101, time 142.51ms, mfu 38.12%", dict(value=142.51, unit="ms/step", step=12)),
    ("nanogpt", "iter 1: loss 10.9861, time 14101.61ms, mfu -100.00%", dict(value=14101.61, step=1)),
    ("nanogpt", "iter 7: loss 4.0000, time 150.00ms", dict(value=150.0, step=7)),  # before the mfu field existed
    ("nanogpt", "[rank0]: iter 3: loss 9.1, time 141.00ms, mfu 30.00%", dict(value=141.0, step=3, rank=0)),
    ("nanogpt", "0: iter 4: loss 9.1, time 140.50ms, mfu 30.00%", dict(value=140.5, rank=0)),
    ("nanogpt", "step 0: train loss 2.2365, val loss 1.9580", None),  # evaluation
    ("nanogpt", "iter 5: loss 9.1, time 0.00ms, mfu 0.00%", None),
    # NVIDIA/Megatron-LM megatron/training/training.py training_log: log_string pieces joined with ' |'
    ("megatron", " [2025-04-13 23:41:12] iteration       10/    1000 | consumed samples:          160 | elapsed time per "
                 "iteration (ms): 1147.6 | learning rate: 0.000000E+00 | global batch size:    16 | loss scale: 8388608.0 | "
                 "number of skipped iterations:  10 | number of nan iterations:   0 |",
     dict(value=1147.6, unit="ms/step", step=10, global_batch_size=16)),
    ("megatron", " [2025-04-13 23:41:30] iteration       20/    1000 | consumed samples:          320 | elapsed time per "
                 "iteration (ms): 980.2 | throughput per GPU (TFLOP/s/GPU): 45.2 | learning rate: 1.0E-05 | "
                 "global batch size:    16 | lm loss: 9.1E+00 |", dict(value=980.2, step=20, global_batch_size=16)),
    # an older release: no timestamp, no global batch size, "learning rate 1.3E-04 |"
    ("megatron", " iteration      200/    1000 | elapsed time per iteration (ms): 430.0 | learning rate 1.342E-04 | "
                 "lm loss 7.399415E+00 |", dict(value=430.0, step=200, global_batch_size=None)),
    ("megatron", " iteration       50/infinity | consumed samples:          800 | elapsed time per iteration (ms): 512.5 |",
     dict(value=512.5, step=50)),
    ("megatron", " validation loss at iteration 100 | lm loss value: 7.2E+00 | lm loss PPL: 1.3E+03 |", None),
    ("megatron", "[after training is done] datetime: 2025-04-13 23:50:00 ", None),
    # huggingface/transformers trainer.py speed_metrics via ProgressCallback.on_log (str(logs)), and tqdm's bar
    ("hf", "{'train_runtime': 12.3456, 'train_samples_per_second': 1400.5, 'train_steps_per_second': 1.37, "
           "'train_loss': 2.1, 'epoch': 1.0}", dict(value=1400.5, unit="samples/s", step=None)),
    ("hf", "{'train_runtime': '12.35', 'train_samples_per_second': '1400.5', 'train_steps_per_second': '1.37', "
           "'train_loss': '2.1', 'epoch': '1'}", dict(value=1400.5, unit="samples/s")),  # newer: quoted strings
    ("hf", " 45%|████▌     | 9/20 [00:03<00:04,  2.61it/s]", dict(value=2.61, unit="steps/s", step=9)),
    ("hf", "  5%|▌         | 1/20 [00:01<00:30,  1.61s/it]", dict(value=1.61, unit="s/step", step=1)),
    ("hf", "{'eval_loss': 2.3, 'eval_runtime': 1.2, 'eval_samples_per_second': 50.3, 'eval_steps_per_second': 6.3, "
           "'epoch': 1.0}", None),
    ("hf", "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}", None),
    ("hf", "Loading checkpoint shards: 100%|██████████| 2/2 [00:01<00:00,  1.50it/s]", None),
    ("hf", "Map: 100%|██████████| 1000/1000 [00:00<00:00, 5012.34 examples/s]", None),
    ("hf", "  0%|          | 0/20 [00:00<?, ?it/s]", None),
    # pytorch/torchtitan torchtitan/components/metrics.py MetricsProcessor.log (colours on by default)
    ("torchtitan", f"[rank0]:[titan] 2025-06-01 10:00:10,123 - root - INFO - {ESC}[31mstep: 10  {ESC}[32mloss:  8.12345  "
                   f"{ESC}[33mgrad_norm:  1.2345  {ESC}[36mmemory: 40.12GiB(50.71%)  {ESC}[34mtps: 7,912  "
                   f"{ESC}[96mtflops: 300.12  {ESC}[35mmfu: 30.35%{ESC}[39m",
     dict(value=7912.0, unit="tokens/s", per_device=True, step=10, rank=0)),
    ("torchtitan", "[titan] 2024-05-01 10:00:10,123 - root - INFO - step:  1  loss: 12.2345  memory: 30.01GiB(37.90%)  "
                   "tps: 1,234  mfu: 5.12%", dict(value=1234.0, step=1, rank=None)),  # older: no grad_norm/tflops
    ("torchtitan", "2024-03-01 10:00:10,123 - root - INFO - step: 20  loss:  8.1234  memory: 30.01GiB(37.90%)  "
                   "wps: 2,345  mfu: 21.00%", dict(value=2345.0, step=20)),  # early releases: wps
    ("torchtitan", f"[rank0]:[titan] 2025-06-01 10:00:40,123 - root - INFO - {ESC}[33mvalidate step: 30  "
                   f"{ESC}[32mloss:  8.0000  {ESC}[36mmemory: 40.12GiB(50.71%)  {ESC}[34mtps: 20,000{ESC}[39m", None),
    # Lightning TQDMProgressBar / RichProgressBar; NVIDIA/NeMo (1: bar postfix; 2: progress printer)
    ("lightning", "Epoch 0:  45%|████▌     | 9/20 [00:03<00:04,  2.61it/s, v_num=0, train_loss=2.310]",
     dict(value=2.61, unit="batches/s", epoch=0, step=9)),
    ("lightning", "Epoch 1:  10%|█         | 2/20 [00:03<00:27,  1.50s/it, v_num=1]", dict(value=1.5, unit="s/batch", epoch=1)),
    ("lightning", "Epoch 0/9  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 9/20 0:00:03 • 0:00:04 2.61it/s v_num: 0 train_loss: 2.310",
     dict(value=2.61, unit="batches/s", epoch=0, step=9)),
    # max_steps without max_epochs: Lightning 2.6's rich bar prints the epoch total as -2 (its last redraw, in a non-TTY log)
    ("lightning", "Epoch 0/-2 ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 60/30 0:00:00 • 0:00:00 155.09it/s ",
     dict(value=155.09, unit="batches/s", epoch=0, step=60)),
    ("lightning", "Epoch 0: : 100%|██████████| 50/50 [31:51<00:00, reduced_train_loss=6.130, global_step=49.00, "
                  "consumed_samples=76800.0, train_step_timing in s=5.900]", dict(value=5.9, unit="s/step", step=49)),
    ("lightning", "Training epoch 0, iteration 1/249 | lr: 3.922e-06 | global_batch_size: 8 | global_step: 1 | "
                  "reduced_train_loss: 1.653 | train_step_timing in s: 2.505 | consumed_samples: 16",
     dict(value=2.505, unit="s/step", epoch=0, step=1, global_batch_size=8)),
    ("lightning", "Validation DataLoader 0:  50%|█████     | 5/10 [00:00<00:00, 25.00it/s]", None),
    ("lightning", "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 10.00it/s]", None),
    ("lightning", "Validation: iteration 1/5", None),
    # microsoft/DeepSpeed deepspeed/utils/timer.py ThroughputTimer.stop
    ("deepspeed", "[2023-11-07 01:55:23,714] [INFO] [timer.py:260:stop] epoch=0/micro_step=40/global_step=10, "
                  "RunningAvgSamplesPerSec=25.025771473496132, CurrSamplesPerSec=25.704280480541442, MemAllocated=4.32GB, "
                  "MaxMemAllocated=38.49GB", dict(value=pytest.approx(25.70428), unit="samples/s", epoch=0, step=10)),
    ("deepspeed", "[2022-08-29 06:58:56,176] [INFO] [timer.py:198:stop] 0/20, RunningAvgSamplesPerSec=232.7340551694273, "
                  "CurrSamplesPerSec=227.48090316379353, MemAllocated=0.36GB, MaxMemAllocated=15.06GB",
     dict(value=pytest.approx(227.4809), step=20)),
    ("deepspeed", "[2020-09-01 10:00:00,000] [INFO] [timer.py:166:stop] 0/10, SamplesPerSec=230.5", dict(value=230.5, step=10)),
    ("deepspeed", "[2023-11-07 01:55:23,711] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=4, lr=[4.9e-05], "
                  "mom=[(0.9, 0.95)]", None),
    # facebookresearch/fairseq fairseq/logging/progress_bar.py: SimpleProgressBar / JsonProgressBar, tag train_inner
    ("fairseq", "2020-09-23 12:34:56 | INFO | train_inner | epoch 001:    100 / 1000 loss=9.81, nll_loss=9.1, ppl=550.2, "
                "wps=12345.6, ups=3.21, wpb=3840, bsz=128, num_updates=100, lr=1.25e-05, gnorm=1.5, train_wall=31, "
                "gb_free=10.1, wall=33", dict(value=12345.6, unit="tokens/s", epoch=1, step=100, tokens_per_sample=30.0)),
    ("fairseq", "| epoch 001:    100 / 1000 loss=9.810, nll_loss=9.100, ppl=550.20, wps=12346, ups=3, wpb=3840.000, "
                "bsz=128.000, num_updates=100, lr=1.25e-05, gnorm=1.500, clip=0.000, oom=0.000, wall=33, train_wall=31",
     dict(value=12346.0, step=100)),  # the legacy format
    ("fairseq", '2020-09-23 12:34:56 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "9.81", "wps": "12345.6", '
                '"ups": "3.21", "wpb": "3840", "bsz": "128", "num_updates": "100", "lr": "1.25e-05"}',
     dict(value=12345.6, step=100, tokens_per_sample=30.0)),
    ("fairseq", "2020-09-23 12:40:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.9 | nll_loss 8.1 | "
                "ppl 274.3 | wps 45000 | wpb 3900 | bsz 120 | num_updates 1000", None),
    ("fairseq", '2020-09-23 12:40:00 | INFO | valid | {"epoch": 1, "valid_loss": "8.9", "valid_wps": "45000"}', None),
    # huggingface/pytorch-image-models train.py train_one_epoch
    ("timm", "Train: 0 [   0/156 (  0%)]  Loss: 6.912345 (6.9123)  Time: 3.456s,   74.07/s  (3.456s,   74.07/s)  "
             "LR: 1.000e-05  Data: 2.345 (2.345)", dict(value=74.07, unit="samples/s", epoch=0, step=0)),
    ("timm", "Train: 3 [  50/156 ( 33%)]  Loss: 6.91 (6.91)  Time: 0.320s,  800.12/s  (0.330s,  775.76/s)  "
             "LR: 1.000e-03  Data: 0.010 (0.020)", dict(value=800.12, epoch=3, step=50)),
    ("timm", "Test: [   0/49]  Time: 0.686 (0.686)  Loss:  6.8 ( 6.8)  Acc@1:  0.1 ( 0.1)  Acc@5:  0.5 ( 0.5)", None),
    ("timm", "Test (EMA): [  48/49]  Time: 0.100 (0.120)  Loss:  6.7 ( 6.7)  Acc@1:  0.2 ( 0.1)", None),
    # karpathy/nanochat scripts/base_train.py print0(f"step {step:05d}/{num_iterations:05d} ... | tok/sec: {tok_per_sec:,} ...")
    ("nanochat", "step 00012/01000 (1.20%) | loss: 6.123456 | lrm: 1.00 | dt: 651.23ms | tok/sec: 740,000 | mfu: 42.50 | "
                 "total time: 0.12m", dict(value=740000.0, unit="tokens/s", step=12)),
    ("nanochat", "step 00013/01000 (1.30%) | loss: 6.0 | grad norm: 0.9012 | lrm: 1.00 | dt: 652.00ms | tok/sec: 739,100 | "
                 "bf16_mfu: 42.40 | total time: 0.13m", dict(value=739100.0, step=13)),
    ("nanochat", "Step 00250 | Validation bpb: 0.8123", None),
]


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
