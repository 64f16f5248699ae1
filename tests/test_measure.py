"""Adaptive measurement, racing and the trial settings' validation (core/measure.py)."""

from __future__ import annotations

import math
import random

import pytest

from sweep.core.config import TrialConfig, trial_refusal
from sweep.core.measure import (
    MIN_INTERVAL_STEPS,
    cannot_win,
    enough_measured,
    race_reason,
    relative_half_widths,
)
from sweep.core.stats import throughput_summary


def steps(n, noise, seed=0, base=0.5):
    rng = random.Random(seed)
    return [base * math.exp(rng.gauss(0, noise)) for _ in range(n)]


# (name, step times, target, min, max, enough?)
ENOUGH = [
    ("steady after the minimum", [1.0] * 8, 0.02, 8, 32, True),
    ("steady but below the minimum", [1.0] * 7, 0.02, 8, 32, False),
    ("5 identical steps: not a 95% interval yet", [1.0] * 5, 0.02, 3, 32, False),
    ("6 identical steps with a minimum of 3", [1.0] * 6, 0.02, 3, 32, True),
    ("noisy: not yet", steps(10, 0.2), 0.02, 8, 32, False),
    ("noisy: the cap ends it", steps(32, 0.2), 0.02, 8, 32, True),
    ("a looser target is met sooner", steps(12, 0.03, seed=2), 0.10, 8, 32, True),
    # Issue 50: a slow step counts in the wall-time figure, so it is met by measuring longer (which dilutes it), not dropped.
    ("one outlier step measures longer", [1.0] * 11 + [3.0], 0.02, 8, 32, False),
    ("the cap still ends it", [1.0] * 31 + [3.0], 0.02, 8, 32, True),
    ("non-positive times do not count", [1.0] * 7 + [0.0], 0.02, 8, 32, False),
]


@pytest.mark.parametrize("name, times, target, lo, hi, expected", ENOUGH, ids=[e[0] for e in ENOUGH])
def test_enough_measured(name, times, target, lo, hi, expected):
    assert enough_measured(times, target_precision=target, min_steps=lo, max_steps=hi) is expected


def test_enough_measured_uses_throughput_summarys_interval():
    times = steps(15, 0.05, seed=4)
    mid, low, high = throughput_summary(times, 64)
    below, above = relative_half_widths(times)
    assert below == pytest.approx((mid - low) / mid) and above == pytest.approx((high - mid) / mid)
    target = max(below, above)
    assert enough_measured(times, target_precision=target, min_steps=8, max_steps=64)
    assert not enough_measured(times, target_precision=target * 0.99, min_steps=8, max_steps=64)


@pytest.mark.parametrize("noise, max_steps", [(0.005, 8), (0.02, 20), (0.05, 64)])
def test_noisier_trials_measure_longer(noise, max_steps):
    """The steps needed grow with the noise; quiet trials stop at the minimum."""
    times = steps(200, noise, seed=7)
    n = next(k for k in range(1, 201) if enough_measured(times[:k], target_precision=0.02, min_steps=8, max_steps=200))
    assert n <= max_steps
    if noise <= 0.005:
        assert n == 8


# (name, candidate, leader, candidate steps, leader steps, cannot win?)
RACES = [
    ("clearly below", (80, 90), (100, 110), 8, 8, True),
    ("overlapping", (80, 101), (100, 110), 8, 8, False),
    ("just below, within the margin", (80, 99.5), (100, 110), 8, 8, False),
    ("too few candidate steps", (80, 90), (100, 110), MIN_INTERVAL_STEPS - 1, 8, False),
    ("too few leader steps", (80, 90), (100, 110), 8, MIN_INTERVAL_STEPS - 1, False),
    ("candidate above", (120, 130), (100, 110), 8, 8, False),
    ("no interval", (0.0, 0.0), (100, 110), 8, 8, False),
    ("nan", (float("nan"), 90), (100, 110), 8, 8, False),
]


@pytest.mark.parametrize("name, cand, lead, n_c, n_l, expected", RACES, ids=[r[0] for r in RACES])
def test_cannot_win(name, cand, lead, n_c, n_l, expected):
    assert cannot_win(cand, lead, candidate_steps=n_c, leader_steps=n_l) is expected


def test_racing_rarely_stops_a_true_winner_on_noise():
    """Two trials with the same true speed: racing must almost never call one a loser."""
    stopped = 0
    for seed in range(300):
        a, b = steps(8, 0.05, seed=seed), steps(8, 0.05, seed=10_000 + seed)
        _, al, ah = throughput_summary(a, 1)
        _, bl, bh = throughput_summary(b, 1)
        stopped += cannot_win((al, ah), (bl, bh), candidate_steps=8, leader_steps=8)
    assert stopped <= 3  # <= 1%


def test_race_reason_names_the_leader_and_bounds():
    line = race_reason((80.0, 90.0), (100.0, 110.0), "accum2_split4")
    assert "accum2_split4" in line and "90" in line and "100" in line
    # No step count: racing decided on one step fewer than the trial went on to measure (its steps_measured).
    assert "steps" not in line
    assert "\n" not in line


BAD = [
    (dict(target_precision=0.0), "trial.target_precision=0.0 is not valid: expected a number in (0, 0.5)"),
    (dict(target_precision=0.5), "trial.target_precision=0.5"),
    (dict(target_precision=-0.1), "trial.target_precision=-0.1"),
    (dict(target_precision="2%"), "trial.target_precision='2%'"),
    (dict(target_precision=True), "trial.target_precision=True"),
    (dict(measure_steps=8, max_measure_steps=4), "trial.max_measure_steps=4 is not valid: expected at least trial.measure_steps=8"),
    (dict(max_measure_steps=0), "trial.max_measure_steps=0 is not valid: expected a positive integer"),
    (dict(measure_steps=2.5), "trial.measure_steps=2.5"),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[m.split(" ")[0] for _, m in BAD])
def test_trial_refusal_refuses(changes, message):
    why = trial_refusal(TrialConfig(**changes))
    assert why is not None and why.startswith(message) and "\n" not in why


@pytest.mark.parametrize("changes", [{}, dict(target_precision=0.49), dict(measure_steps=8, max_measure_steps=8)])
def test_trial_refusal_accepts(changes):
    assert trial_refusal(TrialConfig(**changes)) is None
