"""The memory model on synthetic peaks with known coefficients."""

from __future__ import annotations

import random

import pytest
from support.results import trial_result

from sweep.core.memory_model import (
    OOM_PROBABILITY,
    MemoryObservation,
    fit_from_results,
    fit_memory,
    observations,
    p_exceeds,
    predict_peak,
    predicted_oom,
    predicted_oom_reason,
    student_t_cdf,
    student_t_quantile,
)
from sweep.core.schema import OK, OOM, PHASE_JOINT
from sweep.core.space import make_candidate

GBS, DEVICES = 1024, 8


def cand(accum, split):
    return make_candidate(accum, split, GBS, DEVICES)


def truth(base, a, b, c):
    return lambda x: base + a * x.per_device_batch + b * x.joint_batch + c * (x.split > 1)


def obs(pairs, peak, noise=0.0, seed=0):
    rng = random.Random(seed)
    return [
        MemoryObservation(x.per_device_batch, x.joint_batch, x.split, peak(x) * (1 + rng.gauss(0, noise)), False)
        for x in (cand(a, s) for a, s in pairs)
    ]


STAIRS = [(16, 1), (8, 1), (8, 2), (4, 2), (4, 4), (2, 4), (32, 1)]

# (name, coefficients, noise, measured pairs, coefficient tolerance)
FITS = [
    ("exact", (10.0, 0.4, 3.0, 3.0), 0.0, STAIRS, 1e-6),
    ("small noise", (10.0, 0.4, 3.0, 3.0), 0.01, STAIRS, 0.6),
    ("no split overhead", (5.0, 1.0, 0.5, 0.0), 0.0, STAIRS, 1e-6),
    ("joint dominated", (2.0, 0.1, 6.0, 1.0), 0.0, STAIRS, 1e-6),
]


@pytest.mark.parametrize("name, coef, noise, pairs, tol", FITS, ids=[f[0] for f in FITS])
def test_recovers_known_coefficients(name, coef, noise, pairs, tol):
    fit = fit_memory(obs(pairs, truth(*coef), noise))
    assert fit is not None
    assert fit.coefficients == pytest.approx(coef, abs=tol)


# (name, measured pairs, pair asked about, known?)
ESTIMABLE = [
    ("too few points", [(16, 1), (8, 1)], (4, 1), False),
    ("split=1 only: p and j move together, so a split=1 pair is known", [(16, 1), (8, 1), (4, 1), (32, 1), (64, 1)], (2, 1), True),
    ("split=1 only: a split>1 pair is not", [(16, 1), (8, 1), (4, 1), (32, 1), (64, 1)], (2, 2), False),
    ("after the stairs every pair is known", STAIRS, (1, 64), True),
]


@pytest.mark.parametrize("name, pairs, ask, known", ESTIMABLE, ids=[e[0] for e in ESTIMABLE])
def test_no_prediction_without_the_data_for_it(name, pairs, ask, known):
    fit = fit_memory(obs(pairs, truth(10, 0.4, 3, 3), 0.01))
    assert (predict_peak(fit, cand(*ask)) is not None) is known
    assert (p_exceeds(fit, cand(*ask), 80.0) is not None) is known


# (pair, capacity, expected verdict) on the exact "typical" memory: 10 + 0.4 p + 3 j + 3 (s > 1)
VERDICTS = [
    ((1, 1), 80.0, True),  # 10 + 51.2 + 384: far over
    ((2, 2), 80.0, True),  # 10 + 25.6 + 96 + 3 = 134.6
    ((8, 4), 80.0, False),  # 10 + 6.4 + 12 + 3 = 31.4
    ((1, 64), 80.0, False),  # 10 + 51.2 + 6 + 3 = 70.2: under, if near
    ((1, 32), 80.0, False),  # 76.2: under, nearer still
    ((1, 32), 70.0, True),  # 76.2 > 70: beyond the 2% floor's reach
    ((1, 32), 75.0, False),  # 76.2 > 75, but within the uncertainty: not sure enough to skip
]


@pytest.mark.parametrize("pair, capacity, oom", VERDICTS)
def test_predicted_oom_verdicts(pair, capacity, oom):
    fit = fit_memory(obs(STAIRS, truth(10, 0.4, 3, 3), 0.005))
    pred = predicted_oom(fit, cand(*pair), capacity)
    assert (pred is not None) is oom
    if pred is not None:
        assert pred.p_exceeds(capacity) >= OOM_PROBABILITY
        assert pred.low_gib <= pred.peak_gib <= pred.high_gib
        assert predicted_oom_reason(pred, capacity).startswith(f"predicted OOM: {pred.peak_gib:.3g} GiB > {capacity:.3g} GiB")


def test_noisier_peaks_give_wider_intervals_and_less_certainty():
    tight = predict_peak(fit_memory(obs(STAIRS, truth(10, 0.4, 3, 3), 0.005)), cand(1, 32))
    loose = predict_peak(fit_memory(obs(STAIRS, truth(10, 0.4, 3, 3), 0.08, seed=1)), cand(1, 32))
    assert loose.high_gib - loose.low_gib > tight.high_gib - tight.low_gib
    assert abs(loose.p_exceeds(76.2) - 0.5) < abs(tight.p_exceeds(60.0) - 0.5)


def test_extrapolation_is_less_certain_than_interpolation():
    rng = random.Random(3)
    points = [MemoryObservation(o.per_device_batch, o.joint_batch, o.split, o.peak_gib + rng.gauss(0, 1.0), False)
              for o in obs(STAIRS, truth(10, 0.4, 3, 3))]  # 1 GiB of additive noise, above the relative floor
    fit = fit_memory(points)
    near, far = predict_peak(fit, cand(8, 2)), predict_peak(fit, cand(1, 1))
    # Near the data the error is the fit's own (at least its leave-one-out error); far from it, more.
    assert near.se_gib <= max(1.5 * fit.residual_se_gib, fit.loo_rmse_gib) < far.se_gib


def test_ooms_raise_a_fit_that_predicts_they_fit():
    """Peaks that grow faster than linearly: the ok points alone under-predict the OOMed pairs."""
    quad = lambda x: 10 + 0.02 * x.per_device_batch**2 + 3 * x.joint_batch + 3 * (x.split > 1)  # noqa: E731
    ok = obs([(64, 1), (32, 1), (16, 1), (16, 2), (8, 2), (8, 4)], quad)
    ooms = [MemoryObservation(c.per_device_batch, c.joint_batch, c.split, 80.0, True) for c in (cand(2, 8), cand(2, 16))]
    plain, censored = fit_memory(ok), fit_memory(ok + ooms)
    for c in (cand(2, 8), cand(2, 16)):
        assert predict_peak(plain, c).peak_gib < 80.0  # the ok points alone say it fits
        assert predict_peak(censored, c).peak_gib > predict_peak(plain, c).peak_gib
        assert predict_peak(censored, c).peak_gib >= 80.0 - 2 * predict_peak(censored, c).se_gib


def result(accum, split, status, peak, reserved=None):
    return trial_result(accum, split, gbs=GBS, devices=DEVICES, status=status, oom_phase=PHASE_JOINT if status == OOM else None,
                        peak_mem_gib=peak, peak_reserved_gib=reserved)


@pytest.mark.parametrize(
    "status, peak, expected",
    [
        (OK, 31.0, (31.0, False)),
        (OK, None, None),  # nothing measured
        (OOM, 12.0, (40.0, True)),  # the bound is the capacity, not the partial peak
        (OOM, 44.0, (44.0, True)),
        ("failed", 20.0, None),  # says nothing about memory
    ],
)
def test_observations_from_results(status, peak, expected):
    got = observations([result(8, 2, status, peak)], capacity_gib=40.0)
    assert [(o.peak_gib, o.censored) for o in got] == ([] if expected is None else [expected])


@pytest.mark.parametrize(
    "status, peak, reserved, expected",
    [
        (OK, 31.0, 36.0, (36.0, False)),  # what runs out is the reserve (CUDA) or address space (CPU)
        (OK, 31.0, None, (31.0, False)),  # a command trial: only the sampled peak
        (OOM, 12.0, 44.0, (44.0, True)),
        (OOM, 12.0, 20.0, (40.0, True)),
    ],
)
def test_observations_count_the_reserved_peak_where_one_was_measured(status, peak, reserved, expected):
    got = observations([result(8, 2, status, peak, reserved)], capacity_gib=40.0)
    assert [(o.peak_gib, o.censored) for o in got] == [expected]


def test_fit_from_results_end_to_end():
    peak = truth(10, 0.4, 3, 3)
    results = [result(a, s, OK, peak(cand(a, s))) for a, s in STAIRS] + [result(2, 2, OOM, 30.0)]
    fit = fit_from_results(results, 80.0)
    assert fit.n_ok == len(STAIRS) and fit.n_oom == 1
    assert predict_peak(fit, cand(2, 8)).peak_gib == pytest.approx(peak(cand(2, 8)), rel=0.02)


@pytest.mark.parametrize("dof, q", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042), (1000, 1.962)])
def test_student_t_matches_tables(dof, q):
    assert student_t_quantile(0.975, dof) == pytest.approx(q, abs=2e-3)
    assert student_t_cdf(q, dof) == pytest.approx(0.975, abs=2e-4)
    assert student_t_cdf(0.0, dof) == pytest.approx(0.5)
