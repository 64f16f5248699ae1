"""The GPU-cost bench's landscapes and simulator (tests/support/landscapes_h100.py, tests/support/landscapes_gpu.py,
bench/bench_gpu.py): the recordings replay as recorded, today's policy costs what the card cost,
and the bench prints its final line."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support import landscapes_gpu as sim
from support.landscapes_h100 import DATA, RECORDINGS, load

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", RECORDINGS)
def test_recorded_pairs_replay_as_recorded_and_the_rest_are_filled(name: str) -> None:
    land = load(name)
    trials = json.loads((DATA / f"{name}.json").read_text())["trials"]
    for t in trials:
        c = land.pairs[f"accum{t['accum']}_split{t['split']}"]
        assert land.source(c) == "recorded" and land.outcome(c)[:2] == (t["status"], t["oom_phase"])
        if t["status"] == "ok":
            assert land.step_time_s(c) == pytest.approx(statistics.median(t["step_times_s"]))
            # The fitted model, which fills the other pairs, is within 25% of every recorded ok pair.
            fixed, micro, chunk = land.coefficients
            assert fixed + micro * c.accum + chunk * c.accum * c.split == pytest.approx(land.step_time_s(c), rel=0.25)
    assert len(land.valid()) == 35 and all(land.outcome(c)[0] in ("ok", "oom") for c in land.valid())


def test_todays_policy_costs_what_the_recorded_sweep_cost() -> None:
    """base80's default sweep ran 6 trials in 256 s of trial wall on the card; the replay of today's policy agrees within 15%."""
    land = load("base80")
    recorded = sum(t["wall_s"] for t in json.loads((DATA / "base80.json").read_text())["trials"])
    replayed = statistics.mean(sim.one_device(land, sim.OLD, seed).gpu_s for seed in range(5))
    assert replayed == pytest.approx(recorded, rel=0.15)
    assert sim.one_device(land, sim.OLD, 0).pick == "accum1_split8"  # the recorded recommendation


def test_a_late_oom_is_met_by_the_stress_step_when_a_possible_answer_waits_for_it() -> None:
    """large80's accum=1 split=8 ran out of memory at timed step 9. Measured to the decision without a
    stress step the sweep can take it for the answer; with the stress step at timed step 8 it still
    can, if a pair may stop for being ahead before it (the rule before core/decision.ahead_after_steps);
    waiting for the stress step, it cannot."""
    land = load("large80")
    policies = (sim.DECISION, sim.STRESS_EARLY, sim.STRESS, sim.WARM)
    picks = {policy.name: {sim.one_device(land, policy, s).pick for s in range(4)} for policy in policies}
    assert "accum1_split8" in picks[sim.DECISION.name] and "accum1_split8" in picks[sim.STRESS_EARLY.name]
    assert "accum1_split8" not in picks[sim.STRESS.name] and "accum1_split8" not in picks[sim.WARM.name]


@pytest.mark.slow
def test_the_bench_ends_with_its_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--seeds", "2", "--random", "2"],
                          capture_output=True, text=True, timeout=300)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-seconds to the answer: ") and "; 8-GPU wall: " in last and "; same answer: " in last, proc.stdout + proc.stderr
    assert proc.returncode in (0, 1)  # 1: a target missed, which the bench says


def test_the_simulated_warm_workers_do_what_the_code_does() -> None:
    """launch/warm_pool.py serves one-rank trials only: on one device a trial after the first starts in
    WARM_START_S; a trial of 8 ranks is a fresh process per rank and pays a recorded start-up every time."""
    import random

    from sweep.core.strategies import make_strategy

    land = load("base80")
    least = min(land.startups_s)
    for ranks in (1, 8):
        strategy = make_strategy("staircase", land.valid(), capacity_gib=land.capacity_gib)
        phase = sim.run_phase(land, strategy, sim.WARM, random.Random(0), slots=1, ranks=ranks, gbs=128 * ranks)
        oom_walls = [r.wall_s for r in phase.results.values() if r.status == "oom"]
        assert len(phase.results) > 2 and oom_walls
        if ranks == 1:  # base80's staircase meets its OOMs after its first trial: each costs a warm start and a step
            assert max(oom_walls) < least
        else:
            assert min(oom_walls) >= least


def test_on_the_8_gpu_host_a_late_oom_is_met_at_one_rank_and_never_confirmed() -> None:
    """Screening rows meet the workload's stress step before they stop ahead or tied (core/screening.py), so
    large80's accum=1 split=8, out of memory at timed step 9, runs out of memory in screening, where it costs one
    rank's warm worker, and is never confirmed by a fresh 8-rank trial nor recommended."""
    land = load("large80")
    for seed in range(4):
        out = sim.eight_gpu_host(land, sim.NEW, seed)
        assert out.screening["accum1_split8"].status == "oom" and out.pick not in (None, "accum1_split8")


def test_the_first_pair_stops_provisionally_and_is_run_again_only_when_it_may_be_the_answer() -> None:
    """base24's first fitting pair, accum=32 split=1, is the slowest that fits: one timed step, and never run again
    because a pair measured in full outranks it by the throughput ordering (issue 43: its one step alone rules out
    nothing). On split1_best the first fitting pair is the answer: it runs again in full, and the answer rests on that run."""
    from support.landscapes import LANDSCAPES

    from sweep.core.confidence import outranked_by_measured
    from sweep.core.decision import is_provisional

    phase = sim.one_device_phase(load("base24"), sim.WARM, 0)
    first = phase.results["accum32_split1"]
    assert is_provisional(first) and len(first.step_times_s) == 1 and not phase.provisional
    assert outranked_by_measured(first, phase.results)
    best = sim.Simulated(LANDSCAPES["split1_best"])
    phase = sim.one_device_phase(best, sim.WARM, 0)
    pick = sim.pick_of(phase.results)
    assert [r.key for r in phase.provisional if is_provisional(r)] == [pick]
    # Issue 50: so is a neighbour of the answer the ordering cut short on a step before it was the answer's neighbour.
    again = [r for r in phase.provisional if not is_provisional(r)]
    assert all(r.stopped_early.startswith("outranked by") and len(r.step_times_s) < 2 for r in again)
    assert all(len(phase.results[r.key].step_times_s) >= 2 for r in again)
    assert not is_provisional(phase.results[pick])
    assert sim.same_answer(sim.pick_of(phase.results), sim.grid_answer(best, 0))


def test_a_pair_its_own_steps_cannot_separate_stops_past_the_stress_step() -> None:
    """base24's answer, accum=1 split=32, lies next to accum=2 split=16's 8-step interval: on median figures it ran to the
    32-step cap before core/decision.py's rule 5. On wall-time figures (issue 50) the intervals are t-intervals, and the
    decision's rules (precision, a tie, rule 5; tests/test_decision.py drives rule 5 itself) stop it past its stress step
    in most runs; where its interval still straddles the rival's by more than the noise it runs on, which is right. The
    answer is the same in every run."""
    land = load("base24")
    runs = [sim.one_device_phase(land, sim.WARM, seed) for seed in range(4)]
    steps = [len(r.results["accum1_split32"].step_times_s) for r in runs]
    assert all(n >= 8 for n in steps) and sum(n < 32 for n in steps) >= 3, steps
    assert all(sim.pick_of(r.results) == "accum1_split32" for r in runs)
