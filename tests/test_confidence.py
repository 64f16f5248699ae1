"""Confidence that the leader is the fastest feasible pair: tables, and a quick calibration check."""

from __future__ import annotations

import math
import random

import pytest
from support.landscapes import (
    LANDSCAPES,
    Landscape,
    calibration_table,
    random_landscape,
    random_roofline_landscape,
    run_sweep,
    simulate_calibration,
)
from support.results import trial_result

from sweep.core.confidence import (
    GAIN_FLOOR,
    GAIN_FULL,
    ORDER_SLIP,
    confidence_score,
    leader_key,
    leader_probability,
    open_pairs,
    rank_order,
)
from sweep.core.schema import CANCELLED, FAILED, OOM, PHASE_ENCODER, PHASE_JOINT, TrialResult
from sweep.core.space import Candidate, enumerate_candidates, make_candidate
from sweep.core.strategies import make_strategy

GBS, DEVICES = 1024, 8
ALL = enumerate_candidates(GBS, DEVICES)  # 35 valid pairs, per-device batch 1..128


def ok(accum: int, split: int, thr: float, noise: float = 0.02, steps: int = 10, seed: int = 0) -> TrialResult:
    """An ok trial whose step times scatter (lognormal, `noise`) around a true `thr` samples/s."""
    rng = random.Random(hash((accum, split, seed)))
    times = [GBS / thr * math.exp(rng.gauss(0, noise)) for _ in range(steps)]
    return trial_result(accum, split, gbs=GBS, devices=DEVICES, times=times)


def oom(accum: int, split: int, phase: str = PHASE_JOINT) -> TrialResult:
    c = make_candidate(accum, split, GBS, DEVICES)
    return TrialResult(accum, split, c.per_device_batch, c.joint_batch, GBS, DEVICES, OOM, oom_phase=phase)


def failed(accum: int, split: int) -> TrialResult:
    c = make_candidate(accum, split, GBS, DEVICES)
    return TrialResult(accum, split, c.per_device_batch, c.joint_batch, GBS, DEVICES, FAILED, error="boom")


def by_key(*results: TrialResult) -> dict[str, TrialResult]:
    return {r.key: r for r in results}


def grid_results(land: Landscape, seed: int = 0) -> dict[str, TrialResult]:
    return run_sweep(make_strategy("grid", land.candidates()), land, 1, seed)


def only(*pairs: tuple[int, int]) -> list[Candidate]:
    return [make_candidate(a, s, GBS, DEVICES) for a, s in pairs]


# --- the table ------------------------------------------------------------------------------

CASES = [
    # (name, candidates, results, low, high)
    ("one measured pair, 34 untried", ALL, by_key(ok(8, 1, 1500)), 0, 25),
    ("step 2 done, stairs untried", ALL, by_key(oom(4, 1), ok(8, 1, 1500)), 0, 40),
    ("every pair measured, big gaps", LANDSCAPES["typical"].candidates(), grid_results(LANDSCAPES["typical"]), 95, 99),
    ("two pairs within noise", only((1, 1), (2, 1)), by_key(ok(1, 1, 1000, seed=1), ok(2, 1, 1000, seed=2)), 35, 65),
    ("two pairs, 10% apart, 2% noise", only((1, 1), (2, 1)), by_key(ok(1, 1, 1100), ok(2, 1, 1000)), 95, 99),
    ("huge gap, no noise at all", only((1, 1), (2, 1)), by_key(ok(1, 1, 1e6, noise=0), ok(2, 1, 1, noise=0)), 99, 99),
    ("the leader alone, nothing untried", only((2, 1)), by_key(ok(2, 1, 500)), 99, 99),
]


@pytest.mark.parametrize("name, cands, results, low, high", CASES, ids=[c[0] for c in CASES])
def test_confidence_table(name, cands, results, low, high):
    score = confidence_score(cands, results)
    assert score is not None and low <= score <= high


@pytest.mark.parametrize(
    "results",
    [{}, by_key(oom(1, 1)), by_key(oom(1, 1, PHASE_ENCODER), failed(2, 1))],
    ids=["nothing", "an oom", "oom and failure"],
)
def test_none_without_an_ok_result(results):
    assert confidence_score(ALL, results) is None
    assert leader_probability(results) is None
    assert leader_key(results) is None and rank_order(results) == []
    assert open_pairs(ALL, results) == []


def test_oom_implied_pairs_do_not_lower_confidence():
    # A joint OOM at per-device batch 64, split 1 rules out every pair with j >= 64.
    results = by_key(ok(4, 1, 1000), ok(8, 1, 600), oom(2, 1))
    measured_only = confidence_score(only((4, 1), (8, 1), (2, 1)), results)
    implied = only((1, 1), (1, 2), (2, 1))  # j = 128, 64, 64
    assert confidence_score(only((4, 1), (8, 1), (2, 1)) + implied, results) == measured_only
    # ... while a pair the OOM does not rule out (p=64, j=32) does lower it.
    assert confidence_score(only((4, 1), (8, 1), (2, 1), (2, 2)), results) < measured_only  # type: ignore[operator]


def test_more_oom_evidence_never_lowers_confidence():
    results = by_key(ok(8, 1, 1500))
    before = confidence_score(ALL, results)
    results.update(by_key(oom(4, 1)))
    after_joint = confidence_score(ALL, results)
    results.update(by_key(oom(4, 2, PHASE_ENCODER)))
    after_encoder = confidence_score(ALL, results)
    assert before <= after_joint <= after_encoder  # type: ignore[operator]


def test_outranked_pairs_count_only_with_the_orderings_small_prior():
    # (16, 1) and (8, 2) cannot beat the measured (8, 1) by the ordering (smaller batch / more chunks): a prior, not a
    # measurement (issue 50), so they stay open with the ordering's small prior, never the untried pairs' one.
    results = by_key(ok(8, 1, 1500), oom(4, 1), oom(4, 2, PHASE_ENCODER))
    q = {c.key: prior for c, prior in open_pairs(ALL, results)}
    assert 0 < q["accum8_split2"] <= ORDER_SLIP and 0 < q["accum128_split1"] < q["accum16_split1"] <= ORDER_SLIP


def test_failed_trials_count_as_infeasible_not_as_open():
    results = by_key(ok(2, 8, 2000), failed(1, 16))
    assert "accum1_split16" not in {c.key for c, _ in open_pairs(ALL, results)}


def test_in_flight_pairs_count_as_untried():
    results = by_key(ok(8, 1, 1500), oom(4, 1))
    assert "accum4_split2" in {c.key for c, _ in open_pairs(ALL, results)}


def test_a_cancelled_pair_counts_as_untried():
    # Interrupted, not measured: the score is the one it had while the pair was in flight (before, an
    # interrupt raised the demo's score from 27 to 55 as it cancelled the pair that could beat the leader).
    c = make_candidate(4, 2, GBS, DEVICES)
    cancelled = TrialResult(4, 2, c.per_device_batch, c.joint_batch, GBS, DEVICES, CANCELLED, error="cancelled by the sweep")
    running = by_key(ok(8, 1, 1500), oom(4, 1))
    assert "accum4_split2" in {k.key for k, _ in open_pairs(ALL, {**running, cancelled.key: cancelled})}
    assert confidence_score(ALL, {**running, cancelled.key: cancelled}) == confidence_score(ALL, running)


# Leader (8, 1): p=16, j=16. Untried (4, 1): p=32, j=32, one doubling further in both. Pairs behind the leader,
# the other way: (16, 1) at p=8, j=8 (2 doublings) and (32, 1) at p=4, j=4 (4 doublings).
TREND = [
    # (name, behind: [(accum, split, throughput)], expected factor on the untried pair's prior)
    ("no pair behind: the prior as is", [], 1.0),
    ("steep: 2x over 2 doublings", [(16, 1, 500.0)], 1.0),
    ("flat: 0.1% over 2 doublings", [(16, 1, 999.0)], GAIN_FLOOR),
    ("half the full gain per doubling", [(16, 1, 1000.0 * math.exp(-2 * GAIN_FULL / 2))], 0.5),
    ("the nearest pair behind decides, not a farther one", [(16, 1, 999.0), (32, 1, 100.0)], GAIN_FLOOR),
    ("the same p, a smaller j: behind as well", [(8, 2, 999.0)], GAIN_FLOOR),  # p=16, j=8
    ("a pair beside the leader does not count", [(4, 4, 999.0)], 1.0),  # p=32, j=8: toward c in p
]


@pytest.mark.parametrize("name, behind, factor", TREND, ids=[t[0] for t in TREND])
def test_diminishing_returns_scale_the_prior_of_pairs_further_along(name, behind, factor):
    results = by_key(ok(8, 1, 1000.0, noise=0), *(ok(a, s, thr, noise=0) for a, s, thr in behind))
    cands = only((8, 1), (4, 1), *((a, s) for a, s, _ in behind))
    baseline = dict((c.key, q) for c, q in open_pairs(cands, by_key(ok(8, 1, 1000.0, noise=0))))["accum4_split1"]
    q = dict((c.key, q) for c, q in open_pairs(cands, results))["accum4_split1"]
    assert q == pytest.approx(baseline * factor)


def test_never_100_even_with_everything_settled():
    results = grid_results(LANDSCAPES["typical"].with_(step_noise=1e-4, steps=30))
    assert leader_probability(results) == pytest.approx(1.0)
    assert confidence_score(ALL, results) == 99


def test_results_without_step_times_use_their_interval():
    a, b = ok(1, 1, 1100), ok(2, 1, 1000)
    with_steps = confidence_score(only((1, 1), (2, 1)), by_key(a, b))
    a.step_times_s, b.step_times_s = [], []
    from_interval = confidence_score(only((1, 1), (2, 1)), by_key(a, b))
    assert with_steps is not None and from_interval is not None and from_interval >= 60
    a.throughput_low = a.throughput_high = b.throughput_low = b.throughput_high = None
    assert confidence_score(only((1, 1), (2, 1)), by_key(a, b)) is not None  # default error, no crash


def test_noisier_measurements_give_lower_confidence():
    quiet = by_key(ok(1, 1, 1040, noise=0.01), ok(2, 1, 1000, noise=0.01))
    loud = by_key(ok(1, 1, 1040, noise=0.08), ok(2, 1, 1000, noise=0.08))
    pair = only((1, 1), (2, 1))
    assert confidence_score(pair, loud) < confidence_score(pair, quiet)  # type: ignore[operator]


def test_confidence_grows_over_a_staircase_sweep():
    land = LANDSCAPES["typical"]
    scores: list[int] = []
    run_sweep(
        make_strategy("staircase", land.candidates()),
        land,
        1,
        seed=2,
        on_result=lambda fin, _: scores.append(confidence_score(land.candidates(), fin) or 0),
    )
    assert scores[-1] >= 90 and min(s for s in scores if s) < 50


# --- calibration, quick and loose (bench/bench_confidence.py is the real check) --------------


def test_calibration_on_simulated_sweeps():
    stated: list[float] = []
    hits: list[bool] = []
    for seed in range(150):
        rng = random.Random(seed)
        land = random_landscape(rng)
        cands, best = land.candidates(), land.best()
        if best is None:
            continue

        def record(fin, _in_flight, cands=cands, best=best):
            score = confidence_score(cands, fin)
            if score is not None:
                stated.append(score / 100)
                hits.append(leader_key(fin) == best.key)

        strategy = "staircase" if seed % 2 else "grid"
        run_sweep(make_strategy(strategy, cands), land, rng.choice([1, 2, 3]), seed, record)
    assert len(stated) > 500
    mean_stated, observed = sum(stated) / len(stated), sum(hits) / len(hits)
    assert abs(mean_stated - observed) < 0.06
    low = [h for s, h in zip(stated, hits) if s < 0.4]
    high = [h for s, h in zip(stated, hits) if s >= 0.9]
    assert len(low) > 30 and sum(low) / len(low) < 0.45
    assert len(high) > 100 and sum(high) / len(high) > 0.9


# --- calibration out of sample: landscapes generated unlike the ones the priors were fitted on ---------


def test_the_out_of_sample_family_has_a_different_oom_rule():
    """Roofline landscapes OOM on a ragged edge: at one per-device batch a bigger joint batch can fit where a smaller fails."""
    ragged = 0
    for seed in range(200):
        land = random_roofline_landscape(random.Random(seed))
        by_p: dict[int, list[tuple[int, bool]]] = {}
        for c in land.valid():
            by_p.setdefault(c.per_device_batch, []).append((c.joint_batch, land.feasible(c)))
        for pairs in by_p.values():
            fits = [j for j, ok_ in pairs if ok_]
            ragged += any(j < max(fits) for j, ok_ in pairs if not ok_) if fits else 0
    assert ragged > 0  # random_landscape never does this: its joint OOM is a clean threshold


CALIBRATION_SWEEPS = 500  # per strategy and family (seeds 0..499, as bench/bench_confidence.py --seed 0 starts)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["in-sample", "out-of-sample"])
def test_confidence_is_calibrated(family):
    """Per band with >= 30 samples: stated confidence within 10 points of how often the leader is the truly fastest
    feasible pair, on the family the priors were fitted on and on the roofline family (tests/support/landscapes.py) they never saw.

    The bench's 3000 sweeps per family put out of sample at +9.1 in the 0-20 band (the closest to the limit);
    these 1000 at +9.1 there as well.
    """
    samples = []
    for strategy in ("staircase", "grid"):
        for seed in range(CALIBRATION_SWEEPS):
            samples += simulate_calibration(seed, strategy, family)[0]
    rows = calibration_table(samples, "strict")
    judged = [(band, n, stated, observed) for band, n, stated, observed in rows if n >= 30]
    assert len(judged) == len(rows)  # every band is populated: the check below is not empty
    off = [f"{band}: observed {observed:.1f} vs stated {stated:.1f} (n={n})" for band, n, stated, observed in judged
           if abs(observed - stated) > 10]
    assert not off, "; ".join(off)
