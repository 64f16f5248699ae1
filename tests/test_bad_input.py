"""Bad input, table-driven: every case ends with one line on stderr that names the bad value and
what would be valid, exit status 2, no traceback, and nothing written (no sweep dir, no outputs/).

The cases run as `python -m sweep` processes (tests/sweep_run.py: forked from one that has imported sweep),
all at once in a module fixture (a few per core), each in an empty working directory of its own; each test
then checks its case. The tests that need a fresh interpreter (SWEEP_DEBUG's traceback, --help) start one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_input_support import FAULT, argv, case_env, cmd, full_args, run_all
from sweep_run import sweep_process

# A sweep config group of broken files, found through hydra.searchpath (never under conf/ or sweeps/).
BROKEN_FILES = {
    "unclosed_quote.yaml": 'workload:\n  argv: [python, "--x\n  bad: [1, 2\n',
    "unclosed_list.yaml": "# @package _global_\nglobal_batch_size: [64\n",
    "tab_indent.yaml": "# @package _global_\ntrial:\n\ttime_limit_s: 5\n",
    "wrong_type.yaml": "# @package _global_\ntrial:\n  time_limit_s: soon\n",
    "unknown_key.yaml": "# @package _global_\ntrial:\n  timelimit: 5\n",
    # issue 30: a newline in a launcher string was written into the sbatch script as a shell line
    "launcher_newline.yaml": '# @package _global_\nhydra:\n  launcher:\n    partition: "gpu\\ntouch /tmp/x #"\n',
    "launcher_key_newline.yaml": (
        '# @package _global_\nhydra:\n  launcher:\n    additional_parameters:\n      "mail\\nrm": x\n'
    ),
    "bad_regex.yaml": (
        "# @package _global_\ndefaults:\n  - override /workload: command\n"
        'workload:\n  argv: [python, "--b={accum}"]\n  parser:\n    type: regex\n    pattern: "("\n'
    ),
}


def broken(name: str) -> list[str]:
    return ["hydra.searchpath=[file://{SEARCHPATH}]", f"+sweep={name}"]


# (case id, arguments, what stderr must contain: the bad value and the hint of what is valid)
CASES: list[tuple[str, list[str], list[str]]] = [
    # -- malformed YAML and overrides
    ("yaml_unclosed_quote", broken("unclosed_quote"), ["unclosed_quote.yaml, line 4", "malformed YAML", "from line 2", "fix that file"]),
    ("yaml_unclosed_list", broken("unclosed_list"), ["unclosed_list.yaml, line", "malformed YAML", "expected ',' or ']'"]),
    ("yaml_tab_indent", broken("tab_indent"), ["tab_indent.yaml, line 3", "malformed YAML", "tab"]),
    ("yaml_wrong_type", broken("wrong_type"), ["sweep/wrong_type", "trial.time_limit_s", "'soon'", "Float"]),
    ("yaml_unknown_key", broken("unknown_key"), ["timelimit", "valid keys under trial", "time_limit_s"]),
    ("yaml_bad_regex", broken("bad_regex"), ["'('", "does not compile"]),
    ("override_unparsable", cmd("accum=[1,2"), ["'accum=[1,2'", "a list is [a,b]"]),
    ("override_unquoted_braces", ["workload=command", "workload.argv=[python,--x={accum}]"], ["workload.argv=[python,--x={accum}]", "quote values"]),
    # -- unknown config group, option or key
    ("unknown_sweep_file", cmd("+sweep=nosuch"), ["sweep/nosuch", "builtin_command", "rnnt_base"]),
    ("unknown_machine", cmd("+machine=nosuch"), ["machine/nosuch", "a100x8", "cpu2", "local"]),
    ("unknown_search", cmd("search=nosuch"), ["search/nosuch", "grid", "powers", "staircase"]),
    ("unknown_workload", ["workload=nosuch"], ["workload/nosuch", "command", "rnnt"]),
    ("unknown_launcher", cmd("hydra/launcher=nosuch"), ["hydra/launcher/nosuch", "submitit_local", "submitit_slurm"]),
    ("unknown_group_added", cmd("+nosuchgroup=x"), ["nosuchgroup", "valid keys: global_batch_size"]),
    ("unknown_key", cmd("nosuch_key=1"), ["nosuch_key", "valid keys: global_batch_size"]),
    ("unknown_trial_key", cmd("trial.time_limit=60"), ["trial.time_limit", "valid keys under trial", "time_limit_s"]),
    ("unknown_trial_key_added", cmd("+trial.time_limit=60"), ["trial.time_limit", "valid keys under trial", "time_limit_s"]),
    ("unknown_machine_key", cmd("machine.gpus=8"), ["machine.gpus", "valid keys under machine", "num_devices"]),
    ("unknown_workload_key", cmd("workload.args=[x]"), ["workload.args", "valid keys under workload", "argv"]),
    ("env_without_plus", cmd("workload.env.X=1"), ["workload.env.X", "+workload.env.X="]),
    # -- wrong types
    ("gbs_text", cmd("global_batch_size=abc"), ["'abc'", "Integer"]),
    ("gbs_fraction", cmd("global_batch_size=6.5"), ["'6.5'", "Integer"]),
    ("time_limit_text", cmd("trial.time_limit_s=abc"), ["trial.time_limit_s", "'abc'", "Float"]),
    ("max_in_flight_text", cmd("max_in_flight=x"), ["max_in_flight", "'x'", "Integer"]),
    ("live_not_bool", cmd("live=maybe"), ["live", "'maybe'", "bool"]),
    ("num_devices_text", cmd("machine.num_devices=two"), ["machine.num_devices", "'two'", "Integer"]),
    # -- batch sizes
    ("gbs_zero", cmd("global_batch_size=0"), ["global_batch_size=0", "positive integer"]),
    ("gbs_negative", cmd("global_batch_size=-64"), ["global_batch_size=-64", "positive integer"]),
    ("accum_zero", cmd("accum=0"), ["accum=0", "positive integer"]),
    ("accum_negative", cmd("accum=-2"), ["accum=-2", "positive integer"]),
    ("accum_fraction", cmd("accum=1.5"), ["accum=1.5", "positive integer"]),
    ("accum_text", cmd("accum=x"), ["accum='x'", "positive integer"]),
    ("accum_one_bad_of_many", cmd("accum=1,2,0"), ["accum=0", "positive integer"]),
    ("split_zero", cmd("split=0"), ["split=0", "positive integer"]),
    ("split_negative", cmd("split=-1"), ["split=-1", "positive integer"]),
    ("split_fraction", cmd("split=2.5"), ["split=2.5", "positive integer"]),
    ("gbs_not_divisible_by_devices", cmd("machine.num_devices=3"), ["global_batch_size=64", "num_devices=3", "multiple of 3"]),
    ("gbs_not_divisible_cpu2", cmd("+machine=cpu2", "global_batch_size=63"), ["global_batch_size=63", "num_devices=2", "multiple of 2"]),
    ("swept_fixed_knob", cmd("global_batch_size=32,64"), ["global_batch_size=32,64", "only accum and split can be swept"]),
    ("split_without_splits", cmd("workload.splits_apply=false", "split=2"), ["split", "splits_apply=false", "drop split="]),
    # -- empty candidate space
    ("empty_accum_list", cmd("accum=[]"), ["accum= is empty", "accum=1,2,4"]),
    ("no_valid_pair_indivisible", cmd("accum=3", "split=1"), ["accum=3", "no valid (accum, split) pair", "divisors of 64"]),
    ("no_valid_pair_too_big", cmd("accum=128"), ["accum=128", "no valid (accum, split) pair", "divisors of 64"]),
    # -- machine
    ("unknown_device", cmd("machine.device=tpu"), ["machine.device='tpu'", "cpu, cuda"]),
    ("zero_devices", cmd("machine.num_devices=0"), ["machine.num_devices=0", "positive integer"]),
    ("devices_not_split_over_nodes", cmd("machine.nodes=3", "machine.num_devices=4"), ["machine.num_devices=4", "machine.nodes=3"]),
    ("negative_memory", cmd("machine.memory_gib=-1"), ["machine.memory_gib=-1", "positive number of GiB"]),
    # More devices than any single host has: the same one line with or without GPUs here.
    ("gpu_profile_needs_more_devices", cmd("+machine=a100x8", "machine.num_devices=64"), ["machine=a100x8 needs 64 CUDA device(s) but this host has", "hydra/launcher=submitit_slurm"]),
    # -- trial and search knobs
    ("measure_steps_zero", cmd("trial.measure_steps=0"), ["trial.measure_steps=0", "positive integer"]),
    ("warmup_negative", cmd("trial.warmup_steps=-1"), ["trial.warmup_steps=-1", "integer >= 0"]),
    ("target_precision_zero", cmd("trial.target_precision=0"), ["trial.target_precision=0", "(0, 0.5)"]),
    ("target_precision_half", cmd("trial.target_precision=0.5"), ["trial.target_precision=0.5", "(0, 0.5)"]),
    ("max_measure_below_min", cmd("trial.measure_steps=8", "trial.max_measure_steps=4"), ["trial.max_measure_steps=4", "at least trial.measure_steps=8"]),
    ("time_limit_zero", cmd("trial.time_limit_s=0"), ["trial.time_limit_s=0", "positive number of seconds"]),
    ("memory_margin_negative", cmd("trial.memory_margin=-0.1"), ["trial.memory_margin=-0.1", "[0, 0.5)"]),
    ("memory_margin_half", cmd("trial.memory_margin=0.5"), ["trial.memory_margin=0.5", "[0, 0.5)"]),
    ("memory_margin_text", cmd("trial.memory_margin=lots"), ["trial.memory_margin", "'lots'", "Float"]),
    ("run_to_run_noise_half", cmd("machine.run_to_run_noise=0.5"), ["machine.run_to_run_noise=0.5", "[0, 0.5)"]),
    ("run_to_run_noise_negative", cmd("machine.run_to_run_noise=-0.01"), ["machine.run_to_run_noise=-0.01", "[0, 0.5)"]),
    ("run_to_run_noise_text", cmd("machine.run_to_run_noise=high"), ["machine.run_to_run_noise", "'high'"]),
    ("max_trials_zero", cmd("search.max_trials=0"), ["search.max_trials=0", "positive integer"]),
    ("max_in_flight_zero", cmd("max_in_flight=0"), ["max_in_flight=0", "positive integer"]),
    # A stress step no trial reaches: no pair could ever stop ahead (the built-in workload's key).
    ("stress_step_past_every_trial", ["workload.stress_step=100000", "global_batch_size=64"],
     ["workload.stress_step=100000", "expected a step in [0, 33]", "trial.max_measure_steps=32"]),
    # The command workload's parser replaced as a mapping: the hint names the command workload's way, not the RNN-T's keys.
    ("command_parser_as_a_mapping", cmd("workload.parser={type: regex, pattern: 'x(?P<throughput>[0-9]+)'}"),
     ["workload.parser.pattern", "+workload.parser.pattern=..."]),
    ("command_unknown_key", cmd("workload.bogus=1"), ["workload.bogus", "valid keys under workload: name, argv, env, cwd, parser"]),
    # -- the command workload: parser, template, executable
    ("unknown_parser", cmd("workload.parser.type=csv"), ["parser.type='csv'", "jsonl, myrtle, regex"]),
    ("parser_missing_pattern", cmd("workload.parser.type=regex"), ["parser.type='regex'", "needs pattern"]),
    ("parser_tokens_per_sample_zero", cmd("workload.parser.type=nanogpt", "+workload.parser.tokens_per_sample=0"),
     ["parser.tokens_per_sample=0", "positive number"]),
    ("parser_skip_first_negative", cmd("workload.parser.type=timm", "+workload.parser.skip_first=-1"),
     ["parser.skip_first=-1", "whole number >= 0"]),
    ("parser_throughput_unit", cmd("workload.parser.type=torchtitan", "+workload.parser.throughput_unit=it/s"),
     ["parser.throughput_unit='it/s'", "samples/s, tokens/s"]),
    ("unknown_placeholder", cmd(command=argv("python", "--x={nope}")), ["{nope}", "valid placeholders are {accum}"]),
    ("placeholder_format_spec", cmd(command=argv("python", "--x={accum:>5}")), ["{accum:>5}", "valid placeholders are"]),
    ("placeholder_conversion", cmd(command=argv("python", "--x={accum!r}")), ["{accum!r}", "valid placeholders are"]),
    ("missing_executable", cmd(command=argv("no-such-trainer-xyz", "--b={accum}")), ["'no-such-trainer-xyz'", "not an executable on PATH", "full path"]),
    ("missing_executable_path", cmd(command=argv("/nonexistent/bin/train", "--b={accum}")), ["'/nonexistent/bin/train'", "not an executable"]),
    # issue 29: a command that would run the same in every pair; a script or cwd that is not there
    ("no_batch_placeholder", cmd(command=argv(sys.executable, str(FAULT), "--steps=3")), ["use none of {accum}, {split}", "--batch_size={per_device_batch}"]),
    ("missing_script", cmd(command=argv("python", "no_such_train.py", "--b={accum}")), ["'no_such_train.py'", "not a file in", "workload.cwd"]),
    ("missing_cwd", cmd("workload.cwd=/no/such/dir"), ["workload.cwd='/no/such/dir' is not a directory"]),
    ("empty_command", cmd(command="workload.argv=[]"), ["workload.argv is empty", "e.g. [python, train.py"]),
    # -- issue 13: never silently wrong
    ("sweep_value_then_plain_value", cmd("accum=1,2", "accum=4"), ["accum is given twice", "'accum=1,2' and 'accum=4'", "give it once"]),
    ("plain_value_then_sweep_value", cmd("split=1", "split=1,2"), ["split is given twice", "give it once"]),
    ("search_is_a_schema", cmd("search=search_schema"), ["search=search_schema is not a valid search", "grid, powers, staircase"]),
    ("machine_is_a_schema", cmd("+machine=machine_schema"), ["machine=machine_schema is not a valid machine", "cpu2"]),
    ("workload_is_a_schema", ["workload=rnnt_schema"], ["workload=rnnt_schema is not a valid workload", "command, rnnt"]),
    # -- the built-in workload's values its types let through (every trial would fail with them)
    ("rnnt_unknown_precision", ["workload.precision=fp8"], ["workload.precision='fp8'", "fp32, auto, fp16, bf16"]),
    ("rnnt_unknown_lengths", ["workload.lengths=uniform"], ["workload.lengths='uniform'", "fixed, lognormal"]),
    ("rnnt_durations_reversed", ["workload.lengths=lognormal", "workload.min_duration_s=5", "workload.max_duration_s=1"],
     ["min_duration_s (5.0) < max_duration_s (1.0)"]),
    ("parser_skip_first_negative_default_parser", cmd("+workload.parser.skip_first=-1"), ["parser.skip_first=-1", "whole number >= 0"]),
    ("parser_skip_first_text", cmd("+workload.parser.skip_first=two"), ["parser.skip_first='two'", "whole number >= 0"]),
    ("parser_stop_after_zero", cmd("+workload.parser.stop_after=0"), ["parser.stop_after=0", "whole number >= 1"]),
    ("parser_regex_backtracks", cmd("workload.parser.type=regex", "+workload.parser.pattern='(?P<throughput>(\\d+\\s?)+)x'"),
     ["parser.pattern", "catastrophic backtracking", "nested repeats"]),
    ("empty_sweep_dir", cmd("hydra.sweep.dir="), ["hydra.sweep.dir is empty", "hydra.sweep.dir=outputs/my_sweep"]),
    # -- issue 30: figures no trial could use, and launcher strings that would write shell lines
    ("time_limit_inf", cmd("trial.time_limit_s=inf"), ["trial.time_limit_s=inf", "finite positive number of seconds"]),
    ("time_limit_nan", cmd("trial.time_limit_s=nan"), ["trial.time_limit_s=nan", "finite positive number of seconds"]),
    ("parser_tokens_per_sample_inf", cmd("workload.parser.type=nanogpt", "+workload.parser.tokens_per_sample=inf"),
     ["parser.tokens_per_sample=inf", "positive number (tokens in one sample), not inf or nan"]),
    ("launcher_newline", [*cmd("hydra/launcher=submitit_slurm"), *broken("launcher_newline")],
     ["hydra.launcher.partition='gpu\\ntouch /tmp/x #'", "control character '\\n'", "without newlines"]),
    ("launcher_key_newline", [*cmd("hydra/launcher=submitit_slurm"), *broken("launcher_key_newline")],
     ["hydra.launcher.additional_parameters key='mail\\nrm'", "control character"]),
    # -- resume
    ("resume_not_a_sweep", ["resume=/nonexistent/sweep"], ["resume=/nonexistent/sweep", "not a sweep dir", "outputs/latest"]),
]


def run_case(args: list[str], cwd: Path, searchpath: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A fresh `python -m sweep` interpreter."""
    return sweep_process(full_args(args, cwd, searchpath), cwd, case_env(env_extra), timeout=120, fresh=True)


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
