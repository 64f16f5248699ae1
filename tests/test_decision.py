"""Measure to the decision (core/decision.py): which running trials stop, and why, on known intervals;
and the orchestrator's side (orchestration/racing.py) writing stop.json for them."""

from __future__ import annotations

import json
from dataclasses import make_dataclass, replace

import pytest

from sweep.core.decision import (
    FIT_KNOWN_STEPS,
    PROVISIONAL_STEPS,
    Running,
    ahead_after_steps,
    decision_stop,
    decision_stops,
    is_provisional,
    provisional_contenders,
    tie_band,
    tied,
)
from sweep.core.measure import STOP_FILE, progress_record
from sweep.core.schema import Status, TrialResult, trial_dir
from sweep.core.space import enumerate_candidates
from sweep.core.stats import throughput_summary
from sweep.orchestration.racing import Racing, StopSteps, plan_ahead_steps
from sweep.records import write_progress

GBS = 64
PAIRS = {c.key: c for c in enumerate_candidates(GBS, 1, None, None) if c.valid}
STEADY = [0.010, 0.0101, 0.0099, 0.010, 0.0102, 0.0098, 0.010, 0.0100]  # ~6400 samples/s, +-2%


def ok(key: str, times: list[float], tight: bool = False) -> TrialResult:
    c = PAIRS[key]
    mid, low, high = throughput_summary(times, GBS)
    return TrialResult(
        **c.numbers(GBS, 1), status=Status.OK, step_times_s=times, throughput=mid, throughput_low=low, throughput_high=high, tight=tight
    )


def stop(
    key: str, times: list[float], results: dict, others: dict | None = None, ahead_steps: int = FIT_KNOWN_STEPS, provisional_steps: int = 0
) -> str | None:
    running = {key: Running(PAIRS[key], times), **{k: Running(PAIRS[k], t) for k, t in (others or {}).items()}}
    return decision_stop(key, running, results, GBS, first_pair_steps=8, ahead_steps=ahead_steps, provisional_steps=provisional_steps)


def test_an_outranked_pair_stops_after_one_step_when_its_step_agrees_with_the_ordering():
    # accum4_split2 (p=16, j=8) has no bigger micro-batch or joint chunk than accum2_split1 (p=32, j=32).
    results = {"accum2_split1": ok("accum2_split1", STEADY)}
    why = stop("accum4_split2", [0.02], results)
    assert why is not None and "outranked by accum2_split1" in why
    # Its first step contradicts the heuristic (faster than the pair said to outrank it): it runs on.
    assert stop("accum4_split2", [0.005], results) is None
    # No timed step yet: its fit is not known.
    assert stop("accum4_split2", [], results) is None
    # A tight pair outranks nothing: it is not what the sweep recommends.
    assert stop("accum4_split2", [0.02], {"accum2_split1": ok("accum2_split1", STEADY, tight=True)}) is None


def test_a_pair_below_the_leader_stops_as_racing_would_and_one_inside_its_interval_runs_on():
    results = {"accum1_split2": ok("accum1_split2", STEADY)}
    slow = [0.1, 0.12, 0.08, 0.1, 0.12, 0.08]
    why = stop("accum2_split1", slow, results)  # p smaller, j bigger: the ordering cannot decide
    assert why is not None and "cannot beat the leader accum1_split2" in why
    assert stop("accum2_split1", slow[:5], results) is None  # five steps: no 95% interval yet
    # Inside the leader's interval racing cannot stop it (before its stress step nothing else may either).
    assert stop("accum2_split1", [t * 1.01 for t in STEADY], results, ahead_steps=9) is None


def test_a_pair_above_every_rival_stops_once_separated():
    results = {"accum1_split2": ok("accum1_split2", [t * 3 for t in STEADY]), "accum4_split1": ok("accum4_split1", [t * 5 for t in STEADY])}
    why = stop("accum2_split1", STEADY[:6], results)
    assert why is not None and "ahead of every measured pair" in why and "runner-up accum1_split2" in why
    # A running rival as fast as it keeps both measuring.
    assert stop("accum2_split1", STEADY[:6], results, {"accum8_split1": STEADY}) is None


def test_the_first_pair_stops_at_measure_steps_and_not_before():
    assert stop("accum2_split1", STEADY[:7], {}) is None
    assert "no other pair measured in full yet" in (stop("accum2_split1", STEADY, {}) or "")


def test_racing_with_candidates_writes_the_decision_to_stop_json_once(tmp_path):
    results = {"accum2_split1": ok("accum2_split1", STEADY)}
    write_progress(trial_dir(tmp_path, "accum4_split2"), progress_record([0.02]))
    write_progress(trial_dir(tmp_path, "accum1_split1"), progress_record([0.011]))  # p=64 > 32: may be faster
    racing = Racing(tmp_path, GBS, PAIRS)
    told = racing.stop_losers(["accum4_split2", "accum1_split1"], results)
    assert list(told) == ["accum4_split2"]
    record = json.loads((trial_dir(tmp_path, "accum4_split2") / STOP_FILE).read_text())
    assert "outranked by accum2_split1" in record["reason"]
    assert not (trial_dir(tmp_path, "accum1_split1") / STOP_FILE).exists()
    assert racing.stop_losers(["accum4_split2", "accum1_split1"], results) == {}  # told once
    # Without candidates, racing's rule alone: one step decides nothing.
    racing_only = Racing(tmp_path, GBS)
    racing_only.forget("accum4_split2")
    assert racing_only.stop_losers(["accum4_split2"], results) == {}


def test_decision_stops_covers_every_running_trial():
    results = {"accum2_split1": ok("accum2_split1", STEADY)}
    running = {k: Running(PAIRS[k], t) for k, t in {"accum4_split2": [0.02], "accum8_split1": [0.04] * 3}.items()}
    assert set(decision_stops(running, results, GBS, first_pair_steps=8)) == {"accum4_split2", "accum8_split1"}
    assert decision_stops(running, {k: replace(v, tight=True) for k, v in results.items()}, GBS, first_pair_steps=8) == {}


def test_a_screening_trial_outranked_before_its_first_step_is_not_needed():
    from sweep.core.decision import cancel_reason

    results = {"accum2_split1": ok("accum2_split1", STEADY)}
    assert "outranked by accum2_split1" in (cancel_reason(PAIRS["accum8_split1"], results) or "")
    assert cancel_reason(PAIRS["accum1_split1"], results) is None  # a bigger micro-batch may be faster
    assert cancel_reason(PAIRS["accum8_split1"], {"accum2_split1": ok("accum2_split1", STEADY, tight=True)}) is None


@pytest.mark.parametrize(
    ("stress_step", "warmup_steps", "expected"),
    [
        (9, 2, 8),  # the RNN-T default: step 9 is the 8th timed step, the last of the shortest trial
        (0, 2, FIT_KNOWN_STEPS),  # no stress step (command trials): the first timed step
        (1, 2, FIT_KNOWN_STEPS),  # a stress step inside the warm-up is met before timing starts
        (2, 2, 1),  # the first timed step
        (9, 0, 10),
        (40, 2, 39),  # past the cap: a possible answer is never stopped for being ahead
    ],
)
def test_a_pair_may_stop_ahead_only_past_its_stress_step(stress_step, warmup_steps, expected):
    assert ahead_after_steps(stress_step, warmup_steps) == expected


def test_the_plan_hands_in_the_workloads_stress_step_or_none():
    from sweep.workloads.command.config import CommandWorkloadConfig

    with_stress = make_dataclass("WithStress", [("stress_step", int, 9)])
    assert plan_ahead_steps(with_stress(), 2) == 8
    assert plan_ahead_steps(with_stress(stress_step=0), 2) == FIT_KNOWN_STEPS
    assert plan_ahead_steps(CommandWorkloadConfig(), 2) == FIT_KNOWN_STEPS  # no such field: none
    # The built-in RNN-T's config, with the rnnt branch's stress_step (default 9) or without it.
    from sweep.workloads.rnnt.config import RNNTWorkloadConfig

    rnnt = RNNTWorkloadConfig()
    assert plan_ahead_steps(rnnt, 2) == (rnnt.stress_step - 1 if hasattr(rnnt, "stress_step") else FIT_KNOWN_STEPS)


# Rows: (steps timed, ahead_steps, stops?). SEPARATED is ahead of every measured pair after 6 steps.
SEPARATED = {"accum1_split2": [t * 3 for t in STEADY], "accum4_split1": [t * 5 for t in STEADY]}


@pytest.mark.parametrize(
    ("steps", "ahead_steps", "stops"),
    [(6, FIT_KNOWN_STEPS, True), (6, 8, False), (7, 8, False), (8, 8, True), (8, 9, False)],
)
def test_a_pair_ahead_of_every_rival_stops_only_past_its_stress_step(steps, ahead_steps, stops):
    results = {k: ok(k, t) for k, t in SEPARATED.items()}
    times = (STEADY * 2)[:steps]
    why = stop("accum2_split1", times, results, ahead_steps=ahead_steps)
    assert (why is not None and "ahead of every measured pair" in why) if stops else why is None


@pytest.mark.parametrize(("steps", "ahead_steps", "stops"), [(8, 8, True), (8, 10, False), (9, 10, False), (10, 10, True)])
def test_the_first_pair_stops_at_measure_steps_or_past_its_stress_step_whichever_is_later(steps, ahead_steps, stops):
    why = stop("accum2_split1", (STEADY * 2)[:steps], {}, ahead_steps=ahead_steps)
    assert (why is not None and "no other pair measured in full yet" in why) if stops else why is None


def test_a_pair_that_cannot_win_stops_before_its_stress_step():
    """Not recommended whatever its fit: the ordering after one step, racing once it has an interval."""
    outranked = stop("accum4_split2", [0.02], {"accum2_split1": ok("accum2_split1", STEADY)}, ahead_steps=8)
    assert outranked is not None and "outranked by accum2_split1" in outranked
    slow = [0.1, 0.12, 0.08, 0.1, 0.12, 0.08]
    raced = stop("accum2_split1", slow, {"accum1_split2": ok("accum1_split2", STEADY)}, ahead_steps=8)
    assert raced is not None and "cannot beat the leader accum1_split2" in raced


def test_racing_hands_ahead_steps_to_the_decision(tmp_path):
    results = {k: ok(k, t) for k, t in SEPARATED.items()}
    write_progress(trial_dir(tmp_path, "accum2_split1"), progress_record(STEADY[:6]))
    assert Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, 0)).stop_losers(["accum2_split1"], results) == {}
    told = Racing(tmp_path, GBS, PAIRS).stop_losers(["accum2_split1"], results)
    assert "ahead of every measured pair" in told["accum2_split1"]


@pytest.mark.parametrize(
    "overrides",
    [[], ["workload=rnnt_base", "trial.warmup_steps=3"], ["workload=command", "workload.argv=[python,-c,pass,'--batch={per_device_batch}']"]],
    ids=["rnnt_demo", "rnnt_base", "command"],
)
def test_the_orchestrator_measures_to_the_decision_with_the_plans_stress_step(tmp_path, overrides):
    """The composed config's workload and warm-up set where a pair may stop for being ahead."""
    from support.sbatch_golden import compose_plan

    from sweep.orchestration.orchestrator import Orchestrator

    plan = compose_plan(overrides, str(tmp_path / "s"))
    stress = getattr(plan.workload, "stress_step", 0)
    expected = stress - plan.trial.warmup_steps + 1 if stress > plan.trial.warmup_steps else FIT_KNOWN_STEPS
    racing = Orchestrator(plan).racing
    assert racing.candidates is not None and racing.steps.ahead == expected
    # The staircase's first pair stops provisionally (core/decision.py's rule 0); trial.measure_steps with no rival.
    assert racing.steps.provisional == PROVISIONAL_STEPS and racing.steps.first_pair == plan.trial.measure_steps


# Rule 4: tied pairs. NOISY scatters by +-10%, so its 95% interval overlaps a pair a few percent away.
NOISY = [0.010, 0.011, 0.009, 0.0105, 0.0095, 0.0108, 0.0092, 0.010]


def tied_stop(key: str, times: list[float], results: dict, noise: float, ahead_steps: int = 8) -> str | None:
    return decision_stop(key, {key: Running(PAIRS[key], times)}, results, GBS, first_pair_steps=8, ahead_steps=ahead_steps, run_to_run_noise=noise)


def test_the_tie_band_is_two_processes_run_to_run_noise_at_95_percent():
    assert tie_band(0.01) == pytest.approx(1.96 * 2**0.5 * 0.01)  # 2.8% on cuda's default noise
    assert tied(100.0, 102.0, 0.01) and tied(102.0, 100.0, 0.01) and not tied(100.0, 104.0, 0.01)
    assert tied(100.0, 100.0, 0.0)  # a gap of 0 is inside any band
    assert not tied(0.0, 100.0, 0.01)


@pytest.mark.parametrize(
    # (its steps as multiples of NOISY, the rival's as multiples of STEADY (+-2%: its interval holds none of NOISY's),
    # run-to-run noise, steps timed, ahead_steps, stops as tied?)
    ("mine", "rival", "noise", "steps", "ahead_steps", "stops"),
    [
        (1.0, 1.01, 0.01, 8, 8, True),  # medians 1% apart, inside the 2.8% band, past the stress step
        (1.0, 1.01, 0.0, 8, 8, False),  # no noise told: measured on by the trial's own rule, as before
        (1.0, 1.01, 0.01, 7, 8, False),  # before its stress step a possible answer is never stopped
        (1.0, 1.01, 0.01, 6, FIT_KNOWN_STEPS, True),  # no stress step (command trials): once it has an interval
        (1.0, 1.05, 0.01, 8, 8, False),  # 5% apart but not separated: more steps may order them
        (1.0, 1.05, 0.03, 8, 8, True),  # on a noisier machine (band 8.3%) 5% is noise
    ],
)
def test_a_possible_answer_tied_with_its_rivals_inside_the_noise_stops_past_its_stress_step(mine, rival, noise, steps, ahead_steps, stops):
    results = {"accum1_split2": ok("accum1_split2", [t * rival for t in STEADY])}
    why = tied_stop("accum2_split1", [t * mine for t in (NOISY * 2)[:steps]], results, noise, ahead_steps)
    assert (why is not None and "tied with accum1_split2 within the run-to-run noise" in why) if stops else why is None


def test_a_tie_needs_every_unseparated_rival_inside_the_noise_and_separated_ones_do_not_count():
    near = ok("accum1_split2", [t * 1.01 for t in NOISY])
    open_far = ok("accum4_split1", [t * 1.05 for t in NOISY])  # overlapping, 5% away: may still be ordered
    assert tied_stop("accum2_split1", NOISY, {"accum1_split2": near, "accum4_split1": open_far}, 0.01) is None
    slow = ok("accum4_split1", [t * 5 for t in STEADY])  # wholly below it: no question left there
    why = tied_stop("accum2_split1", NOISY, {"accum1_split2": near, "accum4_split1": slow}, 0.01)
    assert why is not None and "tied with accum1_split2" in why
    # Separated from every rival it is ahead (rule 3), whatever the noise; below the leader it cannot win (rule 2).
    assert "ahead of every measured pair" in tied_stop("accum2_split1", STEADY, {"accum4_split1": slow}, 0.01)
    assert "cannot beat the leader" in tied_stop("accum2_split1", [t * 5 for t in STEADY], {"accum1_split2": ok("accum1_split2", STEADY)}, 0.01)


def test_a_running_rival_counts_and_both_tied_pairs_stop():
    running = {"accum2_split1": Running(PAIRS["accum2_split1"], NOISY), "accum1_split2": Running(PAIRS["accum1_split2"], [t * 1.01 for t in NOISY])}
    stops = decision_stops(running, {}, GBS, first_pair_steps=8, ahead_steps=8, run_to_run_noise=0.01)
    assert set(stops) == {"accum2_split1", "accum1_split2"} and all("tied with" in why for why in stops.values())


def test_the_confidence_score_still_calls_a_tie_stopped_early_a_tie():
    """Stopped at 8 steps instead of 32, two pairs 1% apart are scored as unresolved as measured to the cap."""
    from sweep.core.confidence import leader_probability

    early = {"accum2_split1": ok("accum2_split1", NOISY), "accum1_split2": ok("accum1_split2", [t * 1.01 for t in NOISY])}
    capped = {k: ok(k, r.step_times_s * 4) for k, r in early.items()}
    assert leader_probability(early, 0.01) < 0.8 and leader_probability(capped, 0.01) < 0.8


def test_racing_hands_the_run_to_run_noise_to_the_decision(tmp_path):
    results = {"accum1_split2": ok("accum1_split2", [t * 1.01 for t in STEADY])}
    write_progress(trial_dir(tmp_path, "accum2_split1"), progress_record(NOISY))
    assert Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, 0)).stop_losers(["accum2_split1"], results) == {}
    told = Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, 0), run_to_run_noise=0.01).stop_losers(["accum2_split1"], results)
    assert "tied with accum1_split2" in told["accum2_split1"]


# Rule 0: the search's first pair stops provisionally once its fit at the worst batch is known.
def test_the_first_pair_stops_provisionally_after_one_step_when_nothing_is_measured_yet():
    why = stop("accum8_split1", [0.04], {}, ahead_steps=8, provisional_steps=PROVISIONAL_STEPS)
    assert why is not None and why.startswith("provisional") and "run again in full if it may be the answer" in why
    assert stop("accum8_split1", [], {}, ahead_steps=8, provisional_steps=PROVISIONAL_STEPS) is None  # its fit is not known yet
    assert stop("accum8_split1", [0.04], {}, ahead_steps=8) is None  # not told to (grid, confirmations, a re-run in full)
    # A tight finished pair is not the answer: the search still has no figure to compare with.
    tight = {"accum2_split1": ok("accum2_split1", STEADY, tight=True)}
    assert (stop("accum8_split1", [0.04], tight, ahead_steps=8, provisional_steps=1) or "").startswith("provisional")


def test_a_pair_is_not_provisional_once_a_roomy_pair_finished_or_a_running_one_has_an_interval():
    roomy = {"accum8_split1": ok("accum8_split1", [0.04])}  # itself provisional: a figure to be compared with
    assert stop("accum4_split1", [0.02], roomy, ahead_steps=8, provisional_steps=1) is None
    # A running pair with a real 95% interval is a rival already; one with fewer steps is not.
    assert stop("accum8_split1", [0.04], {}, {"accum4_split1": STEADY[:6]}, ahead_steps=8, provisional_steps=1) is None
    why = stop("accum8_split1", [0.04], {}, {"accum4_split1": STEADY[:5]}, ahead_steps=8, provisional_steps=1)
    assert why is not None and why.startswith("provisional")


def test_decision_stops_never_stops_a_re_run_in_full_provisionally():
    running = {"accum8_split1": Running(PAIRS["accum8_split1"], [0.04])}
    assert set(decision_stops(running, {}, GBS, first_pair_steps=8, ahead_steps=8, provisional_steps=1)) == {"accum8_split1"}
    assert decision_stops(running, {}, GBS, first_pair_steps=8, ahead_steps=8, provisional_steps=1, in_full={"accum8_split1"}) == {}


def test_racing_hands_the_provisional_step_and_its_re_runs_to_the_decision(tmp_path):
    write_progress(trial_dir(tmp_path, "accum8_split1"), progress_record([0.04]))
    racing = Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, PROVISIONAL_STEPS))
    racing.in_full.add("accum8_split1")
    assert racing.stop_losers(["accum8_split1"], {}) == {}
    told = Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, PROVISIONAL_STEPS)).stop_losers(["accum8_split1"], {})
    assert told["accum8_split1"].startswith("provisional")


def test_a_finished_pair_without_a_real_interval_is_no_rival_to_separate_from():
    """Stopped by the ordering (or provisionally) after a few steps, it cannot be separated from (cannot_win's
    guard): as a rival it kept every later pair from stopping ahead, to the cap."""
    results = {k: ok(k, t) for k, t in SEPARATED.items()}
    results["accum8_split1"] = ok("accum8_split1", [t * 6 for t in STEADY[:3]])  # 3 steps, far below
    why = stop("accum2_split1", STEADY, results, ahead_steps=8)
    assert why is not None and "ahead of every measured pair" in why
    # Alone, it leaves the pair with no rival measured: it stops at trial.measure_steps, past its stress step.
    why = stop("accum2_split1", STEADY, {"accum8_split1": results["accum8_split1"]}, ahead_steps=8)
    assert why is not None and "no other pair measured in full yet" in why


# Rule 5: its own steps cannot separate it from a finished rival whose interval holds its own.
WIDE = [0.010, 0.012, 0.008, 0.0115, 0.0085, 0.011, 0.009, 0.010]  # +-20%: an 8-step interval far wider than STEADY's


@pytest.mark.parametrize(
    # (its steps, the finished rival's (multiples of WIDE), steps timed, ahead_steps, stops?)
    ("mine", "rival", "steps", "ahead_steps", "stops"),
    [
        (STEADY, 1.03, 8, 8, True),  # 3% apart, its +-2% interval inside the rival's +-20%: past the stress step
        (STEADY, 1.03, 7, 8, False),  # before its stress step a possible answer is never stopped
        (STEADY, 1.03, 6, FIT_KNOWN_STEPS, True),  # no stress step (command trials): once it has an interval
        ([t * 0.9 for t in NOISY], 1.03, 8, 8, False),  # its interval reaches above the rival's: more steps may separate them
    ],
)
def test_a_possible_answer_inside_a_finished_rivals_interval_stops_past_its_stress_step(mine, rival, steps, ahead_steps, stops):
    results = {"accum1_split2": ok("accum1_split2", [t * rival for t in WIDE])}
    why = stop("accum2_split1", (mine * 2)[:steps], results, ahead_steps=ahead_steps)
    if stops:
        assert why is not None and "its own steps cannot separate it from accum1_split2" in why
    else:
        assert why is None


@pytest.mark.parametrize(
    # (the trial's cap, stops?): its 95% interval 6963-7104 reaches above the finished rival's 5509-7008 by 1.4%
    ("cap", "stops"),
    [
        (32, True),  # by 32 steps its interval narrows to +-1%: even at 7104 its lower bound stays under 7008 + 1%
        (100_000, False),  # with steps enough its lower bound could clear the rival's: its own steps may separate them
        (8, False),  # at the cap already: the trial's own rule ends it, not this one
        (0, False),  # the cap unknown: only a rival that holds its whole interval counts
    ],
)
def test_a_possible_answer_its_own_steps_cannot_separate_by_the_cap_stops(cap, stops):
    results = {"accum1_split2": ok("accum1_split2", [t * 1.03 for t in WIDE])}
    mine = [t * 0.91 for t in STEADY]
    why = decision_stop("accum2_split1", {"accum2_split1": Running(PAIRS["accum2_split1"], mine)}, results, GBS, first_pair_steps=8,
                        ahead_steps=8, max_steps=cap)
    if stops:
        assert why is not None and "cannot clear, by the cap of 32 steps," in why and "accum1_split2" in why
    else:
        assert why is None


def test_racing_hands_the_trials_cap_to_the_decision(tmp_path):
    results = {"accum1_split2": ok("accum1_split2", [t * 1.03 for t in WIDE])}
    write_progress(trial_dir(tmp_path, "accum2_split1"), progress_record([t * 0.91 for t in STEADY]))
    assert Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, 0)).stop_losers(["accum2_split1"], results) == {}
    told = Racing(tmp_path, GBS, PAIRS, StopSteps(8, 8, 0, 32)).stop_losers(["accum2_split1"], results)
    assert "cannot clear, by the cap of 32 steps," in told["accum2_split1"]


def test_a_running_rival_holding_it_does_not_stop_it_and_a_tied_one_may_join_a_holding_one():
    wide = [t * 1.03 for t in WIDE]
    # A running rival's interval still narrows: its steps may yet separate the two.
    assert stop("accum2_split1", STEADY, {}, {"accum1_split2": wide}, ahead_steps=8) is None
    # One finished rival holds it, another is tied with it within the run-to-run noise: nothing left to decide.
    results = {"accum1_split2": ok("accum1_split2", wide), "accum4_split1": ok("accum4_split1", [t * 1.01 for t in STEADY])}
    why = decision_stop("accum2_split1", {"accum2_split1": Running(PAIRS["accum2_split1"], STEADY)}, results, GBS, first_pair_steps=8,
                        ahead_steps=8, run_to_run_noise=0.01)
    assert why is not None and "its own steps cannot separate it from accum1_split2" in why


# The provisional pairs run again in full when the search ends (orchestration/remeasure.py).
def provisional(key: str, times: list[float], tight: bool = False) -> TrialResult:
    return replace(ok(key, times, tight), stopped_early="provisional: the search's first pair")


def test_a_provisional_pair_the_recommendation_would_take_is_run_again():
    assert is_provisional(provisional("accum8_split1", [0.01])) and not is_provisional(ok("accum8_split1", [0.01]))
    assert provisional_contenders({"accum8_split1": provisional("accum8_split1", [0.01])}) == ["accum8_split1"]
    # Faster than every measured pair: the answer as it stands, so it is measured in full first.
    results = {"accum8_split1": provisional("accum8_split1", [0.005]), "accum2_split1": ok("accum2_split1", STEADY)}
    assert provisional_contenders(results) == ["accum8_split1"]
    assert provisional_contenders({}) == []


def test_a_provisional_pair_is_run_again_unless_a_pair_measured_in_full_outranks_it():
    """Issue 43: a provisional figure rests on one step, and the search's first step is its coldest: a pair whose one
    step was 3x slow is not ruled out by that step. Only the throughput ordering, on a pair measured in full, rules
    it out (as it rules out untried pairs); else it is run again in full, however slow its one step."""
    results = {"accum2_split1": ok("accum2_split1", STEADY), "accum8_split1": provisional("accum8_split1", [0.0101])}
    assert provisional_contenders(results) == ["accum8_split1"]  # inside the answer's interval
    results["accum8_split1"] = provisional("accum8_split1", [0.03])  # a third as fast, but accum=2 split=1 outranks it
    assert provisional_contenders(results) == []
    # Only a split=2 pair measured: it does not outrank a split=1 pair (the split's saving), so the cold one runs again.
    cold = {"accum2_split2": ok("accum2_split2", STEADY), "accum8_split1": provisional("accum8_split1", [0.03])}
    assert provisional_contenders(cold) == ["accum8_split1"]
    # A pair cut short itself (one step) outranks nothing: the cold one still runs again.
    cold["accum4_split1"] = replace(ok("accum4_split1", [0.005]), stopped_early="outranked by ...")
    assert "accum8_split1" in provisional_contenders(cold)
    # Every ok pair tight: the recommendation takes the fastest of them, so a provisional one is run again.
    assert provisional_contenders({"accum8_split1": provisional("accum8_split1", [0.005], tight=True)}) == ["accum8_split1"]


def test_a_first_pair_that_reached_its_stress_step_before_a_poll_saw_it_is_measured_in_full():
    why = stop("accum8_split1", STEADY, {}, ahead_steps=8, provisional_steps=PROVISIONAL_STEPS)
    assert why is not None and "no other pair measured in full yet" in why and not why.startswith("provisional")
