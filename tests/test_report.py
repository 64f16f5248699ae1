"""python -m sweep.report and the export forms, on sweep dirs written like the orchestrator writes them."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.results import make_sweep

from sweep import report
from sweep.analysis import export
from sweep.analysis.api import load
from sweep.core.recommendation import Recommendation

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REC = Recommendation.from_record({"accum": 1, "split": 8, "per_device_batch": 128, "joint_batch": 16, "global_batch_size": 1024,
                                  "num_devices": 8, "machine": "dgx-a100", "confidence": 70})


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    return tmp_path / "outputs"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    assert len(data) > 5_000, f"{path} is only {len(data)} bytes"
    return struct.unpack(">II", data[16:24])


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = report.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# -- the report ---------------------------------------------------------------------------------------
def test_report_prints_table_and_writes_summary_and_plots(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = make_sweep(outputs, "2024-05-01_a100")
    rc, out, err = run_main(capsys, outputs / "latest")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("sweep 2024-05-01_a100: dgx-a100, workload rnnt, global batch 1024 on 8 device(s)")
    assert "rank  accum  split" in out and "oom (encoder)" in out and "oom (joint)" in out
    # Plain text (stdout is not a terminal here): the rank-1 row right under the header, no box drawing.
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    assert lines[header + 1].split()[:3] == ["1", "2", "4"]
    assert "\u2502" not in out and "\u2501" not in out
    assert "recommended accum=2 split=4: 1.75x the split=1 baseline, confidence 80/100" in out
    assert "flags: --grad_accumulation_batches=2 --batch_split_factor=4" in out

    summary = (sweep / "summary.md").read_text()
    for expected in ["# Sweep 2024-05-01_a100", "- machine: dgx-a100", "- global batch: 1024 samples over 8 device(s)",
                     "confidence 80/100", "| rank | accum | split |", "| 1 | 2 | 4 | 64 | 16 | ok |",
                     "--grad_accumulation_batches=2 --batch_split_factor=4",
                     "data.micro_batch_size=64 data.global_batch_size=1024 trainer.accumulate_grad_batches=2",
                     "sbatch --nodes=1", "grad_accumulation_batches: 2", "](heatmap.png)", "](scaling.png)"]:
        assert expected in summary
    heat_w, heat_h = png_size(sweep / "heatmap.png")
    assert heat_w > 600 and heat_h > 400
    png_size(sweep / "scaling.png")
    assert not list(sweep.glob(".*.tmp"))


def test_report_on_a_running_sweep(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = make_sweep(outputs, "run", finished={(8, 1), (4, 2)}, running=[(8, 2)])
    rc, out, _ = run_main(capsys, sweep)
    assert rc == 0
    assert "state running" in out and "running" in out and "pending" in out
    assert "recommended accum=4 split=2" in out
    png_size(sweep / "heatmap.png")
    png_size(sweep / "scaling.png")


def test_report_before_anything_ran_ok(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = make_sweep(outputs, "early", finished=set(), running=[(8, 1)])
    rc, out, _ = run_main(capsys, sweep)
    assert rc == 0 and "no recommendation yet: no trial has run ok" in out
    png_size(sweep / "heatmap.png")
    rc, out, err = run_main(capsys, sweep, "--export", "flags")
    assert rc == 1 and out == "" and "no recommendation yet" in err


def test_rich_table_on_a_terminal(outputs: Path) -> None:
    df = load(make_sweep(outputs, "a"))
    buf = io.StringIO()
    report.print_table(df, buf, use_rich=True, width=160)
    text = buf.getvalue()
    assert "samples/s" in text and "1,578.7" in text and "\u2503" in text  # rich draws column rules


# -- --compare ----------------------------------------------------------------------------------------
def test_compare_writes_and_prints_comparison(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = make_sweep(outputs, "a", accums=(4, 8), splits=(1, 2, 4))
    b = make_sweep(outputs, "b", machine="dgx-h100", accums=(8, 16), splits=(1, 2, 4),
                   scale_pairs={(8, 1): 1.3, (8, 2): 1.002})
    rc, out, err = run_main(capsys, a, "--compare", b)
    assert rc == 0
    written = (a / "comparison.md").read_text()
    assert out == written and "comparison.md" in err
    assert "| A | a | dgx-a100 |" in written and "| B | b | dgx-h100 |" in written
    rows = {tuple(line.split(" | ")[0:2]): line for line in written.splitlines() if line.startswith("| ") and " | " in line}
    assert "1.30x |" in rows[("| 8", "1")] and "(noise)" not in rows[("| 8", "1")]
    assert "1.00x (noise)" in rows[("| 8", "2")]
    assert rows[("| 16", "1")].startswith("| 16 | 1 | - |")  # only in B: A shows "-"
    assert "oom (joint)" in rows[("| 4", "1")]
    assert "- B vs A: 1 pair(s) faster, 0 slower, 2 within noise, over 3 pair(s) both ran ok" in written


# -- --export ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "form, expected",
    [
        ("flags", "--grad_accumulation_batches=2 --batch_split_factor=4"),
        ("yaml", "global_batch_size: 1024\ngrad_accumulation_batches: 2\nbatch_split_factor: 4"),
        ("nemo", "data.micro_batch_size=64 data.global_batch_size=1024 trainer.accumulate_grad_batches=2"),
        ("slurm", 'sbatch --nodes=1 --gpus-per-node=8 --ntasks-per-node=8 --wrap "python train.py '
                  '--global_batch_size=1024 --grad_accumulation_batches=2 --batch_split_factor=4"'),
    ],
)
def test_export_forms(outputs: Path, capsys: pytest.CaptureFixture[str], form: str, expected: str) -> None:
    sweep = make_sweep(outputs, "a")
    rc, out, err = run_main(capsys, sweep, "--export", form)
    assert (rc, out, err) == (0, expected + "\n", "")
    assert not (sweep / "summary.md").exists()  # --export only prints


def test_export_slurm_multi_node_and_template(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = make_sweep(outputs, "a")
    rc, out, _ = run_main(capsys, sweep, "--export", "slurm", "--nodes", "2",
                          "--train-command", "srun python rnnt/train.py --model_config=$CFG {flags}")
    assert rc == 0
    assert out.strip() == ("sbatch --nodes=2 --gpus-per-node=4 --ntasks-per-node=4 --wrap "
                           "'srun python rnnt/train.py --model_config=$CFG "
                           "--grad_accumulation_batches=2 --batch_split_factor=4'")
    rc, _, err = run_main(capsys, sweep, "--export", "slurm", "--nodes", "3")
    assert rc == 2 and "nodes=3 does not divide num_devices=8" in err


def test_export_module_is_pure_and_checks_input() -> None:
    assert export.slurm_command(REC) == (
        'sbatch --nodes=1 --gpus-per-node=8 --ntasks-per-node=8 --wrap "python train.py '
        '--global_batch_size=1024 --grad_accumulation_batches=1 --batch_split_factor=8"'
    )
    assert export.nemo_overrides(REC) == (
        "data.micro_batch_size=128 data.global_batch_size=1024 trainer.accumulate_grad_batches=1"
    )
    assert export.train_command(REC, "train --bs={per_device_batch}/{joint_batch}") == "train --bs=128/16"
    with pytest.raises(ValueError, match="unknown placeholder.*lr"):
        export.train_command(REC, "train {lr}")
    with pytest.raises(ValueError, match="no recommendation yet"):
        export.flags(None)
    with pytest.raises(ValueError, match="unknown export form"):
        export.render("toml", REC)


# -- bad input ------------------------------------------------------------------------------------------
def test_bad_input_exits_2_with_one_line(tmp_path: Path, outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_sweep = tmp_path / "empty"
    not_sweep.mkdir()
    old = make_sweep(outputs, "old")
    meta = json.loads((old / "sweep.json").read_text())
    (old / "sweep.json").write_text(json.dumps({**meta, "schema_version": 0}))
    cases = [
        ([tmp_path / "missing"], "missing: no such directory"),
        ([not_sweep], "empty: not a sweep dir; expected a directory containing trials.csv"),
        ([old / "trials.csv"], "trials.csv: not a sweep dir"),
        ([old], "schema_version=0"),
        ([outputs / "latest", "--compare", tmp_path / "missing"], "missing: no such directory"),
    ]
    for argv, message in cases:
        rc, out, err = run_main(capsys, *argv)
        assert rc == 2, argv
        assert message in err and err.count("\n") == 1 and err.startswith("sweep.report: error: ")


def test_entry_point_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sweep.report", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("e.g. outputs/latest") and "nope" in proc.stderr


def test_report_on_a_sweep_with_a_zero_throughput_row(outputs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before issue 30 a trial could be 'ok' at 0 samples/s, left unranked in trials.csv; the heatmap
    then crashed with 'boolean value of NA is ambiguous'. Such sweeps still exist on disk."""
    import csv

    sweep = make_sweep(outputs, "zero")
    table = sweep / "trials.csv"
    rows = list(csv.DictReader(table.open()))
    zero = next(r for r in rows if r["status"] == "ok" and r["rank"] not in ("", "1"))
    zero.update(rank="", throughput_samples_per_s="0", throughput_low_samples_per_s="0",
                throughput_high_samples_per_s="0", speedup="")
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    rc, out, err = run_main(capsys, sweep)
    assert rc == 0 and err == "", err
    assert "wrote" in out and (sweep / "heatmap.png").exists()
