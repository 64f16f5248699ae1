"""Every framework preset against the hazards of real logs, applied to each line of tests/test_presets.py's
table (written from each framework's own format string, source cited there): rank prefixes from torchrun,
mpirun and srun, ANSI colour codes, `\\r` progress-bar redraws, Windows line ends, and validation/eval lines
beside training lines that must not count.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.parser_lines import ESC, LINES, parse

from sweep.parsers import PRESETS, parser_settings
from sweep.parsers.presets import NO_FLAGS_TEMPLATE
from sweep.parsers.throughput import IGNORED, MEASURED, WARMUP

READ = [row for row in LINES if row[2] is not None]
NOT_READ = [row for row in LINES if row[2] is None]


def same_figure(found: list, expected: list, rank: int | None) -> bool:
    """The same figures but for the rank the prefix gave, and the line number (a wrapper may add lines)."""
    return [replace(m, line=0, rank=None) for m in found] == [replace(m, line=0, rank=None) for m in expected] and all(
        m.rank == rank for m in found
    )


# (wrapper, rank it gives). Lines that carry their own prefix keep it (the first prefix wins).
PREFIXES = [
    ("[rank0]:{}", 0),  # torchrun --tee / --log-dir
    ("[rank3]: {}", 3),
    ("0: {}", 0),  # srun --label
    ("[1,2]<stdout>:{}", 2),  # mpirun --tag-output: [job,rank]
]


UNPREFIXED = [row for row in READ if not row[1].lstrip().startswith(("[rank", "0: "))]


@pytest.mark.parametrize("wrap,rank", PREFIXES)
@pytest.mark.parametrize("kind,line,expected", UNPREFIXED, ids=[f"{r[0]}-{i}" for i, r in enumerate(UNPREFIXED)])
def test_rank_prefixes(kind: str, line: str, expected: dict, wrap: str, rank: int) -> None:
    plain = parse(kind, line + "\n")
    assert same_figure(parse(kind, wrap.format(line) + "\n"), plain, rank)


@pytest.mark.parametrize("kind,line,expected", READ, ids=[f"{r[0]}-{i}" for i, r in enumerate(READ)])
def test_ansi_colours_and_crlf(kind: str, line: str, expected: dict) -> None:
    plain = parse(kind, line + "\n")
    # Colour around the whole line and a bold reset in the middle of it, as rich and loguru print.
    coloured = f"{ESC}[1m{ESC}[32m" + line.replace(" ", f" {ESC}[0m", 1) + f"{ESC}[0m\r\n"
    found = parse(kind, coloured)
    assert [replace(m, line=0) for m in found] == [replace(m, line=0) for m in plain]


@pytest.mark.parametrize("kind,line,expected", NOT_READ, ids=[f"{r[0]}-{i}" for i, r in enumerate(NOT_READ)])
def test_eval_lines_do_not_count_behind_prefixes_or_colours(kind: str, line: str, expected: None) -> None:
    for text in (f"[rank0]:{line}", f"0: {line}", f"{ESC}[33m{line}{ESC}[0m", f"\r{line}\r"):
        assert parse(kind, text + "\n") == [], text


# Progress bars that tqdm redraws in place: every redraw ends with \r, only the last with \n.
BARS = [
    ("hf", [f" {i * 5}%|#         | {i}/20 [00:0{i}<00:10,  {2.0 + i / 10:.2f}it/s]" for i in range(1, 8)], "steps/s"),
    ("lightning", [f"Epoch 0:  {i * 5}%|#         | {i}/20 [00:0{i}<00:10,  {3.0 + i / 10:.2f}it/s, v_num=0]" for i in range(1, 8)],
     "batches/s"),
]


@pytest.mark.parametrize("kind,redraws,unit", BARS)
def test_carriage_return_redraws_are_one_figure_each(kind: str, redraws: list[str], unit: str) -> None:
    log = "\r".join(redraws) + "\n"
    found = parse(kind, log)
    assert [m.step for m in found] == list(range(1, 8)) and {m.unit for m in found} == {unit}
    # A bar redrawn twice at one step (tqdm refreshes on time too) counts once: its last figure.
    twice = "\r".join(redraws + [redraws[-1].replace("it/s", "1it/s")]) + "\n"
    s = parser_settings({"type": kind}).summarize(parse(kind, twice), global_batch_size=64, accum=2)
    assert sum(f.role == MEASURED for f in s.figures) + sum(f.role == WARMUP for f in s.figures) == 7


# A training run's log with interleaved validation for each preset: only training figures count.
MIXED = {
    "nanogpt": ["step 0: train loss 10.9874, val loss 10.9890", "iter 0: loss 10.9, time 9000.00ms, mfu -100.00%",
                *[f"iter {i}: loss 9.0, time 100.00ms, mfu 30.00%" for i in range(1, 8)],
                "step 8: train loss 3.1, val loss 3.2"],
    "timm": [*[f"Train: 0 [{i:>4d}/10 ({i * 10:>3d}%)]  Loss: 6.9 (6.9)  Time: 0.100s,  640.00/s  (0.100s,  640.00/s)  LR: 1.000e-03  "
               "Data: 0.010 (0.010)" for i in range(8)],
             "Test: [   0/10]  Time: 0.686 (0.686)  Loss:  6.8 ( 6.8)  Acc@1:  0.1 ( 0.1)  Acc@5:  0.5 ( 0.5)"],
    "torchtitan": [*[f"[rank0]:[titan] 2025-06-01 10:00:10,123 - root - INFO - step: {i}  loss: 8.1  memory: 40.12GiB(50.71%)  "
                     "tps: 1,000  tflops: 300.12  mfu: 30.35%" for i in range(1, 9)],
                   "[rank0]:[titan] 2025-06-01 10:00:40,123 - root - INFO - validate step: 8  loss: 8.0  memory: 40.12GiB(50.71%)  "
                   "tps: 99,999"],
}


@pytest.mark.parametrize("kind", sorted(MIXED))
def test_validation_between_training_lines_does_not_move_the_median(kind: str) -> None:
    found = parse(kind, "\n".join(MIXED[kind]) + "\n")
    s = parser_settings({"type": kind}).summarize(found, global_batch_size=64, num_devices=2)
    assert s.measured + s.warmup == len(found) and s.warmup == PRESETS[kind].skip_first
    expected = {"nanogpt": 640.0, "timm": 640.0, "torchtitan": 2000.0}[kind]
    assert s.value == pytest.approx(expected) and not any(f.role == IGNORED for f in s.figures)


# --- the recommendation in each framework's flags, from its shipped sweeps/<preset>.yaml -------------------

SHIPPED_FLAGS = {
    "nanogpt": "--batch_size=16 --gradient_accumulation_steps=2",
    "megatron": "--micro-batch-size=16 --global-batch-size=256",
    "hf": "--per_device_train_batch_size=16 --gradient_accumulation_steps=2",
    "torchtitan": "--training.local_batch_size=16 --training.global_batch_size=256",
    "lightning": "data.micro_batch_size=16 trainer.accumulate_grad_batches=2",
    "deepspeed": '"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2',  # its JSON config, written by a shell line
    "fairseq": "--batch-size=16 --update-freq=2",
    "timm": "--batch-size=16 --grad-accum-steps=2",
    "nanochat": "--device-batch-size=16",  # --total-batch-size counts tokens and stays as the user set it
}


@pytest.mark.parametrize("name", sorted(SHIPPED_FLAGS))
def test_shipped_sweeps_recommend_in_the_frameworks_flags(name: str) -> None:
    import yaml
    from support.doc_pages import ROOT

    from sweep.core.ranking import SweepMeta
    from sweep.core.recommendation import recommended_flags
    from sweep.core.schema import TrialResult
    from sweep.parsers.presets import flags_template

    cfg = yaml.safe_load((ROOT / "sweeps" / f"{name}.yaml").read_text())
    meta = SweepMeta("s", "m", "command", 256, 8, parser=name, splits_apply=False,
                     flags_template=flags_template(name, cfg["workload"]["argv"]))
    best = TrialResult(accum=2, split=1, per_device_batch=16, joint_batch=16, global_batch_size=256, num_devices=8, status="ok")
    assert recommended_flags(meta, best) == SHIPPED_FLAGS[name]


@pytest.mark.parametrize(
    "parser,argv,expected",
    [
        # Myrtle's names only where the argv has them (the default parser, myrtle, does not bring them)
        ("myrtle", ["python", "train.py", "--grad_accumulation_batches={accum}"], "--grad_accumulation_batches={accum}"),
        ("myrtle", ["python", "t.py", "--batch-size={per_device_batch}", "--accum={accum}"], "--batch-size={per_device_batch} --accum={accum}"),
        ("regex", ["python", "t.py", "--mbs={per_device_batch}", "--nproc={num_devices}", "--steps=5"], "--mbs={per_device_batch}"),
        # no batch token in the argv (the batch goes through workload.env) and no preset: sweep's own names
        ("jsonl", ["python", "t.py", "--out=log.jsonl"], NO_FLAGS_TEMPLATE),
        ("myrtle", ["python", "t.py"], NO_FLAGS_TEMPLATE),
        # a shell line's own words
        ("hf", ["bash", "-c", "python t.py --x={accum}"], "--x={accum}"),
        # a config the shell line writes (no flag among its words): the preset's keys
        ("hf", ["bash", "-c", "echo '{{\"ga\": {accum}}}' > c.json && python t.py c.json"],
         "--per_device_train_batch_size={per_device_batch} --gradient_accumulation_steps={accum}"),
        ("nanogpt", ["python", "train.py"], "--batch_size={per_device_batch} --gradient_accumulation_steps={accum_x_devices}"),
        ("lightning", ["python", "t.py", "+trainer.accumulate_grad_batches={accum}"], "+trainer.accumulate_grad_batches={accum}"),
    ],
)
def test_flags_template(parser: str, argv: list[str], expected: str) -> None:
    from sweep.parsers.presets import flags_template

    assert flags_template(parser, argv) == expected
