"""The printed `flags:` line names only batch flags the user can paste (issue 50): argv tokens that carry a placeholder
but set no batch (`--run-name=a{accum}`, `$(( {accum} * 1 ))` in a shell line) are not flags, a batch set through
workload.env is written as the variables to set, and where none can be derived the line says so, in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sweep.core.ranking import SweepMeta
from sweep.core.recommendation import recommendation
from sweep.core.schema import TrialResult
from sweep.parsers.presets import NO_FLAGS_TEMPLATE, flags_template


def flags_line(argv: list[str], env: dict[str, str] | None = None, parser: str = "regex") -> str:
    meta = SweepMeta("s", "local", "command", 64, 1, parser=parser, flags_template=flags_template(parser, argv, env))
    best = TrialResult(accum=4, split=1, per_device_batch=16, joint_batch=16, global_batch_size=64, num_devices=1, status="ok",
                       throughput=100.0, throughput_low=99.0, throughput_high=101.0, steps_measured=5)
    rec = recommendation(meta, {best.key: best}, 80)
    assert rec is not None
    return str(rec.flags)


@pytest.mark.parametrize("argv, line", [
    # a name that carries the pair is not a flag; the batch flag beside it is
    (["python", "t.py", "--run-name=a{accum}", "--bs={per_device_batch}"], "--bs=16"),
    (["python", "t.py", "--output_dir=runs/{accum}", "--ga", "{accum}"], "--ga 4"),
    (["python", "t.py", "--exp-name", "{accum}", "--bs", "{per_device_batch}"], "--bs 16"),
    # shell arithmetic computes a value: its words are no flags; the shell line's real flag still is
    (["bash", "-c", "python t.py --ga=$(( {accum} * 1 )) --bs={per_device_batch}"], "--bs=16"),
    (["python", "t.py", "--ga=$(({accum}*1))", "--micro={per_device_batch}"], "--micro=16"),
])
def test_tokens_that_set_no_batch_are_not_flags(argv: list[str], line: str) -> None:
    assert flags_line(argv) == line


def test_where_no_flag_can_be_derived_the_line_says_so_in_one_line() -> None:
    for argv in (["python", "t.py", "--run-name=a{accum}"], ["bash", "-c", "python t.py --ga=$(( {accum} * 1 ))"]):
        line = flags_line(argv)
        assert line.startswith("none to paste:") and "\n" not in line and "per_device_batch=16 accum=4" in line, line
        assert "{accum}" not in line and "a4" not in line and "$((" not in line
    assert flags_template("regex", ["python", "t.py"]) == NO_FLAGS_TEMPLATE


def test_a_batch_set_through_workload_env_is_written_as_the_variables_to_set() -> None:
    env = {"MICRO_BS": "{per_device_batch}", "GRAD_ACC": "{accum}", "RUN": "a{accum}", "PORT": "{master_port}"}
    assert flags_line(["python", "t.py"], env) == "MICRO_BS=16 GRAD_ACC=4"
    # argv flags win where there are any: they are what the script takes
    assert flags_line(["python", "t.py", "--bs={per_device_batch}"], env) == "--bs=16"


def test_a_sweep_reads_the_env_for_its_flags(tmp_path: Path) -> None:
    """Through the settings (orchestration/settings.log_reading), as a sweep's recommendation is written."""
    from support.sbatch_golden import compose_plan

    argv = json.dumps([sys.executable, "train.py", "--run-name=a{accum}"])
    plan = compose_plan(["workload=command", f"workload.argv={argv}", "+workload.env.GA='{accum}'",
                         "+workload.env.BS='{per_device_batch}'", "dry_run=true"], str(tmp_path / "s"))
    assert plan.meta.flags_template == "GA={accum} BS={per_device_batch}"
