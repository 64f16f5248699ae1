"""Bad input, table-driven: every case ends with one line on stderr that names the bad value and
what would be valid, exit status 2, no traceback, and nothing written (no sweep dir, no outputs/).

The cases run as `python -m sweep` processes (tests/support/sweep_run.py: forked from one that has imported sweep),
all at once in a module fixture (a few per core), each in an empty working directory of its own; each test
then checks its case. The tests that need a fresh interpreter (SWEEP_DEBUG's traceback, --help) start one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.bad_input import BROKEN_FILES, CASES, cmd, run_all, run_case


@pytest.fixture(scope="module")
def searchpath(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("searchpath")
    (root / "sweep").mkdir()
    for name, text in BROKEN_FILES.items():
        (root / "sweep" / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, searchpath):
    """Every case run once, a few at a time: {case id: (process, its working dir)}."""
    dirs = {case: tmp_path_factory.mktemp(f"bad_{case}") for case, _, _ in CASES}
    return run_all(CASES, dirs, searchpath)


def test_case_names_are_unique():
    # Each name is a test id and a directory: a duplicate would silently share one.
    assert len({case for case, _, _ in CASES}) == len(CASES)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("case, args, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line_and_writes_nothing(outcomes, case, args, expected):
    proc, cwd = outcomes[case]
    where = f"args={args}\nstdout={proc.stdout!r}\nstderr={proc.stderr!r}"
    assert proc.returncode == 2, where
    assert "Traceback" not in proc.stderr + proc.stdout, where
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), where
    assert lines[0].startswith("sweep: error: "), where
    for text in expected:
        assert text in lines[0], f"{text!r} missing; {where}"
    assert proc.stdout == "", where
    # Nothing written: no sweep dir, no outputs/ or .hydra/ in the working directory.
    assert sorted(p.name for p in cwd.iterdir()) == [], where


@pytest.mark.e2e
def test_sweep_debug_shows_the_traceback(tmp_path, searchpath):
    proc = run_case(cmd("global_batch_size=0"), tmp_path, searchpath, {"SWEEP_DEBUG": "1"})
    assert proc.returncode != 0
    assert "Traceback (most recent call last)" in proc.stderr
    assert "SweepError: global_batch_size=0 is not valid" in proc.stderr
    assert not (tmp_path / "sweep_dir").exists()


# -- bugs are not bad input ------------------------------------------------------------------------


def run_main_in_process(args: list[str], monkeypatch) -> int:
    from sweep.cli.main import main

    monkeypatch.setattr(sys, "argv", ["sweep", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("SWEEP_DEBUG", raising=False)
    return main()


def test_a_bug_shows_its_traceback_and_where_to_report_it(tmp_path, monkeypatch, capsys):
    from sweep.cli.main import BUG_LINE
    from sweep.orchestration import entry

    def broken(plan):
        return {}["no such key"]  # a bug in sweep, not in anything the user gave

    monkeypatch.setattr(entry, "dry_run_text", broken)
    code = run_main_in_process(["dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last)" in err and "KeyError: 'no such key'" in err and "in broken" in err
    assert err.splitlines()[-1] == BUG_LINE
    assert "sweep: error:" not in err


def test_bad_input_in_process_is_still_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    code = run_main_in_process(["global_batch_size=0", f"hydra.sweep.dir={tmp_path / 's'}"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [err.strip()] and err.startswith("sweep: error: global_batch_size=0 is not valid")


def _fixable_cases():
    import yaml
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from sweep.errors import SweepError

    fixable = [SweepError("x"), ConfigCompositionException("x"), MissingConfigException("x", "y"), OverrideParseException("a", "x"),
               ValidationError("x"), ConfigKeyError("x"), ConfigAttributeError("x"), yaml.YAMLError("x")]
    bugs = [KeyError("x"), TypeError("x"), AttributeError("x"), ValueError("x"), ZeroDivisionError(), OSError(5, "x")]
    return [(e, True) for e in fixable] + [(e, False) for e in bugs]


@pytest.mark.parametrize("exc, fixable", _fixable_cases(), ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_only_errors_in_the_input_count_as_the_users_to_fix(exc, fixable):
    from sweep.cli.main import user_fixable

    assert user_fixable(exc) is fixable


def test_memory_gib_above_the_card_warns_in_one_line_and_uses_the_card(tmp_path, monkeypatch, capsys):
    """Not an error: torch is made to report one 16 GiB card; the profile asks for 80 GiB."""
    from types import SimpleNamespace

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=16 * 1024**3, name="Fake16"))
    script = tmp_path / "train.py"
    script.write_text(
        "for e in (1, 2, 3):\n"
        "    print(f'DLL 2024-01-02 10:11:1{e}.123456 - epoch {e:4d} | train_avg_throughput-audio-samples-per-sec : 100.00 | train_avg_took : 0.16', flush=True)\n"
    )
    code = run_main_in_process(
        ["workload=command", f"workload.argv=[{sys.executable},{script},'--a={{accum}}']", "machine.device=cuda", "machine.memory_gib=80",
         "global_batch_size=8", "accum=1", "split=1", "search=grid", "trial.time_limit_s=60", f"hydra.sweep.dir={tmp_path / 's'}"],
        monkeypatch,
    )
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("sweep: warning:")]
    assert warnings == [
        "sweep: warning: machine.memory_gib=80 is above this card's 16.0 GiB: trials use the card's 16.0 GiB "
        "(set machine.memory_gib<=16.0 to emulate a smaller card)"
    ], err


@pytest.mark.e2e
def test_a_dry_run_says_the_training_command_is_missing_here(tmp_path, searchpath):
    """Issue 29: what the command needs (its executable, script, cwd) is checked before anything launches, in one
    line. Issue 46: a dry run launches nothing, so it shows a shipped preset's plan from anywhere (a fresh clone, a
    wheel install) and says, in that one line, what a run from here would stop on; a run refuses: exit 2."""
    proc = run_case(["+sweep=nemo_micro_batch", "dry_run=true"], tmp_path, searchpath, env_extra={"PATH": os.path.dirname(sys.executable)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.startswith("sweep: warning: workload.argv[0]='nemo' is not an executable on PATH") and proc.stderr.count("\n") == 1
    assert proc.stdout.startswith("dry run: ") and "nothing launched" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    real = run_case(["+sweep=nemo_micro_batch"], tmp_path, searchpath, env_extra={"PATH": os.path.dirname(sys.executable)})
    assert real.returncode == 2 and "'nemo' is not an executable on PATH" in real.stderr


@pytest.mark.e2e
def test_help_describes_the_tool_and_hides_the_schema_names(tmp_path, searchpath):
    proc = run_case(["--help"], tmp_path, searchpath)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "find the fastest (grad_accumulation_batches, batch_split_factor)" in text
    for option in ("global_batch_size=", "accum=1,2,4", "+machine=NAME", "workload=NAME", "resume=DIR", "dry_run=true"):
        assert option in text, option
    assert text.count("\n  python -m sweep ") == 3  # three examples
    assert "cpu2" in text and "staircase" in text and "nemo_micro_batch" in text
    assert "_schema" not in text
