"""Run-to-run noise: the pure estimator, sweep.run_to_run on sweep dirs, and what the score makes of it."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from support.results import make_sweep, trial_result

import sweep
from sweep.analysis.compare import RUN_TO_RUN_COLUMNS
from sweep.core.confidence import TRIAL_FLOOR, confidence_score, leader_probability
from sweep.core.config import MachineConfig, run_to_run_noise
from sweep.core.run_to_run import Repeat, RunToRun, estimate_run_to_run, within_se
from sweep.core.schema import OK, TrialResult
from sweep.core.space import enumerate_candidates
from sweep.core.stats import Z95
from sweep.errors import LoadError


def interval(throughput: float, se: float) -> Repeat:
    """A repeat whose 95% interval states a log standard error of se."""
    return Repeat(throughput, throughput * math.exp(-Z95 * se), throughput * math.exp(Z95 * se))


E = math.e  # log(E * x) - log(x) = 1: repeats one log unit apart have a sample sd of sqrt(1/2)


@pytest.mark.parametrize(
    "groups, expected",
    [
        # No own error: the whole scatter is run-to-run noise.
        ({"a": [Repeat(100.0), Repeat(100.0 * E)]}, RunToRun(math.sqrt(0.5), math.sqrt(0.5), 1, 2, 1)),
        # Identical repeats: no noise, whatever the intervals say.
        ({"a": [interval(100.0, 0.02), interval(100.0, 0.02)]}, RunToRun(0.0, 0.0, 1, 2, 1)),
        # Own errors explain part of the scatter: 0.5 - 0.3**2.
        ({"a": [interval(100.0, 0.3), interval(100.0 * E, 0.3)]}, RunToRun(math.sqrt(0.5 - 0.09), math.sqrt(0.5), 1, 2, 1)),
        # Own errors larger than the scatter: floored at 0, never an imaginary noise.
        ({"a": [interval(100.0, 0.9), interval(100.0 * E, 0.9)]}, RunToRun(0.0, math.sqrt(0.5), 1, 2, 1)),
        # Pooled by degrees of freedom: 3 repeats (2 dof, squares sum 2/3) and 2 repeats (1 dof, squares 1/2).
        ({"a": [Repeat(1.0), Repeat(E), Repeat(E * E)], "b": [Repeat(5.0), Repeat(5.0)]},
         RunToRun(math.sqrt(2 / 3), math.sqrt(2 / 3), 2, 5, 3)),
        # A pair measured once tells nothing and is left out.
        ({"a": [Repeat(100.0), Repeat(100.0 * E)], "b": [Repeat(7.0)]}, RunToRun(math.sqrt(0.5), math.sqrt(0.5), 1, 2, 1)),
        ({"a": [Repeat(100.0)], "b": [Repeat(7.0)]}, None),
        ({}, None),
    ],
    ids=["no_own_error", "identical", "own_error_subtracted", "floored_at_zero", "pooled", "single_left_out",
         "nothing_twice", "empty"],
)
def test_estimate_run_to_run(groups, expected):
    got = estimate_run_to_run(groups)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.pairs, got.repeats, got.dof) == (expected.pairs, expected.repeats, expected.dof)
    assert got.noise == pytest.approx(expected.noise, abs=1e-12)
    assert got.spread == pytest.approx(expected.spread, abs=1e-12)


@pytest.mark.parametrize(
    "repeat, se",
    [(interval(50.0, 0.04), 0.04), (Repeat(50.0), 0.0), (Repeat(50.0, 40.0, None), 0.0), (Repeat(50.0, 60.0, 40.0), 0.0)],
)
def test_within_se_reads_the_interval_or_counts_none(repeat, se):
    assert within_se(repeat) == pytest.approx(se)


@pytest.mark.parametrize(
    "device, configured, expected",
    [("cpu", None, 0.07), ("cuda", None, 0.01), ("cuda", 0.03, 0.03), ("cpu", 0, 0.0)],
)
def test_the_machine_setting_or_its_device_default(device, configured, expected):
    assert run_to_run_noise(MachineConfig(device=device, run_to_run_noise=configured)) == expected


# -- what the confidence score makes of it ----------------------------------------------------------
def ok(accum: int, throughput: float, steps: int = 32) -> TrialResult:
    """An ok trial at global batch 16 whose steps scatter by about 1%."""
    step = 16 / throughput
    times = [step * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(steps)]
    return trial_result(accum, gbs=16, throughput=throughput, step_times_s=times)


def test_pairs_closer_than_the_noise_are_not_told_apart():
    results = {r.key: r for r in (ok(2, 104.0), ok(4, 100.0))}
    quiet = leader_probability(results)  # the default floor: 4% apart is 2.8 combined sds
    noisy = leader_probability(results, run_to_run=0.07)
    assert quiet is not None and noisy is not None
    assert quiet > 0.97 and 0.6 < noisy < 0.7  # 4% over sqrt(2) * 7%: Phi(0.4) = 0.66
    assert leader_probability(results, run_to_run=TRIAL_FLOOR) == quiet
    cands = enumerate_candidates(16, 1, [2, 4], [1])
    assert confidence_score(cands, results, run_to_run=0.07) < confidence_score(cands, results)  # type: ignore[operator]
    far = {r.key: r for r in (ok(2, 200.0), ok(4, 100.0))}
    assert leader_probability(far, run_to_run=0.07) == pytest.approx(1.0, abs=1e-6)  # 2x apart: noise cannot swap them


# -- sweep.run_to_run on sweep dirs ---------------------------------------------------------------
def repeated(outputs: Path, scales: list[float], machine: str = "dgx-a100") -> list[Path]:
    """Sweeps of the same pairs whose (8, 2) pair moves by these factors between sweeps."""
    return [make_sweep(outputs, f"{machine}-{i}", machine=machine, accums=(8, 16), splits=(1, 2), scale_pairs={(8, 2): s})
            for i, s in enumerate(scales)]


def test_run_to_run_from_sweep_dirs(tmp_path):
    outputs = tmp_path / "outputs"
    dirs = repeated(outputs, [1.0, 1.1, 0.95, 1.05])
    repeated(outputs / "h100", [1.0, 1.0], machine="dgx-h100")
    got = sweep.run_to_run(str(outputs / "*"))
    assert list(got.columns) == RUN_TO_RUN_COLUMNS
    assert got["machine"].tolist() == ["dgx-a100"]  # the h100 sweeps live one level down: not matched
    row = got.iloc[0]
    # Four pairs ran ok in all four sweeps; only (8, 2) moved, and their 8 steps' own error is small.
    assert (row["pairs"], row["repeats"], row["dof"]) == (4, 16, 12)
    logs = [math.log(s) for s in (1.0, 1.1, 0.95, 1.05)]
    mean = sum(logs) / 4
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / 12)
    assert row["spread"] == pytest.approx(spread, rel=1e-6)
    assert 0.8 * spread < row["run_to_run_noise"] < spread
    assert row["setting"] == f"machine.run_to_run_noise={row['run_to_run_noise']:.3f}"
    # Machines are estimated apart, and frames work as well as paths.
    both = sweep.run_to_run([sweep.load(dirs), str(outputs / "h100" / "*")])
    assert both["machine"].tolist() == ["dgx-a100", "dgx-h100"]
    assert both.set_index("machine").loc["dgx-h100", "run_to_run_noise"] == 0.0
    # Told nothing finer than its calibration floor: 0 from two repeats would make the score surer than that.
    assert both.set_index("machine").loc["dgx-h100", "setting"] == "machine.run_to_run_noise=0.010"
    assert both.set_index("machine").loc["dgx-a100", "run_to_run_noise"] == pytest.approx(row["run_to_run_noise"])


def test_a_trial_racing_stopped_is_not_a_repeat(tmp_path):
    """Racing stops a trial because its figure came out low: that selected figure would inflate the spread."""
    outputs = tmp_path / "outputs"
    frames = [sweep.load(d) for d in repeated(outputs, [1.0, 1.1, 0.95, 1.05])]
    plain = sweep.run_to_run(frames)
    last = frames[-1].copy()
    stopped = (last["accum"] == 16) & (last["split"] == 1)
    last.loc[stopped, "throughput_samples_per_s"] *= 0.6
    last["stopped_early"] = last["stopped_early"].astype("string").mask(stopped, "stopped after 7 timed steps: cannot beat the leader")
    got = sweep.run_to_run([*frames[:-1], last])
    without = sweep.run_to_run([*frames[:-1], last[~stopped]])
    assert got.iloc[0]["repeats"] == without.iloc[0]["repeats"] == plain.iloc[0]["repeats"] - 1
    assert got.iloc[0]["run_to_run_noise"] == without.iloc[0]["run_to_run_noise"]
    # Counted, the selected figure would have more than doubled the estimate.
    counted = sweep.run_to_run([*frames[:-1], last.assign(stopped_early=pd.NA)])
    assert counted.iloc[0]["run_to_run_noise"] > 2 * plain.iloc[0]["run_to_run_noise"]


def test_run_to_run_needs_a_pair_measured_twice(tmp_path):
    outputs = tmp_path / "outputs"
    one = make_sweep(outputs, "one", accums=(8,), splits=(1, 2))
    with pytest.raises(LoadError, match=r"ran ok in two or more sweeps of one machine \(not stopped early by racing\), found none in 1 sweep\(s\)"):
        sweep.run_to_run(one)
    other = make_sweep(outputs, "other", machine="dgx-h100", accums=(8,), splits=(1, 2))
    with pytest.raises(LoadError, match="found none in 2 sweep"):
        sweep.run_to_run([one, other])  # the same pairs, but on two machines
    with pytest.raises(LoadError, match="missing column"):
        sweep.run_to_run(pd.DataFrame({"accum": [1]}))


def test_no_noise_at_all_is_a_valid_setting():
    """run_to_run=0 on trials whose steps never vary: certainty, not a division by zero."""
    flat = [TrialResult(accum=a, split=1, per_device_batch=16 // a, joint_batch=16 // a, global_batch_size=16, num_devices=1,
                        status=OK, throughput=t, step_times_s=[16 / t] * 8) for a, t in ((2, 110.0), (4, 100.0), (8, 100.0))]
    results = {r.key: r for r in flat}
    assert leader_probability(results, run_to_run=0.0) == pytest.approx(1.0)
    assert confidence_score(enumerate_candidates(16, 1, [2, 4, 8], [1]), results, run_to_run=0.0) == 99
