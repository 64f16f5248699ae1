"""The log fallback reads the lines issue 45 found misread, as the frameworks print them.

- NeMo ASR on plain Lightning: a bar with both the rate and TimingCallback's `train_step_timing in s` in its
  postfix, no global_step. The bar's rate is read (1.94 batches/s), as on any Lightning bar: it counts the
  loading between batches, which the callback's time leaves out.
- NeMo's DeltaTimingCallback (its MLPerf LLM recipes): `print_once(f'Step {n} train_step_timing {d} timestamp:
  {t1*1000}')`, also seen as `Step 12: train_step_timing in s=0.78`: s per optimizer step (a Lightning batch is
  the global batch in those Megatron-based models).
- Out-of-memory errors told in the trainer's own words: fairseq's trainer.py (`_log_oom`, then
  `logger.warning("attempting to recover from OOM in forward/backward pass")`), icefall's
  scan_pessimistic_batches_for_oom (`logging.error("Your GPU ran out of memory with the current max_duration
  setting. ...")`), NeMo's scripts/speech_recognition/oomptimizer.py (`click.echo(f"\\tCurrent gap:
  {gen.current_rel_gap}... ", nl=False)`, then `click.secho("OOM!")`).
"""

from __future__ import annotations

import pytest

from sweep.core.schema import FAILED, OOM
from sweep.parsers import make_parser, parser_settings
from sweep.parsers.classify import classify_failure


def parse(kind: str, text: str):
    parser = make_parser({"type": kind})
    return parser.feed(text.encode()) + parser.close()


def test_a_nemo_bar_with_its_rate_and_step_timing_is_read_by_the_rate():
    tqdm = pytest.importorskip("tqdm")
    # What Lightning's TQDMProgressBar draws (tqdm's own format_meter), with NeMo's TimingCallback in the postfix.
    line = tqdm.tqdm.format_meter(12, 100, 6.19, prefix="Epoch 0", rate=1.94, postfix="v_num=0, train_step_timing in s=0.516")
    assert line.startswith("Epoch 0:  12%|") and "1.94it/s, v_num=0, train_step_timing in s=0.516]" in line
    (m,) = parse("lightning", line + "\n")
    assert (m.value, m.unit, m.step, m.epoch) == (1.94, "batches/s", 12, 0)
    # The same in Lightning's rich bar, which dropped the line before.
    rich = "Epoch 0/9  ━━━━━━━━━━━━━━━━━━━━━ 12/100 0:00:06 • 0:00:45 1.94it/s v_num: 0 train_step_timing in s: 0.516"
    (r,) = parse("lightning", rich + "\n")
    assert (r.value, r.unit, r.step, r.epoch) == (1.94, "batches/s", 12, 0)
    # A global batch of 64 at accum=2: 32 samples in each micro-batch, 1.94 of them a second.
    bars = "\r".join(tqdm.tqdm.format_meter(i, 100, i / 1.94, prefix="Epoch 0", rate=1.94,
                                            postfix="v_num=0, train_step_timing in s=0.516") for i in range(1, 13))
    s = parser_settings({"type": "lightning"}).summarize(parse("lightning", bars + "\n"), global_batch_size=64, accum=2)
    assert s.value == pytest.approx(1.94 * 32) and s.measured == 12 - 3


def test_a_bar_with_no_rate_yet_is_read_by_the_step_timing():
    line = "Epoch 0:   0%|          | 0/100 [00:00<?, ?it/s, v_num=0, train_step_timing in s=0.516]"
    (m,) = parse("lightning", line + "\n")
    assert (m.value, m.unit) == (0.516, "s/batch")


@pytest.mark.parametrize(
    "line",
    [
        "Step 12 train_step_timing 0.7812345676422119 timestamp: 1717171717171.1235",  # the callback's own f-string
        "Step 12: train_step_timing in s=0.78",
        "[rank0]: Step 12 train_step_timing 0.78 timestamp: 1717171717171.1235",
    ],
)
def test_nemos_delta_timing_callback_line_is_a_step_time(line):
    (m,) = parse("lightning", line + "\n")
    assert (round(m.value, 2), m.unit, m.step, round(m.step_time_s, 2)) == (0.78, "s/step", 12, 0.78)


def test_delta_timing_validation_and_average_lines_are_not_read():
    text = ("validation_step_timing 0.1234 timestamp: 1717171717171.1235\n"
            "Average train_step_time 0.79\n Average valid_step_time 0.12 \n")
    assert parse("lightning", text) == []


FAIRSEQ = """\
2024-05-01 10:00:01 | INFO | train_inner | epoch 001:     10 / 1000 loss=9.1, wps=12000, ups=3.1, wpb=4000, bsz=128
2024-05-01 10:00:02 | WARNING | fairseq.trainer | OOM: Ran out of memory with exception: CUDA out of memory. Tried to allocate 1.95 GiB (GPU 1; 79.15 GiB total capacity; 76.02 GiB already allocated)
|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 1                 |
|===========================================================================|
2024-05-01 10:00:02 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass
Traceback (most recent call last):
  File "/opt/fairseq/fairseq_cli/train.py", line 557, in cli_main
    distributed_utils.call_main(cfg, main)
  File "/opt/fairseq/fairseq/trainer.py", line 943, in train_step
    self._check_grad_norms(grad_norm)
  File "/opt/fairseq/fairseq/trainer.py", line 1502, in _check_grad_norms
    raise FloatingPointError(
FloatingPointError: Fatal error: gradients are inconsistent between workers. Try --ddp-backend=legacy_ddp. Or are you mixing up different generation of GPUs in training?
--------------------------------------------------------------------------------
grad_norm across the workers:
rank   0 = 3.18215919
rank   1 = 0.00000000
--------------------------------------------------------------------------------
"""

FAIRSEQ_WARNING_ONLY = """\
2024-05-01 10:00:02 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass
2024-05-01 10:00:02 | WARNING | fairseq.trainer | OOM in all workers, skipping update
torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 1
"""

ICEFALL = """\
2024-03-01 10:11:12,345 INFO [train.py:1180] (0/2) Sanity check -- see if any of the batches in epoch 1 would cause OOM.
2024-03-01 10:11:20,123 ERROR [train.py:1200] (0/2) Your GPU ran out of memory with the current max_duration setting. We recommend decreasing max_duration and trying again.
Failing criterion: single_longest_cut (=29.98) ...
2024-03-01 10:11:20,130 INFO [train.py:1100] (0/2) Saving batch to zipformer/exp/batch-bdd640fb-0667-1ad1-1c80-317fa3b1799d.pt
2024-03-01 10:11:20,140 INFO [train.py:1106] (0/2) features shape: torch.Size([58, 2998, 80])
torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1
"""

OOMPTIMIZER = """\
The current sequence lengths are: input=480000 output=360.
\t[BEGIN step] [CUDA RAM CURRENT: 2312.4MB] [CUDA RAM MAX: 2312.4MB]
\tCurrent gap: None... OOM!
\t[END step] [CUDA RAM CURRENT: 2312.4MB] [CUDA RAM MAX: 71203.9MB]
\t================================================================================
\t[BEGIN step] [CUDA RAM CURRENT: 2312.4MB] [CUDA RAM MAX: 2312.4MB]
\tCurrent gap: 0.5... \x1b[33mOOM!\x1b[0m
"""


@pytest.mark.parametrize(
    "log,reason",
    [
        (FAIRSEQ, "OOM: Ran out of memory with exception: CUDA out of memory"),  # the rank that skipped its batch broke the others
        (FAIRSEQ_WARNING_ONLY, "attempting to recover from OOM in forward/backward pass"),
        (ICEFALL, "Your GPU ran out of memory with the current max_duration setting"),
        (OOMPTIMIZER, "Current gap: None... OOM!"),
    ],
    ids=["fairseq", "fairseq-warning", "icefall", "oomptimizer"],
)
def test_oom_in_a_trainers_own_words_is_oom(log, reason):
    verdict = classify_failure(log, exit_code=1)
    assert verdict.status == OOM and reason in verdict.reason, verdict


def test_a_recovered_oom_followed_by_an_error_of_its_own_is_that_error():
    log = (FAIRSEQ_WARNING_ONLY.splitlines()[0] + "\nTraceback (most recent call last):\n"
           '  File "/opt/fairseq/fairseq/data/indexed_dataset.py", line 260, in __getitem__\n'
           "    raise ValueError(f'bad shard {i} in {self.path}')\nValueError: bad shard 3 in data-bin/train\n")
    verdict = classify_failure(log, exit_code=1)
    assert verdict.status == FAILED and "bad shard" in verdict.reason
