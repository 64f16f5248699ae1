"""No budget the user did not ask for (issue 50): the built-in demo's emulated 16.7 MiB (machine.memory_gib unset on a
CPU) is the demo's alone. A command sweep on a CPU host inherited it as the memory model's capacity and printed
`predicted OOM: 0.296 GiB > 0.0163 GiB` for pairs that fit (a Python process with torch imported is 0.3 GiB), and its
dry run printed the same budget."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
from support.sweep_run import run_sweep

from sweep.core.config import DEMO_MEMORY_GIB, resolved_memory_gib

ATTACK = Path(__file__).with_name("attack_train.py")
ARGV = (f'workload.argv=["{sys.executable}","{ATTACK}","--batch={{per_device_batch}}","--accum={{accum}}",'
        f'"--global-batch={{global_batch_size}}","--steps=14"]')


def test_the_demos_budget_is_the_built_in_workloads_alone():
    assert resolved_memory_gib(None, "cpu", builtin_demo=True) == DEMO_MEMORY_GIB
    assert resolved_memory_gib(None, "cpu", builtin_demo=False) is None  # a command on a CPU host: no budget
    assert resolved_memory_gib(None, "cuda", builtin_demo=True) is None  # a card's own memory, never 16.7 MiB
    assert resolved_memory_gib(2.0, "cpu", builtin_demo=False) == 2.0  # asked for: kept


@pytest.mark.e2e
def test_a_command_dry_run_prints_no_budget_and_the_demos_prints_its_own(tmp_path: Path):
    command = run_sweep(["workload=command", ARGV, "dry_run=true"], cwd=tmp_path, timeout=120)
    assert command.returncode == 0, command.stderr
    head = command.stdout.splitlines()[0]
    assert "0.0163" not in command.stdout and "no memory budget" in head, head
    asked = run_sweep(["workload=command", ARGV, "dry_run=true", "machine.memory_gib=2"], cwd=tmp_path, timeout=120)
    assert "(1 x cpu, 2.0 GiB each)" in asked.stdout.splitlines()[0], asked.stdout
    demo = run_sweep(["dry_run=true"], cwd=tmp_path, timeout=120)
    assert demo.returncode == 0 and "(1 x cpu, 0.0163 GiB each)" in demo.stdout.splitlines()[0], demo.stdout


def test_a_command_plans_no_budget_so_the_memory_model_predicts_no_oom_for_pairs_that_fit(tmp_path: Path):
    """The issue's case: the pairs a command sweep measured peaked at 0.296 GiB (a process with torch imported); with
    the demo's 0.0163 GiB as the capacity the model skipped the larger micro-batches as `predicted OOM: 0.296 GiB >
    0.0163 GiB`. The plan's capacity (what the orchestrator hands the strategy and its predictions) is now none."""
    from support.sbatch_golden import compose_plan

    from sweep.core.implications import predicted_ooms
    from sweep.core.schema import TrialResult
    from sweep.core.space import enumerate_candidates

    plan = compose_plan(["workload=command", ARGV, "global_batch_size=64"], str(tmp_path / "s"))
    assert plan.machine.memory_gib is None
    assert compose_plan([], str(tmp_path / "d")).machine.memory_gib == DEMO_MEMORY_GIB  # the demo keeps its own
    measured = {}
    for accum in (8, 16, 32, 64):  # the small micro-batches first, as a staircase from below would
        pdb = 64 // accum
        result = TrialResult(accum=accum, split=1, per_device_batch=pdb, joint_batch=pdb, global_batch_size=64, num_devices=1,
                             status="ok", throughput=100.0, throughput_low=99.0, throughput_high=101.0, steps_measured=8,
                             peak_mem_gib=0.296, peak_reserved_gib=0.296)
        measured[result.key] = result
    candidates = enumerate_candidates(64, 1, None, [1])
    assert predicted_ooms(candidates, measured, DEMO_MEMORY_GIB)  # what the demo's budget made of them
    assert predicted_ooms(candidates, measured, plan.machine.memory_gib) == {}


@pytest.mark.slow
@pytest.mark.e2e
def test_a_command_sweep_on_a_cpu_host_predicts_no_oom_against_the_demos_budget(tmp_path: Path):
    sweep_dir = tmp_path / "s"
    proc = run_sweep(
        ["workload=command", ARGV, f"hydra.sweep.dir={sweep_dir}", "global_batch_size=64", "search=grid", "accum=1,2,4,8",
         "max_in_flight=1", "live=false", "trial.time_limit_s=120", "search.drift_check=false", "search.racing=false",
         "search.measure_to_decision=false", "trial.warmup_steps=2"],
        cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "predicted OOM" not in proc.stdout and "0.0163" not in proc.stdout, proc.stdout
    rows = list(csv.DictReader((sweep_dir / "trials.csv").open()))
    assert sorted(int(r["accum"]) for r in rows) == [1, 2, 4, 8]
    assert all(r["status"] == "ok" for r in rows), [(r["accum"], r["status"], r["reason"]) for r in rows]
