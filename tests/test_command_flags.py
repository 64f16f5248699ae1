"""The flags a command's recommendation names are its own argv's batch tokens, filled in (issue 45): whatever
parser reads its log, Myrtle's names appear only where the argv has them; the built-in workload keeps them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.doc_pages import ROOT
from support.results import trial_result
from support.sweep_run import run_sweep

from sweep.analysis import export
from sweep.core.ranking import SweepMeta
from sweep.core.recommendation import Recommendation, recommendation
from sweep.core.schema import TrialResult
from sweep.parsers.presets import flags_template

ARGV_SHAPES = [
    # (argv, the flags line for per_device_batch=8 accum=8 split=1 at a global batch of 64)
    (["python", "train.py", "--batch-size={per_device_batch}", "--accum={accum}"], "--batch-size=8 --accum=8"),
    (["python", "train.py", "--batch-size", "{per_device_batch}", "--accum", "{accum}", "--lr", "0.1"], "--batch-size 8 --accum 8"),
    (["python", "train.py", "batch_size={per_device_batch}", "trainer.accum={accum}"], "batch_size=8 trainer.accum=8"),
    (["python", "train.py", "-b", "{per_device_batch}", "--steps=5"], "-b 8"),
    (["python", "train.py", "{per_device_batch}", "{accum}"], "8 8"),  # positional: the argv's own tokens, in order
    (["bash", "-c", "cd run && exec python train.py --bs={per_device_batch} --ga={accum}"], "--bs=8 --ga=8"),
    # Myrtle's own names, its global batch left out: the sweep's own, stated in the user's command already
    (["python", "train.py", "--global_batch_size={global_batch_size}", "--grad_accumulation_batches={accum}",
      "--batch_split_factor={split}"], "--grad_accumulation_batches=8 --batch_split_factor=1"),
    # no accumulation token: the global batch is how the framework is told it (Megatron derives it)
    (["torchrun", "train.py", "--micro-batch-size={per_device_batch}", "--global-batch-size={global_batch_size}"],
     "--micro-batch-size=8 --global-batch-size=64"),
    # no batch token to paste (the batch only in workload.env, as a value no variable holds alone): one line saying so,
    # with the pair in sweep's own names, never a framework's flags (issue 50)
    (["python", "train.py"], "none to paste: workload.argv and workload.env set no batch flag sweep can name; the pair is "
                             "per_device_batch=8 accum=8 split=1"),
]


def best(accum: int = 8, split: int = 1) -> TrialResult:
    return trial_result(accum, split, gbs=64, status="ok", throughput=100.0, throughput_low=99.0, throughput_high=101.0, steps_measured=5)


def rec_for(parser: str, argv: list[str]) -> Recommendation:
    meta = SweepMeta("s", "local", "command", 64, 1, parser=parser, flags_template=flags_template(parser, argv))
    rec = recommendation(meta, {best().key: best()}, 80)
    assert rec is not None
    return rec


@pytest.mark.parametrize("parser", ["myrtle", "regex", "jsonl"])  # myrtle: the default when none is chosen
@pytest.mark.parametrize("argv,line", ARGV_SHAPES)
def test_the_flags_are_the_argvs_own_for_any_parser_without_a_preset(parser: str, argv: list[str], line: str) -> None:
    rec = rec_for(parser, argv)
    assert rec.flags == line and export.render("flags", rec) == line  # recommendation.yaml and --export flags


def test_a_presets_argv_keeps_its_flags_and_a_preset_fills_in_where_the_argv_has_none() -> None:
    argv = yaml.safe_load((ROOT / "sweeps" / "hf.yaml").read_text())["workload"]["argv"]
    assert rec_for("hf", argv).flags == "--per_device_train_batch_size=8 --gradient_accumulation_steps=8"
    deepspeed = yaml.safe_load((ROOT / "sweeps" / "deepspeed.yaml").read_text())["workload"]["argv"]
    assert rec_for("deepspeed", deepspeed).flags == '"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 8'


def test_the_builtin_workload_keeps_myrtles_flags() -> None:
    meta = SweepMeta("s", "local", "rnnt", 64, 1)  # no argv, no flags_template: the built-in RNN-T
    rec = recommendation(meta, {best(4, 2).key: best(4, 2)}, 80)
    assert rec is not None and rec.flags == "--grad_accumulation_batches=4 --batch_split_factor=2"


MYRTLE_LINES = """\
import sys
args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
bs, accum = int(args["batch-size"]), int(args["accum"])
for epoch in (1, 2, 3):
    tput = (1000.0 if epoch > 1 else 800.0) / accum
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : "
          f"{tput:8.2f} | train_avg_took : {64 / tput:6.4f}", flush=True)
"""


@pytest.mark.e2e
def test_a_plain_command_with_no_parser_chosen_prints_its_own_flags(tmp_path: Path) -> None:
    """Exactly as "Sweeping your own training script" says: workload=command and the argv, nothing else."""
    (tmp_path / "train.py").write_text(MYRTLE_LINES)
    sweep_dir = tmp_path / "s"
    argv = f'["{sys.executable}","train.py","--batch-size={{per_device_batch}}","--accum={{accum}}"]'
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}", "global_batch_size=64",
                      "accum=1,2", "search=grid", "search.drift_check=false", "live=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    flags_line = next(line for line in proc.stdout.splitlines() if line.startswith("flags: "))
    print(flags_line)
    assert flags_line == "flags: --batch-size=64 --accum=1"
    assert "grad_accumulation_batches" not in proc.stdout
    assert yaml.safe_load((sweep_dir / "recommendation.yaml").read_text())["flags"] == "--batch-size=64 --accum=1"
    out = subprocess.run([sys.executable, "-m", "sweep.report", str(sweep_dir), "--export", "flags"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "--batch-size=64 --accum=1", out.stderr
