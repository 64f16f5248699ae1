"""`python -m sweep.logs`: the log checker on logs printed exactly as the frameworks print them
(tests/fake_trainer.py), its figures table and summary, and its one-line errors."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_pages import section

from sweep.logs import agreement, main
from sweep.parsers.throughput import ThroughputSummary

HERE = Path(__file__).resolve().parent
TRAINER = HERE / "fake_trainer.py"


def fake_log(tmp_path: Path, kind: str, **kw: int) -> Path:
    args = dict(accum=2, per_device_batch=16, global_batch_size=256, num_devices=8, steps=12) | kw
    out = subprocess.run(
        [sys.executable, str(TRAINER), f"--kind={kind}", *(f"--{k}={v}" for k, v in args.items())],
        check=True, capture_output=True,
    ).stdout
    path = tmp_path / f"{kind}.log"
    path.write_bytes(out)
    return path


def check(*argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    if cwd is None:
        code = main(list(argv), out=out, err=err)
    else:  # the log named as the README names it, relative to where the command runs
        here = os.getcwd()
        os.chdir(cwd)
        try:
            code = main(list(argv), out=out, err=err)
        finally:
            os.chdir(here)
    return code, out.getvalue(), err.getvalue()


def expected_samples_per_s(accum: int = 2, b: int = 16, devices: int = 8) -> float:
    return devices * 200.0 * b / (b + 8) * (1 - 0.02 * (accum - 1))  # fake_trainer's model


@pytest.mark.parametrize(
    "kind,parser,extra,unit,scale",
    [
        ("step_time", "nanogpt", ["--global-batch-size", "256"], "samples/s", 1.0),
        ("tokens", "torchtitan", ["--num-devices", "8"], "tokens/s", 1024.0),
        ("samples", "timm", [], "samples/s", 1.0),
    ],
)
def test_checker_reports_what_a_trial_would_record(tmp_path: Path, kind: str, parser: str, extra: list[str], unit: str, scale: float) -> None:
    log = fake_log(tmp_path, kind)
    code, out, err = check(str(log), "--parser", parser, *extra)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:7] == ["line", "rank", "epoch", "step", "value", "unit", "counts"]
    skip = {"nanogpt": 5, "torchtitan": 1, "timm": 1}[parser]
    roles = lines[1 : lines.index("")]  # the figures table, one row per figure
    assert sum(" warm-up " in ln for ln in roles) == skip and sum(" measured " in ln for ln in roles) == 12 - skip
    summary = next(ln for ln in lines if ln.startswith("throughput: "))
    value = float(summary.split()[1].replace(",", ""))
    assert value == pytest.approx(expected_samples_per_s() * scale, rel=0.011)  # within the fake's 1% jitter
    assert f" {unit}, 95% interval [" in summary
    assert lines[-1].startswith("from: median of ")


def test_checker_skip_first_and_tokens(tmp_path: Path) -> None:
    log = fake_log(tmp_path, "step_time")
    code, out, _ = check(str(log), "--parser", "nanogpt", "--global-batch-size", "256", "--tokens-per-sample", "1024", "--skip-first", "1")
    assert code == 0
    assert "warm-up: first 1 figure(s)" in out
    summary = next(ln for ln in out.splitlines() if ln.startswith("throughput: "))
    assert "tokens/s" in summary
    assert float(summary.split()[1].replace(",", "")) == pytest.approx(expected_samples_per_s() * 1024, rel=0.011)


def test_checker_single_figure_interval_is_the_noise_floor_not_x_x(tmp_path: Path) -> None:
    log = fake_log(tmp_path, "samples", steps=2)
    code, out, _ = check(str(log), "--parser", "timm")
    assert code == 0
    summary = next(ln for ln in out.splitlines() if ln.startswith("throughput: "))
    value, low, high = (float(x.replace(",", "")) for x in re.findall(r"[\d,]+\.\d", summary)[:3])
    assert low < value < high and high / value == pytest.approx(value / low, rel=1e-2)
    assert "(one figure only: interval widened by the +-10% noise floor, not measured)" in summary


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--parser", "keras"], "sweep.logs: --parser 'keras' is not known; valid parsers: jsonl, myrtle, regex, and the framework presets deepspeed"),
        (["--parser", "timm"], "sweep.logs: no figures the timm parser recognises in "),
        (["--parser", "nanogpt"], "sweep.logs: a figure in ms/step needs the global batch size (--global-batch-size)"),
        (["--parser", "nanogpt", "--num-devices", "0"], "sweep.logs: argument --num-devices: 0 must be >= 1"),
        (["--parser", "nanogpt", "--skip-first", "x"], "sweep.logs: argument --skip-first: 'x' is not a whole number"),
        (["--parser", "regex"], "sweep.logs: parser.type='regex' needs pattern"),
        ([], "sweep.logs: the following arguments are required: --parser"),
    ],
)
def test_checker_bad_input_is_one_line(tmp_path: Path, argv: list[str], message: str) -> None:
    log = fake_log(tmp_path, "step_time")
    code, _, err = check(str(log), *argv)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1


def test_checker_missing_file(tmp_path: Path) -> None:
    code, out, err = check(str(tmp_path / "nope.log"), "--parser", "timm")
    assert (code, out) == (2, "") and err == f"sweep.logs: cannot read {tmp_path / 'nope.log'}: No such file or directory\n"


def test_checker_as_a_command(tmp_path: Path) -> None:
    """The real entry point: exit status 2 and one line on stderr, no traceback; 0 and the table on success."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    log = fake_log(tmp_path, "tokens")
    ok = subprocess.run([sys.executable, "-m", "sweep.logs", str(log), "--parser", "torchtitan", "--num-devices", "8"],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "tokens/s" in ok.stdout and ok.stderr == ""
    bad = subprocess.run([sys.executable, "-m", "sweep.logs", str(log), "--parser", "nanogpt"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == f"sweep.logs: no figures the nanogpt parser recognises in {log}\n"


# The README's checker examples on logs fake_trainer prints: log name -> (kind, steps); and on a real log:
# tests/golden/logs/nanogpt_cpu.log is karpathy/nanoGPT train.py (commit 3adf61e) as printed, 2 layers on CPU.
README_LOGS = {"train.log": ("step_time", 10), "torchtitan.log": ("tokens", 6), "timm.log": ("samples", 6)}
REAL_LOGS = {"nanogpt_cpu.log": HERE / "golden" / "logs" / "nanogpt_cpu.log"}


def readme_checker_runs() -> list[tuple[str, str]]:
    """(command, what it printed) for each `$ python -m sweep.logs` in the docs' framework section (docs/trainers.md)."""
    text = section("Sweeping any training framework")
    runs: list[tuple[str, str]] = []
    for block in text.split("```\n")[1::2]:
        if not block.startswith("$ python -m sweep.logs "):
            continue
        for part in block.split("$ ")[1:]:
            command, _, shown = part.partition("\n")
            runs.append((command, shown))
    return runs


def test_readme_checker_examples_are_real_output(tmp_path: Path) -> None:
    """Every README example on a fake_trainer log is this command's output (stdout, or its one error line)."""
    runs = readme_checker_runs()
    assert {c.split()[3] for c, _ in runs} == {*README_LOGS, *REAL_LOGS}
    for command, shown in runs:
        args = command.split()[3:]  # after "python -m sweep.logs"
        if args[0] in REAL_LOGS:
            (tmp_path / args[0]).write_bytes(REAL_LOGS[args[0]].read_bytes())
        else:
            kind, steps = README_LOGS[args[0]]
            fake_log(tmp_path, kind, steps=steps).rename(tmp_path / args[0])
        code, out, err = check(args[0], *args[1:], cwd=tmp_path)
        assert (out if code == 0 else err) == shown, command
    assert len(runs) == 6


def test_a_real_nanogpt_log() -> None:
    """nanoGPT's own output: its config echo and `step 0:` evaluation are not read; 21 iters, 5 of them warm-up."""
    from sweep.parsers import parser_settings, scan_file

    settings = parser_settings({"type": "nanogpt"})
    found = scan_file(REAL_LOGS["nanogpt_cpu.log"], settings.make_parser())
    assert [m.step for m in found] == list(range(21)) and {m.unit for m in found} == {"ms/step"}
    s = settings.summarize(found, global_batch_size=64)
    assert (s.warmup, s.measured, s.unit) == (5, 16, "samples/s")
    assert s.low < s.value < s.high and s.interval_note == ""


def test_readme_preset_table_lists_every_preset_and_its_flags() -> None:
    from sweep.parsers import PRESETS

    text = section("Sweeping any training framework")
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if line.startswith("| `")}
    assert set(rows) == set(PRESETS)
    for name, preset in PRESETS.items():
        for flag in (preset.micro_batch_flag, preset.accum_flag, preset.global_batch_flag):
            if flag:
                assert flag in rows[name], (name, flag)
        assert preset.unit in rows[name]


@pytest.mark.parametrize(
    "log,probe,verdict",
    [
        ((128.8, 113.2, 166.8), (126.0, 115.2, 166.8), "agree (2.2% apart"),
        # A loaded host: 5.5% apart, each median inside the other's interval (a run of the TORCH_TRAINER test).
        ((128.8, 113.2, 166.8), (136.3, 115.2, 166.8), "too noisy to tell (5.5% apart"),
        # A bar that counts twice, on the same noisy steps: beyond both intervals.
        ((257.6, 226.4, 333.6), (136.3, 115.2, 166.8), "DISAGREE (89.0% apart"),
        # A quiet host: 7.2% apart with tight intervals (the HF bar's smoothing, docs/trainers.md).
        ((174.3, 172.0, 176.1), (187.9, 186.5, 189.0), "DISAGREE (7.2% apart"),
        # The log's interval unknown (one figure): a gap over 5% is not excused as noise.
        ((174.3, None, None), (187.9, 150.0, 200.0), "DISAGREE (7.2% apart"),
    ],
)
def test_log_and_probe_disagree_only_beyond_the_noise(log, probe, verdict):
    value, low, high = log
    summary = ThroughputSummary(value, low, high, "samples/s", measured=20, warmup=1, after_warmup=True, note="")
    assert agreement(summary, probe).startswith(verdict)
