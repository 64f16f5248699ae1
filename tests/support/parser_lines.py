"""Log lines written from each framework's own format strings, and the parse helper that reads them
(tests/test_presets.py, tests/test_parsers_frameworks.py)."""

from __future__ import annotations

import pytest

from sweep.parsers import Measurement, make_parser

ESC = "\x1b"


def parse_all(spec: dict, data: bytes, chunks: list[int] | None = None) -> list[Measurement]:
    """Every figure the parser of `spec` reads from `data`, fed whole or in `chunks` (byte counts), then closed."""
    parser = make_parser(spec)
    out: list[Measurement] = []
    if chunks is None:
        out += parser.feed(data)
    else:
        pos = 0
        for size in chunks:
            out += parser.feed(data[pos : pos + size])
            pos += size
        out += parser.feed(data[pos:])
    return out + parser.close()


def parse(kind: str, data: str, chunks: list[int] | None = None) -> list[Measurement]:
    """parse_all for a preset's own lines, as text."""
    return parse_all({"type": kind}, data.encode(), chunks)


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


def lightning_postfix(value: float) -> str:
    """Lightning's Tqdm.format_num: tqdm's 3 significant digits, padded to 5 characters (_PAD_SIZE)."""
    text = f"{value:.3g}"
    return text + "0" * max(0, 5 - len(text))


def caiman_step(epoch: int, it: int, step: int, tput: float) -> str:
    return (f"DLL 2024-01-02 10:11:05.000001 - epoch {epoch:4d} | iter {it:4d}/2 | step {step:4d} | train_loss :  95.3125 "
            f"| train_throughput-audio-samples-per-sec :  {tput:.2f} | train_took :  0.7357")
