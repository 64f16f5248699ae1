"""What the bad-input tests share (tests/test_bad_input.py, tests/test_bad_input_more.py): the fast fake command, the
environment and arguments each case runs with, and every case of a table run at once, a few per core."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.sweep_run import sweep_process

FAULT = Path(__file__).resolve().parents[1] / "fake_train.py"


def argv(*parts: str) -> str:
    """A workload.argv override: a quoted list, as the shell would pass it."""
    return "workload.argv=[" + ",".join(f'"{p}"' for p in parts) + "]"


FAKE = argv(sys.executable, str(FAULT), "--accum={accum}", "--split={split}", "--global_batch_size={global_batch_size}")


def cmd(*extra: str, command: str = FAKE) -> list[str]:
    """The fast fake command as the workload: a case that wrongly passes runs seconds, not minutes."""
    return ["workload=command", command, "global_batch_size=64", "search=grid", "trial.time_limit_s=20", *extra]


def case_env(env_extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SWEEP_DEBUG", "HYDRA_FULL_ERROR")}
    env.update(PYTHONUNBUFFERED="1", **(env_extra or {}))
    return env


def full_args(args: list[str], cwd: Path, searchpath: Path) -> list[str]:
    return [f"hydra.sweep.dir={cwd / 'sweep_dir'}", *(a.replace("{SEARCHPATH}", str(searchpath)) for a in args)]


def run_all(cases: list[tuple[str, list[str], list[str]]], dirs: dict[str, Path], searchpath: Path) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case run once, a few at a time: {case id: (process, its working dir)}."""

    def one(case_args: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess]:
        case, args = case_args
        return case, sweep_process(full_args(args, dirs[case], searchpath), dirs[case], case_env(), timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, 2 * (os.cpu_count() or 1))) as pool:
        done = dict(pool.map(one, [(case, args) for case, args, _ in cases]))
    return {case: (done[case], dirs[case]) for case in done}


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
