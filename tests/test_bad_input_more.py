"""Issue 50's bad inputs, in tests/test_bad_input.py's pattern: one line on stderr naming the key and the fix, exit 2, no
traceback, nothing written. machine.nodes=2 on the local launcher ended in submitit's traceback and "this is a bug in
sweep" (its dry run accepted it); machine.nodes=0 raised a ZeroDivisionError through the launcher's interpolation; a
+sweep= file without `# @package _global_` got a hint about `workload@sweep`. And +machine= after +sweep= (a command
preset) failed with `Key 'argv' not in 'RNNTWorkloadConfig'`: both orders now run alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.bad_input import case_env, cmd, run_all
from support.sweep_run import sweep_process

HEADERLESS = {
    # A user's preset as a plain YAML file: Hydra files its keys under `sweep.` and its override under workload@sweep.
    "no_header.yaml": 'defaults:\n  - override /workload: command\nglobal_batch_size: 64\nworkload:\n  argv: [python, "--b={accum}"]\n',
    "no_header_plain.yaml": "global_batch_size: 64\ntrial:\n  time_limit_s: 30\n",
}

CASES: list[tuple[str, list[str], list[str]]] = [
    ("nodes_on_local", cmd("machine.num_devices=2", "machine.nodes=2"),
     ["machine.nodes=2", "local launcher", "hydra/launcher=submitit_slurm", "machine.nodes=1"]),
    ("nodes_on_local_dry_run", cmd("machine.num_devices=2", "machine.nodes=2", "dry_run=true"),
     ["machine.nodes=2", "hydra/launcher=submitit_slurm"]),
    ("nodes_on_local_builtin", ["machine.num_devices=2", "machine.nodes=2"], ["machine.nodes=2", "hydra/launcher=submitit_slurm"]),
    ("nodes_zero", cmd("machine.nodes=0"), ["machine.nodes=0", "a positive integer"]),
    ("nodes_zero_builtin", ["machine.nodes=0", "dry_run=true"], ["machine.nodes=0", "a positive integer"]),
    ("nodes_zero_profile", ["+machine=a100x8", "machine.nodes=0", "dry_run=true"], ["machine.nodes=0", "a positive integer"]),
    # the machine is checked before the launcher is resolved, after its keys are: an added key is still named as one
    ("unknown_machine_key_added", cmd("+machine.gpus=8"), ["machine.gpus", "valid keys under machine", "num_devices"]),
    ("sweep_file_without_header", ["hydra.searchpath=[file://{SEARCHPATH}]", "+sweep=no_header"],
     ["sweep/no_header.yaml", "`# @package _global_`", "first line"]),
    ("sweep_file_without_header_plain", ["hydra.searchpath=[file://{SEARCHPATH}]", "+sweep=no_header_plain"],
     ["sweep/no_header_plain.yaml", "`# @package _global_`", "first line"]),
]


@pytest.fixture(scope="module")
def searchpath(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("searchpath_more")
    (root / "sweep").mkdir()
    for name, text in HEADERLESS.items():
        (root / "sweep" / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, searchpath):
    dirs = {case: tmp_path_factory.mktemp(f"bad_more_{case}") for case, _, _ in CASES}
    return run_all(CASES, dirs, searchpath)


@pytest.mark.e2e
@pytest.mark.parametrize("case, args, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line_and_writes_nothing(outcomes, case, args, expected):
    proc, cwd = outcomes[case]
    where = f"args={args}\nstdout={proc.stdout!r}\nstderr={proc.stderr!r}"
    assert proc.returncode == 2, where
    assert "Traceback" not in proc.stderr + proc.stdout and "ZeroDivisionError" not in proc.stderr, where
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep: error: "), where
    for text in expected:
        assert text in lines[0], f"{text!r} missing; {where}"
    assert "workload@sweep" not in lines[0], where
    assert proc.stdout == "" and sorted(p.name for p in cwd.iterdir()) == [], where


@pytest.mark.e2e
@pytest.mark.parametrize("preset", ["nanogpt", "lightning", "hf"])
def test_machine_and_sweep_in_either_order_run_alike(tmp_path: Path, preset: str):
    """`+sweep=X +machine=a100x8` is the documented `+machine=a100x8 +sweep=X`: the preset's workload and its global
    batch win over the profile's, in either order."""
    runs = []
    for order in (["+machine=a100x8", f"+sweep={preset}"], [f"+sweep={preset}", "+machine=a100x8"]):
        proc = sweep_process([*order, "dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}"], tmp_path, case_env(), timeout=120)
        assert proc.returncode == 0, (order, proc.stderr)
        runs.append(proc.stdout)
    assert runs[0] == runs[1]
    assert runs[0].startswith("dry run: a100x8 (8 x cuda, 80.0 GiB each)") and "node 0:" in runs[0], runs[0]
